//! `docs/reference.md` must be what the CRD schemas say (BOOTPLATE_BLESS=1 rewrites it).

use std::path::Path;

#[test]
fn docs_reference_matches_the_crds() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference.md");
    let generated = crd_types::reference::markdown();
    if std::env::var_os("BOOTPLATE_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    for kind in crd_types::strict::KINDS {
        assert!(generated.contains(&format!("\n## {kind}\n")), "{kind}");
    }
    assert!(
        generated
            .contains("| `spec.parts[].files[].permissions` | string, matching `^0?[0-7]{3,4}$` |")
    );
    assert!(
        on_disk == generated,
        "docs/reference.md is out of date; regenerate it with:\n  BOOTPLATE_BLESS=1 cargo test -p bootplate-crd-types --test reference"
    );
}
