//! Every command line of the ```sh blocks of README.md, docs/*.md and docs/templates/*.md, run
//! or checked at `--help` level, so a documented command that stopped working fails the suite.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// What the test does with one documented command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// Needs no cluster and is quick: run from the repository root (`bootplate` and `cargo run
    /// -p bootplate --` replaced by the binary built for the tests); it must succeed and print.
    Run,
    /// Needs a cluster, a release build or minutes: the program, its subcommand, targets and
    /// every flag the line uses must exist (`--help`, `cargo metadata`, the script's text).
    Help,
    /// Shell control flow around other lines of its block: `bash -n` of the block checks it.
    Shell,
}

use Check::{Help, Run, Shell};

/// Every command line, by document and text (continuation lines joined, trailing comment
/// removed). A line that is not here fails the test: add it, and say how it is checked.
#[rustfmt::skip]
const COMMANDS: &[(&str, &str, Check)] = &[
    ("README.md", "cargo run -p bootplate -- render --template examples/ubuntu-2404.yaml --machine examples/machine-control-plane.yaml --cluster examples/cluster.yaml", Run),
    // The test command itself: never run recursively.
    ("README.md", "tests/scripts/ci.sh", Help),
    ("docs/benchmarks.md", "cargo bench -p bootplate-render --bench render -- --warm-up-time 2 --measurement-time 5", Help),
    ("docs/benchmarks.md", "time cargo test -p bootplate --test boot", Help),
    ("docs/benchmarks.md", "bootplate lint examples/ubuntu-2404.yaml", Run),
    ("docs/changing-templates.md", "bootplate diff templates/kubeadm-ubuntu-2404.yaml templates/kubeadm-ubuntu-2404.yaml", Run),
    ("docs/changing-templates.md", "bootplate diff --format markdown -R templates templates", Run),
    ("docs/changing-templates.md", "bootplate diff --format json --role worker --machine templates/testdata/machine-worker-v1.31.yaml --cluster templates/testdata/cluster.yaml templates/kubeadm-debian-12.yaml templates/kubeadm-debian-12.yaml", Run),
    ("docs/changing-templates.md", "bootplate diff --with templates/kubeadm-ubuntu-2404.yaml templates/testdata/config-prebaked.yaml templates/testdata/config-prebaked.yaml", Run),
    ("docs/benchmarks.md", "bootplate render --template examples/ubuntu-2404.yaml --machine examples/machine-worker.yaml --cluster examples/cluster.yaml", Run),
    // The alias bombs are refused (exit 1): their flags are checked.
    ("docs/benchmarks.md", "bootplate lint tests/corpus/yaml-alias-bomb-10k.yaml", Help),
    ("docs/benchmarks.md", "bootplate render --template tests/corpus/yaml-alias-bomb-10k.yaml --machine examples/machine-worker.yaml --cluster examples/cluster.yaml", Help),
    ("docs/benchmarks.md", "bootplate lint tests/corpus/yaml-alias-bomb-1mib.yaml", Help),
    ("docs/benchmarks.md", "bootplate render --template tests/corpus/yaml-alias-bomb-1mib.yaml --machine examples/machine-worker.yaml --cluster examples/cluster.yaml", Help),
    ("docs/benchmarks.md", "bench/render-vs-go.sh", Help),
    ("docs/benchmarks.md", "ROLES=\"worker init\" ROUNDS=7 bench/render-vs-go.sh", Help),
    ("docs/benchmarks.md", "cargo build --release -p bootplate -p bootplate-bench", Help),
    ("docs/benchmarks.md", "target/release/scale-bench --machines 1000", Help),
    ("docs/benchmarks.md", "target/release/scale-bench --machines 5000", Help),
    ("docs/benchmarks.md", "curl -sk -H \"Authorization: Bearer $TOKEN\" \"https://127.0.0.1:$PORT/debug/pprof/profile?seconds=8\" -o apiserver.pb.gz", Help),
    ("docs/benchmarks.md", "go tool pprof -top -cum \"$BOOTPLATE_KUBE_APISERVER\" apiserver.pb.gz", Help),
    ("docs/benchmarks.md", "time cargo test -p bootplate-tests --test capi i_every_kubeadm", Help),
    ("docs/benchmarks.md", "time cargo test -p bootplate-tests --test joins", Help),
    ("docs/benchmarks.md", "target/release/capi-bench --machines 1000 --rounds 2", Help),
    ("docs/benchmarks.md", "target/release/capi-bench --machines 5000 --rounds 1", Help),
    ("docs/benchmarks.md", "target/release/capi-bench --machines 5000 --rounds 1 --providers bootplate", Help),
    ("docs/benchmarks.md", "target/release/capi-bench --machines 5000 --rounds 1 --providers cabpkc", Help),
    ("docs/benchmarks.md", "target/release/capi-bench --machines 1000 --rounds 1 --providers bootplate --token-ttl-seconds 180", Help),
    ("docs/benchmarks.md", "target/release/capi-bench --machines 200 --rounds 1 --providers bootplate,bootplate-noreports --skip-restart", Help),
    ("docs/benchmarks.md", "target/release/capi-bench --machines 200 --rounds 1 --providers cabpk,bootplate,bootplate-noreports,bootplate-fetch --skip-restart", Help),
    ("docs/benchmarks.md", "target/release/capi-bench --machines 200 --rounds 1 --providers cabpk,bootplate,bootplate-noreports,bootplate-fetch", Help),
    ("docs/benchmarks.md", "target/release/scale-bench --machines 20000", Help),
    ("docs/benchmarks.md", "target/release/scale-bench --machines 20000 --skip-restart", Help),
    ("docs/benchmarks.md", "target/release/scale-bench --machines 20000 --skip-restart --boot-reports off", Help),
    ("docs/benchmarks.md", "target/release/scale-bench --machines 20000 --skip-restart --controller-arg --boot-report-interval=1h --controller-arg --boot-not-started-after=2h", Help),
    ("docs/benchmarks.md", "tests/vm/build-image.sh", Help),
    ("docs/benchmarks.md", "time cargo test -p bootplate-tests --test vm", Help),
    ("docs/fuzzing.md", "for target in decode_valid_objects_round_trip decode_mutated_objects_never_panics decode_arbitrary_yaml_never_panics webhook_validation_never_panics yaml_alias_bombs_stay_bounded; do", Shell),
    ("docs/fuzzing.md", "BOOTPLATE_FUZZ_SECONDS=60 cargo test -p bootplate-tests --test fuzz -- --exact \"$target\" --nocapture", Help),
    ("docs/fuzzing.md", "done", Shell),
    ("docs/fuzzing.md", "end=$((SECONDS + 60)); runs=0", Shell),
    ("docs/fuzzing.md", "while [ $SECONDS -lt $end ]; do", Shell),
    ("docs/fuzzing.md", "cargo test -q -p bootplate-render --test fuzz -- arbitrary_templates_and_values_never_crash_or_hang || break", Help),
    ("docs/fuzzing.md", "runs=$((runs + 1))", Shell),
    ("docs/fuzzing.md", "done; echo \"$runs runs of 512 cases\"", Shell),
    ("docs/in-place.md", "bootplate-agent --node-name \"$(hostname)\" --kubeconfig /etc/kubernetes/kubelet.conf --interval 60s", Help),
    ("docs/in-place.md", "agent/build.sh", Help),
    ("docs/install.md", "clusterctl generate provider --bootstrap bootplate --describe", Help),
    ("docs/install.md", "clusterctl init --bootstrap bootplate --infrastructure docker", Help),
    ("docs/install.md", "clusterctl init --kubeconfig target.kubeconfig --bootstrap bootplate --infrastructure docker", Help),
    ("docs/install.md", "clusterctl move --to-kubeconfig target.kubeconfig --namespace team-a", Help),
    ("docs/install.md", "kubectl apply -k deploy/", Help),
    ("docs/install.md", "kubectl apply -k deploy/extension", Help),
    ("docs/install.md", "kubectl apply -k deploy/monitoring", Help),
    ("docs/install.md", "scripts/release.sh v0.1.0 out/", Help),
    // Docker, a registry and a release's files are not on the test machine: the lines are
    // checked as shell only. build-images.sh and release.sh, which produce what they consume,
    // are tested in tests/tests/images.rs and release.rs.
    ("docs/install.md", "docker build -t registry.internal.example/platform/bootplate:v0.1.0 .", Shell),
    ("docs/install.md", "ctr -n k8s.io images import bootplate-image-v0.1.0.oci.tar", Shell),
    ("docs/install.md", "skopeo copy oci-archive:bootplate-image-v0.1.0.oci.tar docker://registry.internal.example/platform/bootplate:v0.1.0", Shell),
    ("docs/install.md", "sha256sum --check SHA256SUMS", Shell),
    ("docs/install.md", "skopeo inspect docker://registry.internal.example/platform/bootplate:v0.1.0 | grep Digest", Shell),
    ("docs/operations.md", "kubectl apply -k deploy/", Help),
    ("docs/operations.md", "kubectl apply -k my-bootplate/", Help),
    ("docs/operations.md", "clusterctl init --bootstrap bootplate --infrastructure docker", Help),
    ("docs/operations.md", "clusterctl init --bootstrap bootplate", Help),
    ("docs/operations.md", "clusterctl generate provider --bootstrap bootplate --describe", Help),
    ("docs/operations.md", "kubectl -n bootplate-system get deployment bootplate-controller-manager", Help),
    ("docs/operations.md", "kubectl -n bootplate-system get lease bootplate-leader -o jsonpath='{.spec.holderIdentity}'", Help),
    ("docs/operations.md", "kubectl get clusterbootstraptemplates,bootstraptemplates -A", Help),
    // A placeholder file: the flags are checked, the shipped templates' lines below run.
    // The test command again, where docs/testing.md explains it.
    ("docs/testing.md", "tests/scripts/ci.sh", Help),
    ("docs/templates.md", "bootplate lint --strict my-template.yaml", Help),
    ("docs/templates.md", "bootplate render --template my-template.yaml --machine examples/machine-worker.yaml --cluster examples/cluster.yaml --config my-config.yaml --set name=value --role init", Help),
    ("docs/templates.md", "tests/boot/prove.sh templates/my-template.yaml", Help),
    ("docs/templates.md", "tests/boot/prove.sh --config my-config.yaml templates/my-template.yaml", Help),
    ("docs/templates/kubeadm-amazonlinux-2023.md", "bootplate lint templates/kubeadm-amazonlinux-2023.yaml", Run),
    ("docs/templates/kubeadm-amazonlinux-2023.md", "bootplate render --template templates/kubeadm-amazonlinux-2023.yaml --machine templates/testdata/machine-worker-v1.31.yaml --cluster templates/testdata/cluster.yaml --role worker", Run),
    ("docs/templates/kubeadm-compat.md", "bootplate lint templates/kubeadm-compat.yaml", Run),
    ("docs/templates/kubeadm-compat-ignition.md", "bootplate lint templates/kubeadm-compat-ignition.yaml", Run),
    ("docs/templates/kubeadm-compat-ignition.md", "bootplate render --template templates/kubeadm-compat-ignition.yaml --machine templates/testdata/machine-worker-v1.31.yaml --cluster templates/testdata/cluster.yaml --role worker", Run),
    ("docs/templates/kubeadm-compat.md", "bootplate render --template templates/kubeadm-compat.yaml --machine templates/testdata/machine-worker-v1.31.yaml --cluster templates/testdata/cluster.yaml --role worker", Run),
    ("docs/migrating.md", "bootplate import examples/kubeadm-config-template.yaml", Run),
    // Needs the user's own KubeadmConfigTemplate file.
    ("docs/migrating.md", "bootplate import --allow-lossy --machine-deployment md-0 --patch-output md-0-patch.yaml workers.yaml", Help),
    // Needs a cluster with the user's KubeadmConfigTemplate (tests/tests/kubeadm_compat.rs runs it).
    ("docs/migrating.md", "bootplate import --kubeconfig ~/.kube/config --namespace team-a kubeadmconfigtemplate/workers", Help),
    ("docs/templates/kubeadm-debian-12.md", "bootplate lint templates/kubeadm-debian-12.yaml", Run),
    ("docs/templates/kubeadm-debian-12.md", "bootplate render --template templates/kubeadm-debian-12.yaml --machine templates/testdata/machine-worker-v1.31.yaml --cluster templates/testdata/cluster.yaml --role worker", Run),
    ("docs/templates/kubeadm-flatcar.md", "bootplate lint templates/kubeadm-flatcar.yaml", Run),
    ("docs/templates/kubeadm-flatcar.md", "bootplate render --template templates/kubeadm-flatcar.yaml --machine templates/testdata/machine-worker-v1.31.yaml --cluster templates/testdata/cluster.yaml --role worker", Run),
    ("docs/templates/kubeadm-rocky-9.md", "bootplate lint templates/kubeadm-rocky-9.yaml", Run),
    ("docs/templates/kubeadm-rocky-9.md", "bootplate render --template templates/kubeadm-rocky-9.yaml --machine templates/testdata/machine-worker-v1.31.yaml --cluster templates/testdata/cluster.yaml --role worker", Run),
    ("docs/templates/kubeadm-ubuntu-2204.md", "bootplate lint templates/kubeadm-ubuntu-2204.yaml", Run),
    ("docs/templates/kubeadm-ubuntu-2204.md", "bootplate render --template templates/kubeadm-ubuntu-2204.yaml --machine templates/testdata/machine-worker-v1.31.yaml --cluster templates/testdata/cluster.yaml --role worker", Run),
    ("docs/templates/kubeadm-ubuntu-2404.md", "bootplate lint templates/kubeadm-ubuntu-2404.yaml", Run),
    ("docs/templates/kubeadm-ubuntu-2404.md", "bootplate render --template templates/kubeadm-ubuntu-2404.yaml --machine templates/testdata/machine-worker-v1.31.yaml --cluster templates/testdata/cluster.yaml --role worker", Run),
    ("docs/templates/plain-linux.md", "bootplate lint templates/plain-linux.yaml", Run),
    ("docs/templates/plain-linux.md", "bootplate render --template templates/plain-linux.yaml --machine templates/testdata/machine-plain.yaml --cluster templates/testdata/cluster.yaml --role worker", Run),
];

/// Flags of the test harnesses that follow `--` in `cargo test`/`cargo bench` lines: libtest's
/// and criterion's. Their `--help` needs the test or bench binary built, which the checked
/// lines do not build; a flag not listed here fails until someone checks it and adds it.
const HARNESS_FLAGS: &[&str] = &[
    "--exact",
    "--nocapture",
    "--test-threads",
    "--ignored",
    "--include-ignored",
    "--warm-up-time",
    "--measurement-time",
];

/// Words that end a step or belong to the shell, never a program to check.
const SHELL_WORDS: &[&str] = &["break", "continue", "echo", "true", "done"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository root")
}

/// One ```sh block: where it starts, its text, and its command lines.
struct Block {
    file: String,
    line: usize,
    text: String,
    commands: Vec<String>,
}

/// The documents whose ```sh blocks are checked, relative to the repository root.
fn documents() -> Vec<String> {
    let mut files = vec!["README.md".to_owned()];
    for dir in ["docs", "docs/templates"] {
        let mut found: Vec<String> = std::fs::read_dir(repo().join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|entry| entry.expect("a directory entry").file_name())
            .map(|name| name.to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".md"))
            .map(|name| format!("{dir}/{name}"))
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

/// Removes a comment that starts outside quotes (`#` at the start or after a blank).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double, mut previous) = (false, false, ' ');
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && previous.is_whitespace() => return line[..i].trim_end(),
            _ => {}
        }
        previous = c;
    }
    line.trim_end()
}

/// The ```sh blocks of `markdown` with their command lines.
fn sh_blocks(file: &str, markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut current: Option<Block> = None;
    let mut pending = String::new();
    for (number, line) in markdown.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(fence) = trimmed.strip_prefix("```") {
            match current.take() {
                Some(block) => blocks.push(block),
                None if fence == "sh" => {
                    current = Some(Block {
                        file: file.to_owned(),
                        line: number + 1,
                        text: String::new(),
                        commands: Vec::new(),
                    });
                }
                // Another kind of block: skip to its closing fence.
                None => current = Some(Block::skipped()),
            }
            continue;
        }
        let Some(block) = current.as_mut().filter(|b| !b.file.is_empty()) else {
            continue;
        };
        block.text.push_str(line);
        block.text.push('\n');
        let code = strip_comment(trimmed);
        if let Some(continued) = code.strip_suffix('\\') {
            pending.push_str(continued.trim_end());
            pending.push(' ');
            continue;
        }
        let command = format!("{pending}{code}");
        pending.clear();
        if !command.trim().is_empty() {
            block.commands.push(command.trim().to_owned());
        }
    }
    blocks.retain(|b| !b.file.is_empty());
    blocks
}

impl Block {
    /// A block of another language, read to its end and dropped.
    fn skipped() -> Block {
        Block {
            file: String::new(),
            line: 0,
            text: String::new(),
            commands: Vec::new(),
        }
    }
}

/// One simple command of a line: the environment it sets, the program and its arguments, and
/// the directory it runs in (after a `cd`).
struct Step {
    env: Vec<String>,
    program: String,
    args: Vec<String>,
    dir: PathBuf,
}

/// Splits a command line into its simple commands (`&&`, `||`, `;`), drops `time`, records
/// `NAME=value` prefixes and follows `cd`.
fn steps(command: &str) -> Result<Vec<Step>, String> {
    let mut dir = repo();
    let mut steps = Vec::new();
    for part in command.split(['&', '|', ';']).map(str::trim) {
        if part.is_empty() {
            continue;
        }
        let mut words = shlex::split(part).ok_or_else(|| format!("cannot split `{part}`"))?;
        if words.first().map(String::as_str) == Some("time") {
            words.remove(0);
        }
        let env_count = words.iter().take_while(|w| is_assignment(w)).count();
        let env: Vec<String> = words.drain(..env_count).collect();
        let Some(program) = words.first().cloned() else {
            continue;
        };
        if program == "cd" {
            dir = dir.join(words.get(1).ok_or("cd without a directory")?);
            continue;
        }
        if SHELL_WORDS.contains(&program.as_str()) {
            continue;
        }
        let env = env.iter().map(|a| a.split('=').next().unwrap().to_owned());
        steps.push(Step {
            env: env.collect(),
            program,
            args: words[1..].to_vec(),
            dir: dir.clone(),
        });
    }
    Ok(steps)
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
    })
}

/// The long flags (`--name`) among `args`, placeholders like `[--config` included.
fn long_flags(args: &[String]) -> Vec<String> {
    args.iter()
        .filter_map(|arg| arg.trim_start_matches('[').strip_prefix("--"))
        .map(|rest| rest.split(['=', ']']).next().unwrap_or_default())
        .filter(|name| !name.is_empty())
        .map(|name| format!("--{name}"))
        .collect()
}

fn output(cmd: &mut Command) -> Result<Output, String> {
    cmd.stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`, which must succeed, and returns what it printed.
fn succeeds(cmd: &mut Command) -> Result<String, String> {
    let out = output(cmd)?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed ({}): {}", out.status, text(&out)));
    }
    Ok(text(&out))
}

/// Every flag of `flags` appears in `help`, else an error naming the missing ones.
fn flags_in(flags: &[String], help: &str, what: &str) -> Result<(), String> {
    let missing: Vec<&String> = flags.iter().filter(|f| !has_flag(help, f)).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("{what} knows no {missing:?}"))
    }
}

/// Whether `help` names `flag` as a whole word (not as the start of a longer flag).
fn has_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let next = help[i + flag.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

/// The words naming a subcommand: the leading plain words (`generator serve`, `lint`).
fn subcommand(args: &[String]) -> Vec<String> {
    args.iter()
        .take_while(|a| {
            a.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !a.starts_with('-')
        })
        .cloned()
        .collect()
}

/// A binary of this workspace (`bootplate`, `bootplate-agent`, the benchmarks): its
/// subcommand's `--help` lists every flag the line uses. A benchmark's `--controller-arg`
/// passes its value to `bootplate run`, whose `--help` must list that flag instead.
fn check_workspace_binary(name: &str, args: &[String]) -> Result<(), String> {
    let binary = testenv::controller::workspace_binary(name).map_err(|e| format!("{e:#}"))?;
    let sub = subcommand(args);
    let help = succeeds(Command::new(&binary).args(&sub).arg("--help"))?;
    let (own, passed) = split_controller_args(args);
    flags_in(
        &long_flags(&own),
        &help,
        &format!("{name} {}", sub.join(" ")),
    )?;
    if passed.is_empty() {
        return Ok(());
    }
    let bootplate = testenv::controller::binary().map_err(|e| format!("{e:#}"))?;
    let run_help = succeeds(Command::new(bootplate).args(["run", "--help"]))?;
    flags_in(&long_flags(&passed), &run_help, "bootplate run")
}

/// `args` without the values of `--controller-arg`, and those values.
fn split_controller_args(args: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut own, mut passed) = (Vec::new(), Vec::new());
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        own.push(arg.clone());
        if arg == "--controller-arg" {
            passed.extend(args.next().cloned());
        }
    }
    (own, passed)
}

/// Runs a bootplate command from the repository root: it must succeed, and a render must print
/// the user-data (a lint that passes prints nothing).
fn run_bootplate(args: &[String]) -> Result<(), String> {
    let binary = testenv::controller::binary().map_err(|e| format!("{e:#}"))?;
    let out = output(Command::new(binary).args(args).current_dir(repo()))?;
    if !out.status.success() {
        return Err(format!("failed ({}): {}", out.status, text(&out)));
    }
    if args.first().is_some_and(|a| a == "render") && out.stdout.is_empty() {
        return Err("rendered nothing".to_owned());
    }
    Ok(())
}

/// The arguments after `cargo run -p bootplate --`, when the line runs bootplate that way.
fn cargo_run_bootplate(args: &[String]) -> Option<Vec<String>> {
    let dashes = args.iter().position(|a| a == "--")?;
    let head: Vec<&str> = args[..dashes].iter().map(String::as_str).collect();
    (head == ["run", "-p", "bootplate"]).then(|| args[dashes + 1..].to_vec())
}

/// A step, run or checked as `check` says.
fn check_step(step: &Step, check: Check) -> Result<(), String> {
    let program = step.program.as_str();
    let bootplate_args = match program {
        "bootplate" => Some(step.args.clone()),
        "cargo" => cargo_run_bootplate(&step.args),
        _ => None,
    };
    if let Some(args) = bootplate_args {
        return match check {
            Run => run_bootplate(&args),
            _ => check_workspace_binary("bootplate", &args),
        };
    }
    if check == Run {
        return Err(format!(
            "only bootplate lines can be run here, not {program}"
        ));
    }
    match program {
        "cargo" => check_cargo(&step.args),
        "clusterctl" => check_cobra(&tool_path("clusterctl")?, &step.args),
        "kubectl" => check_cobra(Path::new("kubectl"), &step.args),
        "curl" => check_curl(&step.args),
        "go" => check_go(&step.args),
        "bootplate-agent" => check_workspace_binary(program, &step.args),
        _ if program.starts_with("target/") => {
            let name = Path::new(program).file_name().unwrap().to_string_lossy();
            check_workspace_binary(&name, &step.args)
        }
        _ if program.contains('/') => check_script(step),
        _ => Err(format!(
            "no check for the program {program} (add one to this test)"
        )),
    }
}

fn tool_path(name: &str) -> Result<PathBuf, String> {
    testenv::tools::path(name).map_err(|e| format!("{e:#}"))
}

/// kubectl and clusterctl (cobra): the whole line with `--help` must succeed (cobra refuses an
/// unknown flag or subcommand before it prints help) and its help must name every long flag
/// (kubectl's global flags are in `kubectl options`).
fn check_cobra(program: &Path, args: &[String]) -> Result<(), String> {
    let mut help = succeeds(Command::new(program).args(args).arg("--help"))?;
    if program == Path::new("kubectl") {
        help.push_str(&succeeds(Command::new(program).arg("options"))?);
    }
    flags_in(&long_flags(args), &help, &program.display().to_string())
}

fn check_curl(args: &[String]) -> Result<(), String> {
    let help = succeeds(Command::new("curl").args(["--help", "all"]))?;
    let mut flags = long_flags(args);
    for arg in args
        .iter()
        .filter(|a| a.starts_with('-') && !a.starts_with("--"))
    {
        flags.extend(arg[1..].chars().map(|c| format!("-{c},")));
    }
    flags_in(&flags, &help, "curl")
}

/// `go tool pprof`: the tool exists and its usage names every option the line uses.
fn check_go(args: &[String]) -> Result<(), String> {
    if args.first().map(String::as_str) != Some("tool") || args.len() < 2 {
        return Err(format!("no check for go {args:?}"));
    }
    let out = output(Command::new("go").args(&args[..2]).arg("-h"))?;
    let usage = text(&out);
    let options: Vec<String> = args[2..]
        .iter()
        .filter(|a| a.starts_with('-'))
        .cloned()
        .collect();
    flags_in(&options, &usage, &format!("go tool {}", args[1]))
}

/// A script of this repository: it exists, is executable, passes `bash -n`, and reads every
/// flag and environment variable the line gives it.
fn check_script(step: &Step) -> Result<(), String> {
    let path = step.dir.join(&step.program);
    let script = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path)
        .map_err(|e| e.to_string())?
        .permissions()
        .mode();
    if mode & 0o111 == 0 {
        return Err(format!("{} is not executable", step.program));
    }
    succeeds(Command::new("bash").arg("-n").arg(&path))?;
    flags_in(&long_flags(&step.args), &script, &step.program)?;
    let unread: Vec<&String> = step
        .env
        .iter()
        .filter(|name| !script.contains(name.as_str()))
        .collect();
    if unread.is_empty() {
        Ok(())
    } else {
        Err(format!("{} never reads {unread:?}", step.program))
    }
}

/// A cargo target of the workspace: its name, kinds (`test`, `bench`, `bin`, ...) and source.
struct Target {
    name: String,
    kinds: Vec<String>,
    source: PathBuf,
}

/// The workspace's packages, by name, with their targets.
type Workspace = BTreeMap<String, Vec<Target>>;

/// The workspace as `cargo metadata` describes it (read once).
fn workspace() -> &'static Workspace {
    static WORKSPACE: std::sync::OnceLock<Workspace> = std::sync::OnceLock::new();
    WORKSPACE.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let out = Command::new(cargo)
            .args([
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--offline",
            ])
            .current_dir(repo())
            .output()
            .expect("cargo metadata runs");
        assert!(out.status.success(), "cargo metadata: {}", text(&out));
        let metadata: Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
        let mut packages = BTreeMap::new();
        for package in metadata["packages"].as_array().expect("packages") {
            let targets = package["targets"].as_array().expect("targets").iter();
            let targets = targets.map(|t| Target {
                name: t["name"].as_str().unwrap().to_owned(),
                kinds: t["kind"]
                    .as_array()
                    .expect("kinds")
                    .iter()
                    .map(|k| k.as_str().unwrap().to_owned())
                    .collect(),
                source: PathBuf::from(t["src_path"].as_str().unwrap()),
            });
            packages.insert(
                package["name"].as_str().unwrap().to_owned(),
                targets.collect(),
            );
        }
        packages
    })
}

/// Cargo's own flags a line uses, and what follows `--`.
fn check_cargo(args: &[String]) -> Result<(), String> {
    let sub = args.first().ok_or("cargo without a subcommand")?;
    let dashes = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let (own, harness) = (&args[1..dashes], args.get(dashes + 1..).unwrap_or_default());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let help = succeeds(Command::new(cargo).arg(sub).arg("--help"))?;
    flags_in(&long_flags(own), &help, &format!("cargo {sub}"))?;
    let packages = values_of(own, &["-p", "--package"]);
    let mut sources = Vec::new();
    for package in &packages {
        let targets = workspace()
            .get(package)
            .ok_or_else(|| format!("no package {package} in the workspace"))?;
        for (flag, kind) in [("--test", "test"), ("--bench", "bench")] {
            for name in values_of(own, &[flag]) {
                let target = targets
                    .iter()
                    .find(|t| t.name == name && t.kinds.iter().any(|k| k == kind));
                let target =
                    target.ok_or_else(|| format!("{package} has no {kind} target {name}"))?;
                sources.push(target.source.clone());
            }
        }
    }
    let harness_flags = long_flags(harness);
    let unknown: Vec<&String> = harness_flags
        .iter()
        .filter(|f| !HARNESS_FLAGS.contains(&f.as_str()))
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "harness flags not checked by this test: {unknown:?}"
        ));
    }
    check_filters(&filters(own, harness), &sources)
}

/// The values of `flags` in `args` (`-p bootplate`, `--test capi`).
fn values_of(args: &[String], flags: &[&str]) -> Vec<String> {
    args.windows(2)
        .filter(|pair| flags.contains(&pair[0].as_str()))
        .map(|pair| pair[1].clone())
        .collect()
}

/// Test name filters: plain words that are no flag, no flag's value, no number and no variable.
fn filters(own: &[String], harness: &[String]) -> Vec<String> {
    let takes_value = [
        "-p",
        "--package",
        "--test",
        "--bench",
        "--features",
        "--test-threads",
    ];
    let mut found = Vec::new();
    for args in [own, harness] {
        for (i, arg) in args.iter().enumerate() {
            let after_flag = i > 0 && takes_value.contains(&args[i - 1].as_str());
            let plain = !arg.starts_with('-') && !arg.contains('$');
            if plain && !after_flag && arg.parse::<f64>().is_err() {
                found.push(arg.clone());
            }
        }
    }
    found
}

/// Each filter names a test function of the target (its file, or the directory of a
/// `main.rs` target).
fn check_filters(filters: &[String], sources: &[PathBuf]) -> Result<(), String> {
    let mut code = String::new();
    for source in sources {
        let files: Vec<PathBuf> = if source.ends_with("main.rs") {
            let dir = std::fs::read_dir(source.parent().unwrap()).map_err(|e| e.to_string())?;
            dir.map(|e| e.unwrap().path()).collect()
        } else {
            vec![source.clone()]
        };
        for file in files
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        {
            code.push_str(&std::fs::read_to_string(file).map_err(|e| e.to_string())?);
        }
    }
    let functions: BTreeSet<&str> = code
        .split("fn ")
        .skip(1)
        .filter_map(|rest| rest.split(['(', '<']).next())
        .collect();
    for filter in filters {
        if !functions.iter().any(|f| f.contains(filter.as_str())) {
            return Err(format!("no test function matches the filter {filter}"));
        }
    }
    Ok(())
}

/// `bash -n` of a whole block: its shell control flow parses.
fn parses(block: &Block) -> Result<(), String> {
    let mut child = Command::new("bash")
        .arg("-n")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run bash: {e}"))?;
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(block.text.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("bash -n: {}", text(&out)))
    }
}

/// Checks one command line as its table entry says.
fn check_command(command: &str, check: Check) -> Result<(), String> {
    if check == Shell {
        return Ok(());
    }
    let steps = steps(command)?;
    if steps.is_empty() {
        return Err("no command found on the line".to_owned());
    }
    steps.iter().try_for_each(|step| check_step(step, check))
}

#[test]
fn every_documented_command_runs_or_its_program_and_flags_exist() {
    let table: BTreeMap<(&str, &str), Check> = COMMANDS
        .iter()
        .map(|(file, command, check)| ((*file, *command), *check))
        .collect();
    assert_eq!(
        table.len(),
        COMMANDS.len(),
        "a command is twice in COMMANDS"
    );
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for file in documents() {
        let markdown = std::fs::read_to_string(repo().join(&file)).expect("a document");
        for block in sh_blocks(&file, &markdown) {
            if let Err(e) = parses(&block) {
                problems.push(format!("{}:{}: {e}", block.file, block.line));
            }
            for command in &block.commands {
                let key = (file.as_str(), command.as_str());
                let Some(check) = table.get(&key) else {
                    problems.push(format!(
                        "{file}:{}: `{command}` is not in COMMANDS: add it, run or checked",
                        block.line
                    ));
                    continue;
                };
                seen.insert((file.clone(), command.clone()));
                if let Err(e) = check_command(command, *check) {
                    problems.push(format!("{file}:{}: `{command}`: {e}", block.line));
                }
            }
        }
    }
    for (file, command, _) in COMMANDS {
        if !seen.contains(&(file.to_string(), command.to_string())) {
            problems.push(format!(
                "COMMANDS lists `{command}` but {file} no longer shows it"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "documented commands that do not work:\n{}",
        problems.join("\n")
    );
}

/// The checks themselves can fail: a seeded broken line of each kind is refused.
#[test]
fn a_broken_command_of_each_kind_is_refused() {
    let broken = [
        (
            "bootplate render --template examples/ubuntu-2404.yaml --machine examples/machine-control-plane.yaml --cluster examples/missing.yaml",
            Run,
        ),
        ("bootplate render --templat examples/ubuntu-2404.yaml", Help),
        ("cargo run -p bootplate -- lint --strikt x.yaml", Help),
        ("cargo test -p bootplate-tests --test no_such_tier", Help),
        (
            "cargo test -p bootplate-tests --test capi no_such_scenario",
            Help,
        ),
        ("cargo test -p no-such-package", Help),
        ("kubectl apply --kustomise deploy/", Help),
        ("clusterctl init --bootstrapper bootplate", Help),
        ("tests/scripts/no-such-script.sh", Help),
        ("tests/boot/prove.sh --no-such-flag x.yaml", Help),
        ("NO_SUCH_VARIABLE=1 bench/render-vs-go.sh", Help),
        ("target/release/capi-bench --no-such-flag 1", Help),
        ("curl --no-such-option x", Help),
        ("kustomize edit set image x=y", Help),
    ];
    for (command, check) in broken {
        assert!(
            check_command(command, check).is_err(),
            "the broken line `{command}` passed"
        );
    }
    let block = Block {
        file: "seeded.md".to_owned(),
        line: 1,
        text: "for x in a b; do\n  echo $x\n".to_owned(),
        commands: Vec::new(),
    };
    assert!(parses(&block).is_err(), "a block without `done` parses");
}
