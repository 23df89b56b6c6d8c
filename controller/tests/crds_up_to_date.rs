//! `deploy/crds/` must hold exactly what `bootplate crds` prints.

use std::path::Path;
use std::process::Command;

#[test]
fn deploy_crds_match_generated_output() {
    let output = Command::new(env!("CARGO_BIN_EXE_bootplate"))
        .arg("crds")
        .output()
        .expect("bootplate crds runs");
    assert!(output.status.success(), "bootplate crds failed: {output:?}");
    let generated = String::from_utf8(output.stdout).expect("UTF-8 output");

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("deploy/crds exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    // `bootplate crds` prints in the order of crd_types::crds::all(); compare as sets of
    // documents keyed by file name so the directory order does not matter.
    files.sort();
    let mut on_disk: Vec<String> = files
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("readable CRD file"))
        .collect();
    let mut printed: Vec<String> = generated
        .split("---\n")
        .filter(|d| !d.is_empty())
        .map(|d| format!("---\n{d}"))
        .collect();
    on_disk.sort();
    printed.sort();
    assert_eq!(
        printed.len(),
        crd_types::strict::KINDS.len(),
        "bootplate crds must print one CRD per bootplate kind"
    );
    assert!(
        on_disk == printed,
        "deploy/crds is out of date; regenerate it with:\n  cargo run -p bootplate -- crds --output-dir deploy/crds"
    );
}
