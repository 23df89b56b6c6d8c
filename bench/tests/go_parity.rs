//! The render peer benchmark compares like with like only while both engines produce the same
//! bytes: this renders the benchmark template once per role with bootplate's engine
//! (`render-bench`) and with the Go twin (`bench/go/render`, Go's text/template), and compares.
//! Speed is measured by `bench/render-vs-go.sh`, never here.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn go() -> PathBuf {
    PathBuf::from("go")
}

fn run(command: &mut Command) -> Vec<u8> {
    let out = command.output().unwrap_or_else(|e| {
        panic!("{command:?} does not start: {e} (the machine's Go 1.26 must be on PATH)")
    });
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn bootplate_and_go_text_template_render_the_same_bytes_for_every_role() {
    let work = tempfile::tempdir().unwrap();
    let go_render = work.path().join("go-render");
    // A go.mod without requirements and no proxy: only the standard library.
    run(Command::new(go())
        .args(["build", "-o"])
        .arg(&go_render)
        .arg(".")
        .current_dir(repo().join("bench/go/render"))
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("GO111MODULE", "on"));
    let rust_render = env!("CARGO_BIN_EXE_render-bench");
    for role in ["worker", "control-plane-join", "init"] {
        let data = work.path().join(format!("{role}.json"));
        std::fs::write(
            &data,
            run(Command::new(rust_render).args(["data", "--role", role])),
        )
        .unwrap();
        let (ours, theirs) = (work.path().join("rust.out"), work.path().join("go.out"));
        run(Command::new(rust_render)
            .args(["render", "--role", role, "--iterations", "1", "--output"])
            .arg(&ours));
        run(Command::new(&go_render)
            .arg("-data")
            .arg(&data)
            .arg("-template")
            .arg(repo().join("bench/go/render/kubeadm.tmpl"))
            .args(["-iterations", "1", "-output"])
            .arg(&theirs));
        let (ours, theirs) = (std::fs::read(ours).unwrap(), std::fs::read(theirs).unwrap());
        assert!(
            ours.len() > 1000,
            "{role}: a real render ({} bytes)",
            ours.len()
        );
        if ours != theirs {
            let (ours, theirs) = (
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs),
            );
            let first = ours
                .lines()
                .zip(theirs.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(ours.lines().count().min(theirs.lines().count()));
            panic!(
                "{role}: the outputs differ from line {}:\n  bootplate: {:?}\n  Go:        {:?}\n\
                 change bench/go/render/kubeadm.tmpl with render/benches/kubeadm.yaml",
                first + 1,
                ours.lines().nth(first),
                theirs.lines().nth(first)
            );
        }
    }
}
