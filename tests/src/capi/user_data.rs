//! A user-data read as a machine's first boot reads it: the files it writes (a cloud-config's
//! `write_files`, an Ignition config's `storage.files`, decoded as cloud-init and Ignition
//! decode them) and the shell it runs (a cloud-config's `runcmd`; the `ExecStart=` lines of the
//! Ignition units that start: the enabled ones and those a command starts), followed into the
//! written scripts those commands name. A shell script user-data is run as it is.
//!
//! What a machine never runs does not count: a kubeadm configuration that no command hands to
//! kubeadm joins nothing, so the checks ([`super::boot_check`]) start from the commands.

use std::io::Read as _;

use serde_json::Value;

/// The most user-data the cloud reads: a cloud's limit is tens of KB; a render beyond this is
/// refused before it is parsed.
pub const MAX_USER_DATA: usize = 1 << 20;

/// The most a compressed file may expand to: a cloud would not run a bomb either.
const MAX_FILE: u64 = 4 << 20;

/// How many written scripts the commands may lead to: enough for any template, bounded so a
/// user-data whose scripts name each other ends.
const MAX_RUNS: usize = 64;

/// What a machine's first boot does with its user-data.
#[derive(Debug, Default)]
pub struct UserData {
    /// The files written (path, decoded content), in order.
    files: Vec<(String, Vec<u8>)>,
    /// The shell the machine runs: the commands, then the written scripts they name.
    runs: Vec<String>,
    /// The files already added to the runs, by index.
    followed: Vec<usize>,
    /// How many runs were looked at for the scripts they name.
    scanned: usize,
}

impl UserData {
    /// Reads a cloud-config, an Ignition config or a shell script. An error when the machine
    /// could not read it.
    pub fn read(text: &str) -> Result<UserData, String> {
        if text.len() > MAX_USER_DATA {
            return Err(format!("the user-data is {} bytes", text.len()));
        }
        let mut data = if text.trim_start().starts_with('{') {
            let config: Value = serde_json::from_str(text)
                .map_err(|e| format!("the user-data is no Ignition config: {e}"))?;
            ignition(&config)?
        } else if text.starts_with("#!") {
            UserData {
                runs: vec![text.to_owned()],
                ..UserData::default()
            }
        } else {
            let config: Value = serde_yaml::from_str(text)
                .map_err(|e| format!("the user-data is no cloud-config: {e}"))?;
            cloud_config(&config)?
        };
        data.follow_scripts();
        Ok(data)
    }

    /// The content of the file the machine writes to `path`: a written file, or the quoted
    /// here-document a command writes it with (`cat >PATH <<'MARK'`, as the Flatcar template's
    /// bootstrap script writes the kubeadm configuration, since Ignition cannot write below
    /// /run). `None` when nothing writes it.
    pub fn file(&self, path: &str) -> Result<Option<String>, String> {
        if let Some((_, bytes)) = self.files.iter().find(|(p, _)| p == path) {
            let text = String::from_utf8(bytes.clone()).map_err(|e| format!("{path}: {e}"))?;
            return Ok(Some(text));
        }
        let opening = format!("cat >{path} <<'");
        Ok(self.runs.iter().find_map(|r| here_document(r, &opening)))
    }

    /// The shell the machine runs, one text per command or script.
    pub fn runs(&self) -> &[String] {
        &self.runs
    }

    /// Adds to the runs every written file a run names by its path (a script a command or a
    /// unit runs), once; the runs already looked at are not looked at again.
    fn follow_scripts(&mut self) {
        while self.scanned < self.runs.len() && self.runs.len() < MAX_RUNS {
            for (index, (path, bytes)) in self.files.iter().enumerate() {
                if !self.followed.contains(&index)
                    && words(&self.runs[self.scanned]).any(|w| w == path)
                {
                    self.followed.push(index);
                    self.runs.push(String::from_utf8_lossy(bytes).into_owned());
                }
            }
            self.scanned += 1;
        }
    }
}

/// The words of a shell text, unquoted roughly (enough to find paths and programs), with the
/// `Key=` of a systemd `ExecStart=` line taken off.
pub fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| c.is_whitespace() || c == ';' || c == '(' || c == ')')
        .map(|w| w.trim_matches(|c| c == '\'' || c == '"'))
        .map(|w| w.rsplit_once('=').map_or(w, |(_, after)| after))
        .filter(|w| !w.is_empty())
}

fn cloud_config(config: &Value) -> Result<UserData, String> {
    let mut data = UserData::default();
    for file in config["write_files"].as_array().into_iter().flatten() {
        let path = file["path"].as_str().unwrap_or_default().to_owned();
        let bytes = cloud_config_content(file).map_err(|e| format!("{path}: {e}"))?;
        data.files.push((path, bytes));
    }
    for command in config["runcmd"].as_array().into_iter().flatten() {
        // cloud-init runs a string with sh and a list as the program's arguments.
        let text = match command {
            Value::Array(argv) => (argv.iter().map(|a| a.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(" "),
            other => other.as_str().unwrap_or_default().to_owned(),
        };
        data.runs.push(text);
    }
    Ok(data)
}

/// Ignition: the files, then the `ExecStart=` lines of the units that start: enabled ones,
/// then those a run so far starts with `systemctl` (until no more start).
fn ignition(config: &Value) -> Result<UserData, String> {
    let mut data = UserData::default();
    for file in config["storage"]["files"].as_array().into_iter().flatten() {
        let path = file["path"].as_str().unwrap_or_default().to_owned();
        let bytes = ignition_contents(&file["contents"]).map_err(|e| format!("{path}: {e}"))?;
        data.files.push((path, bytes));
    }
    let units: Vec<&Value> = config["systemd"]["units"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let mut started = vec![false; units.len()];
    loop {
        data.follow_scripts();
        let mut more = false;
        for (unit, started) in units.iter().zip(started.iter_mut()) {
            let name = unit["name"].as_str().unwrap_or_default();
            if *started || !(unit["enabled"] == true || started_by(&data.runs, name)) {
                continue;
            }
            *started = true;
            more = true;
            data.runs.extend(exec_starts(unit));
        }
        if !more {
            return Ok(data);
        }
    }
}

/// Whether a line of `runs` starts unit `name` with `systemctl` (`start`, `restart`,
/// `enable --now`).
fn started_by(runs: &[String], name: &str) -> bool {
    runs.iter().flat_map(|r| r.lines()).any(|line| {
        let words: Vec<&str> = words(line).collect();
        words.contains(&"systemctl")
            && (words.contains(&"start") || words.contains(&"restart") || words.contains(&"--now"))
            && words.contains(&name)
    })
}

/// The `ExecStart=` lines of a unit and its drop-ins (the last empty `ExecStart=` of a drop-in
/// resets the list, as systemd does).
fn exec_starts(unit: &Value) -> Vec<String> {
    let mut texts = vec![unit["contents"].as_str().unwrap_or_default()];
    texts.extend(
        (unit["dropins"].as_array().into_iter().flatten())
            .map(|d| d["contents"].as_str().unwrap_or_default()),
    );
    let mut lines = Vec::new();
    for line in texts.iter().flat_map(|t| t.lines()) {
        if let Some(command) = line.trim().strip_prefix("ExecStart=") {
            if command.is_empty() {
                lines.clear();
            } else {
                lines.push(command.trim_start_matches(['-', '@', '+', '!']).to_owned());
            }
        }
    }
    lines
}

/// The body of the first here-document in `script` whose line starts with `opening` (which
/// ends with the quote before the delimiter).
fn here_document(script: &str, opening: &str) -> Option<String> {
    let mut lines = script.lines();
    let mark = lines.find_map(|l| {
        let rest = l.trim_start().strip_prefix(opening)?;
        Some(rest.strip_suffix('\'')?.to_owned())
    })?;
    let mut body = String::new();
    for line in lines {
        if line.trim_end() == mark {
            return Some(body);
        }
        body.push_str(line);
        body.push('\n');
    }
    None
}

/// A `write_files` entry's content, decoded as cloud-init decodes its `encoding`.
fn cloud_config_content(file: &Value) -> Result<Vec<u8>, String> {
    let content = file["content"].as_str().unwrap_or_default();
    match file["encoding"].as_str() {
        None | Some("text/plain") => Ok(content.as_bytes().to_vec()),
        Some("b64" | "base64") => base64_decode(content),
        Some("gz+b64" | "gzip+b64" | "gz+base64" | "gzip+base64") => {
            gunzip(&base64_decode(content)?)
        }
        Some(other) => Err(format!("the cloud does not read encoding {other}")),
    }
}

/// An Ignition file's `contents`: a data URL (base64 or percent-encoded), maybe gzip-compressed.
fn ignition_contents(contents: &Value) -> Result<Vec<u8>, String> {
    let source = contents["source"].as_str().unwrap_or_default();
    let (header, data) = (source.strip_prefix("data:"))
        .and_then(|s| s.split_once(','))
        .ok_or("the cloud reads only data URLs")?;
    let bytes = if header.ends_with(";base64") {
        base64_decode(data)?
    } else {
        percent_encoding::percent_decode_str(data).collect()
    };
    match contents["compression"].as_str().unwrap_or_default() {
        "" => Ok(bytes),
        "gzip" => gunzip(&bytes),
        other => Err(format!("the cloud does not read compression {other}")),
    }
}

fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("not base64: {e}"))
}

fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(MAX_FILE + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("not gzip: {e}"))?;
    if out.len() as u64 > MAX_FILE {
        return Err(format!("expands beyond {MAX_FILE} bytes"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_a_script_writes_is_read_from_its_here_document() {
        let script = "install -d /run/kubeadm\n(\n  cat >/run/kubeadm/kubeadm.yaml <<'END'\nkind: InitConfiguration\nEND\n)\n";
        let body = here_document(script, "cat >/run/kubeadm/kubeadm.yaml <<'");
        assert_eq!(body.as_deref(), Some("kind: InitConfiguration\n"));
        assert_eq!(here_document(script, "cat >/run/other <<'"), None);
        let unterminated = "cat >/run/kubeadm/kubeadm.yaml <<'END'\nkind: x\n";
        assert_eq!(
            here_document(unterminated, "cat >/run/kubeadm/kubeadm.yaml <<'"),
            None
        );
    }

    #[test]
    fn each_encoding_decodes_as_the_machine_decodes_it() {
        use base64::Engine as _;
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"zipped").unwrap();
        let gz = base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap());
        let cloud = format!(
            "#cloud-config\nwrite_files:\n- {{path: /a, content: plain}}\n- {{path: /b, encoding: b64, content: YmFzZTY0}}\n- {{path: /c, encoding: gz+b64, content: \"{gz}\"}}\nruncmd:\n- [sh, /a]\n"
        );
        let data = UserData::read(&cloud).unwrap();
        for (path, content) in [("/a", "plain"), ("/b", "base64"), ("/c", "zipped")] {
            assert_eq!(data.file(path).unwrap().as_deref(), Some(content));
        }
        // The list command names /a: the script is followed.
        assert_eq!(data.runs(), ["sh /a", "plain"]);
        let ignition = format!(
            r#"{{"storage": {{"files": [
            {{"path": "/x", "contents": {{"source": "data:,a%20b"}}}},
            {{"path": "/y", "contents": {{"source": "data:text/plain;base64,{gz}", "compression": "gzip"}}}}]}}}}"#
        );
        let data = UserData::read(&ignition).unwrap();
        assert_eq!(data.file("/x").unwrap().as_deref(), Some("a b"));
        assert_eq!(data.file("/y").unwrap().as_deref(), Some("zipped"));
    }

    #[test]
    fn an_ignition_unit_runs_when_enabled_or_started() {
        let config = r#"{"storage": {"files": [
              {"path": "/s.sh", "contents": {"source": "data:,systemctl%20start%20k.service"}}]},
            "systemd": {"units": [
              {"name": "boot.service", "enabled": true, "contents": "[Service]\nExecStart=/s.sh\n"},
              {"name": "k.service", "contents": "[Service]\nExecStart=/bin/k one\n",
               "dropins": [{"name": "x.conf", "contents": "[Service]\nExecStart=\nExecStart=/bin/k two\n"}]},
              {"name": "idle.service", "contents": "[Service]\nExecStart=/bin/idle\n"}]}}"#;
        let data = UserData::read(config).unwrap();
        assert_eq!(
            data.runs(),
            ["/s.sh", "systemctl start k.service", "/bin/k two"]
        );
    }

    #[test]
    fn what_the_machine_cannot_read_is_an_error() {
        for user_data in [
            "not: [yaml".to_owned(),
            "#cloud-config\nwrite_files:\n- {path: /a, encoding: gz+b64, content: x}\n".to_owned(),
            "#cloud-config\nwrite_files:\n- {path: /a, encoding: rot13, content: x}\n".to_owned(),
            r#"{"storage": {"files": [{"path": "/a", "contents": {"source": "https://x"}}]}}"#
                .to_owned(),
            "a".repeat(MAX_USER_DATA + 1),
        ] {
            assert!(UserData::read(&user_data).is_err(), "{user_data:.60}");
        }
    }
}
