//! The images `tests/scripts/build-images.sh` builds without a registry, checked as a user of
//! them would find them: bootplate's describes the same image as the Dockerfile's final stage
//! (path, entrypoint, command, user, platform), and it really runs from containerd, as the
//! non-root user its Deployment sets, with runc on an empty base; the pause image runs until it
//! is stopped; the control-plane images carry exactly the names `kubeadm config images list`
//! prints for a repository the test picks, and each one's entrypoint runs (`--version`). Needs
//! umoci, skopeo, containerd and runc (tests/scripts/install-tools.sh).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testenv::images::{self, Containerd};
use testenv::pod_cluster::images::reference_of;

/// What a Dockerfile's final stage says of the image it builds.
#[derive(Debug, Default, PartialEq)]
struct FinalStage {
    /// Destination of each `COPY`.
    copied: Vec<String>,
    user: Option<String>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
}

/// Parses the instructions after the last `FROM` (continuation lines joined, comments skipped).
/// ENTRYPOINT and CMD must be in exec (JSON) form: the shell form needs a shell, which an empty
/// base does not have.
fn final_stage(dockerfile: &str) -> Result<FinalStage, String> {
    let joined = dockerfile.replace("\\\n", " ");
    let instructions: Vec<&str> = joined
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect();
    let from = instructions
        .iter()
        .rposition(|line| keyword(line).0 == "FROM")
        .ok_or("no FROM")?;
    let mut stage = FinalStage::default();
    for line in &instructions[from + 1..] {
        let (word, args) = keyword(line);
        match (word.as_str(), args) {
            ("COPY", args) => {
                let last = args
                    .split_whitespace()
                    .last()
                    .ok_or("COPY without arguments")?;
                stage.copied.push(last.to_owned());
            }
            ("USER", args) => stage.user = Some(args.to_owned()),
            ("ENTRYPOINT", args) => stage.entrypoint = Some(exec_form(args)?),
            ("CMD", args) => stage.cmd = Some(exec_form(args)?),
            _ => {}
        }
    }
    Ok(stage)
}

fn keyword(line: &str) -> (String, &str) {
    let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    (word.to_ascii_uppercase(), rest.trim())
}

fn exec_form(args: &str) -> Result<Vec<String>, String> {
    serde_json::from_str(args).map_err(|e| format!("not exec form ({e}): {args}"))
}

#[test]
fn final_stage_reads_the_last_stage_only() {
    let cases: [(&str, Result<FinalStage, String>); 4] = [
        (
            "FROM a AS build\nUSER 1\nCMD [\"x\"]\nFROM b\nCOPY --from=build /x \\\n  /usr/bin/x\n\
             USER 2:2\nENTRYPOINT [\"/usr/bin/x\"]\n# CMD [\"no\"]\nCMD [\"run\", \"-v\"]\n",
            Ok(FinalStage {
                copied: vec!["/usr/bin/x".into()],
                user: Some("2:2".into()),
                entrypoint: Some(vec!["/usr/bin/x".into()]),
                cmd: Some(vec!["run".into(), "-v".into()]),
            }),
        ),
        (
            "FROM a\nuser 3\n",
            Ok(FinalStage {
                user: Some("3".into()),
                ..FinalStage::default()
            }),
        ),
        (
            "FROM a\nENTRYPOINT /bin/x run\n",
            Err("not exec form".into()),
        ),
        ("USER 1\n", Err("no FROM".into())),
    ];
    for (dockerfile, want) in cases {
        match (final_stage(dockerfile), want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{dockerfile}"),
            (Err(got), Err(want)) => assert!(got.starts_with(&want), "{got} for {dockerfile}"),
            (got, want) => panic!("{dockerfile}: got {got:?}, want {want:?}"),
        }
    }
}

/// Runs a command, failing with its output unless it exits 0; returns its stdout.
fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The image configuration in an OCI archive, as skopeo reads it.
fn image_config(archive: &Path) -> Value {
    let archive = format!("oci-archive:{}", archive.display());
    let config = run(Command::new("skopeo").args(["inspect", "--config", &archive]));
    serde_json::from_str(&config).expect("an image configuration")
}

/// Every file of the image's layers with its mode, as `tar -tv` lists them (`-rwxr-xr-x path`).
fn layer_listing(archive: &Path) -> Vec<(String, String)> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(dir.path()));
    let read = |digest: &str| {
        let path = dir
            .path()
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).unwrap())
            .expect("index.json");
    let manifest: Value =
        serde_json::from_slice(&read(index["manifests"][0]["digest"].as_str().unwrap())).unwrap();
    let mut files = Vec::new();
    for layer in manifest["layers"].as_array().expect("layers") {
        let blob = dir.path().join("blobs/sha256").join(
            layer["digest"]
                .as_str()
                .unwrap()
                .trim_start_matches("sha256:"),
        );
        let listing = run(Command::new("tar").arg("-tvzf").arg(&blob));
        files.extend(listing.lines().map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let path = format!("/{}", fields.last().unwrap().trim_start_matches("./"));
            (fields[0].to_owned(), path)
        }));
    }
    files
}

fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

#[test]
fn bootplate_image_is_the_dockerfiles_image() {
    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Dockerfile"))
            .expect("the Dockerfile");
    let stage = final_stage(&dockerfile).expect("the Dockerfile's final stage");
    let archive = images::archive("bootplate").expect("bootplate's image");

    let config = image_config(&archive);
    let strings =
        |value: &Value| -> Option<Vec<String>> { serde_json::from_value(value.clone()).ok() };
    assert_eq!(
        config["config"]["User"].as_str(),
        stage.user.as_deref(),
        "USER"
    );
    assert_eq!(
        strings(&config["config"]["Entrypoint"]),
        stage.entrypoint,
        "ENTRYPOINT"
    );
    assert_eq!(strings(&config["config"]["Cmd"]), stage.cmd, "CMD");
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], host_architecture());

    let files = layer_listing(&archive);
    let binary = &stage.entrypoint.as_ref().expect("an ENTRYPOINT")[0];
    assert!(
        stage.copied.contains(binary),
        "the Dockerfile's entrypoint {binary} is what it copies: {:?}",
        stage.copied
    );
    let mode = files
        .iter()
        .find(|(_, path)| path == binary)
        .map(|(mode, _)| mode.as_str())
        .unwrap_or_else(|| panic!("{binary} is not in the image: {files:?}"));
    assert_eq!(
        mode, "-rwxr-xr-x",
        "{binary}: executable by the non-root user"
    );
}

#[test]
fn bootplate_image_runs_from_containerd_as_its_user() {
    let archives = images::archives(&["bootplate", "pause"]).expect("the images");
    let containerd = Containerd::start().expect("containerd");
    let listed = |name: &str| {
        containerd.import(&archives[name]).expect("import");
        let names = containerd
            .ctr_ok(&["images", "ls", "-q"])
            .expect("images ls");
        let config = image_config(&archives[name]);
        (names, config)
    };
    let (names, config) = listed("bootplate");
    let image = names
        .lines()
        .find(|name| name.starts_with("ghcr.io/bootplate/bootplate:"))
        .unwrap_or_else(|| {
            panic!("the import names bootplate's image as the manifests do: {names}")
        })
        .to_owned();
    // The image's own user (no --user): the one the Deployment's securityContext sets.
    assert_eq!(config["config"]["User"], "65532:65532");
    let help = containerd
        .ctr_ok(&[
            "run",
            "--rm",
            "--read-only",
            &image,
            "bootplate-help",
            "/usr/local/bin/bootplate",
            "--help",
        ])
        .expect("bootplate --help in its image");
    assert!(help.contains("Usage: bootplate"), "{help}");
    assert!(help.contains("run"), "{help}");
    // A template only root may read stays closed to it: the process is not root. (As root, the
    // same lint passes: the template is valid.)
    let dir = tempfile::tempdir().expect("a temporary directory");
    let template = dir.path().join("template.yaml");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ubuntu-2404.yaml"),
        &template,
    )
    .expect("the example template");
    std::fs::set_permissions(
        &template,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod 600");
    let mount = format!(
        "type=bind,src={},dst=/template.yaml,options=rbind:ro",
        template.display()
    );
    let lint = containerd
        .ctr(&[
            "run",
            "--rm",
            "--read-only",
            "--mount",
            &mount,
            &image,
            "bootplate-lint",
            "/usr/local/bin/bootplate",
            "lint",
            "/template.yaml",
        ])
        .expect("ctr run");
    let said =
        String::from_utf8_lossy(&lint.stdout).to_string() + &String::from_utf8_lossy(&lint.stderr);
    assert!(
        !lint.status.success() && said.contains("ermission denied"),
        "{said}"
    );

    let (names, _) = listed("pause");
    assert!(
        names
            .lines()
            .any(|name| name == "registry.k8s.io/pause:3.10.2"),
        "{names}"
    );
    assert_eq!(
        pause_exit_on_sigterm(&containerd),
        Some(0),
        "pause exits 0 on SIGTERM"
    );
}

/// Runs the pause image in the foreground (`ctr run` exits with its task's exit code), stops it
/// with SIGTERM once it runs, as the kubelet stops a sandbox, and returns the exit code.
fn pause_exit_on_sigterm(containerd: &Containerd) -> Option<i32> {
    let mut sandbox = containerd
        .ctr_command(&[
            "run",
            "--rm",
            "--read-only",
            "registry.k8s.io/pause:3.10.2",
            "sandbox",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("ctr run");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tasks = containerd.ctr_ok(&["task", "ls"]).expect("task ls");
        if tasks
            .lines()
            .any(|line| line.starts_with("sandbox ") && line.contains("RUNNING"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "pause did not start: {tasks}");
        std::thread::sleep(Duration::from_millis(50));
    }
    containerd
        .ctr_ok(&["task", "kill", "--signal", "SIGTERM", "sandbox"])
        .expect("task kill");
    sandbox.wait().expect("ctr run ends").code()
}

/// The repository this test names kubeadm's images in (kubeadm's `--image-repository`): one
/// nothing can be pulled from, so a name that differs from kubeadm's shows.
const REPOSITORY: &str = "bootplate.invalid/k8s";

/// kubeadm's image list for the built version in [`REPOSITORY`], one reference a line.
fn kubeadm_image_list() -> BTreeSet<String> {
    let version = testenv::joins::kube_version().expect("the built kubeadm's version");
    let kubeadm = testenv::tools::path("kubeadm").expect("the built kubeadm");
    run(Command::new(kubeadm).args([
        "config",
        "images",
        "list",
        "--kubernetes-version",
        &version,
        "--image-repository",
        REPOSITORY,
    ]))
    .lines()
    .map(str::to_owned)
    .collect()
}

/// What `ENTRYPOINT --version` must print for each control-plane image (its binary's own
/// version, not kubeadm's tag).
fn version_banner(name: &str) -> String {
    let kube = testenv::joins::kube_version().expect("the built kubeadm's version");
    let etcd = testenv::tools::path("etcd").expect("the built etcd");
    let etcd = etcd.file_name().unwrap().to_string_lossy();
    match name {
        "etcd" => format!("etcd Version: {}", etcd.trim_start_matches("etcd-v")),
        "coredns" => "CoreDNS-".to_owned(),
        _ => format!("Kubernetes {kube}"),
    }
}

#[test]
fn control_plane_images_are_kubeadms_list_and_run() {
    let archives =
        images::archives_in(Some(REPOSITORY), &images::KUBEADM_IMAGES).expect("the images");
    let references: BTreeSet<String> = archives
        .values()
        .map(|archive| reference_of(archive).expect("a reference"))
        .collect();
    assert_eq!(
        references,
        kubeadm_image_list(),
        "the images are named as kubeadm lists them"
    );
    let containerd = Containerd::start().expect("containerd");
    for (name, archive) in &archives {
        containerd.import(archive).expect("import");
        if name == "pause" {
            continue; // it has no --version; bootplate_image_runs_from_containerd_as_its_user runs it
        }
        let config = image_config(archive);
        let mut command: Vec<String> =
            serde_json::from_value(config["config"]["Entrypoint"].clone())
                .unwrap_or_else(|_| panic!("{name}: an entrypoint: {config}"));
        command.push("--version".to_owned());
        let reference = reference_of(archive).expect("a reference");
        let mut args = vec!["run", "--rm", "--read-only", &reference, name];
        args.extend(command.iter().map(String::as_str));
        let out = containerd.ctr(&args).expect("ctr run");
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{name}: {command:?} in its image: {said}"
        );
        let banner = version_banner(name);
        assert!(said.contains(&banner), "{name}: {banner:?} in {said:?}");
    }
}
