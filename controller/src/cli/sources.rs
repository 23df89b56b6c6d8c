//! The files `bootplate lint` reads: each FILE as given, and the YAML and JSON files of each
//! directory given (with `--recursive`, of its subdirectories too), in name order. A GitOps
//! repository is hostile ground for a walk: it is bounded in depth ([`MAX_DEPTH`]) and in files
//! ([`MAX_FILES`]), hidden directories (`.git`, `.github`) are not entered, and only regular
//! files are read: a symbolic link is never followed (`env.yaml -> /proc/self/environ` printed
//! a CI secret in an error's source line), and one that leads out of the directory given is an
//! error, so that nothing is skipped silently that the author meant to be checked.

use std::path::{Path, PathBuf};

use super::input::InputError;

/// The most directories below a directory given that `--recursive` enters.
pub const MAX_DEPTH: usize = 32;
/// The most files one run reads.
pub const MAX_FILES: usize = 10_000;

/// A file to lint, and whether it was named on the command line (a named file with no objects
/// is an error; a file found in a directory with none is not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub path: PathBuf,
    pub named: bool,
}

/// The files of `paths`; Err lists the paths that could not be walked (the others are kept).
pub fn expand(paths: &[PathBuf], recursive: bool) -> (Vec<Source>, Vec<InputError>) {
    let mut found = Vec::new();
    let mut errors = Vec::new();
    for path in paths {
        if path != Path::new("-") && path.is_dir() {
            walk(path, recursive, &mut found, &mut errors);
        } else if !path.exists() && path.to_string_lossy().contains(['*', '?', '[']) {
            errors.push(InputError(format!(
                "{}: no such file; lint does not expand patterns (the shell does): give the directory, with -R for its subdirectories",
                path.display()
            )));
        } else {
            found.push(Source {
                path: path.clone(),
                named: true,
            });
        }
        if found.len() > MAX_FILES {
            found.truncate(MAX_FILES);
            errors.push(InputError(format!(
                "more than {MAX_FILES} files to lint; lint the directories apart"
            )));
            break;
        }
    }
    (found, errors)
}

/// The YAML and JSON files under `dir`.
fn walk(dir: &Path, recursive: bool, found: &mut Vec<Source>, errors: &mut Vec<InputError>) {
    let depth = if recursive { MAX_DEPTH + 1 } else { 1 };
    let walker = walkdir::WalkDir::new(dir)
        .follow_links(false)
        .max_depth(depth)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| e.depth() == 0 || !e.file_name().to_string_lossy().starts_with('.'));
    for entry in walker {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                errors.push(walk_error(dir, &e));
                continue;
            }
        };
        if entry.depth() > MAX_DEPTH {
            errors.push(InputError(format!(
                "{}: more than {MAX_DEPTH} directories deep; not read",
                entry.path().display()
            )));
            continue;
        }
        if entry.file_type().is_symlink() {
            if let Some(e) = link_out_of(dir, entry.path()) {
                errors.push(e);
            }
            continue;
        }
        if entry.file_type().is_file() && is_manifest(entry.path()) {
            found.push(Source {
                path: entry.into_path(),
                named: false,
            });
            if found.len() > MAX_FILES {
                return;
            }
        }
    }
}

/// The error for a link under `dir` whose target is outside it (or cannot be resolved); `None`
/// for a link inside, whose target the walk reads where it is.
fn link_out_of(dir: &Path, link: &Path) -> Option<InputError> {
    let inside = match (dir.canonicalize(), link.canonicalize()) {
        (Ok(dir), Ok(target)) => target.starts_with(dir),
        _ => false,
    };
    (!inside).then(|| {
        InputError(format!(
            "{}: a symbolic link to outside {} (or to nothing); not read: lint reads the regular files under the directory given",
            link.display(),
            dir.display()
        ))
    })
}

/// Why part of a directory could not be walked, in words.
fn walk_error(dir: &Path, e: &walkdir::Error) -> InputError {
    let path = e.path().unwrap_or(dir).display();
    InputError(format!("{path}: cannot read: {e}"))
}

/// Files lint reads from a directory: `.yaml`, `.yml` and `.json`.
fn is_manifest(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(sources: &[Source], root: &Path) -> Vec<String> {
        sources
            .iter()
            .map(|s| s.path.strip_prefix(root).unwrap().display().to_string())
            .collect()
    }

    #[test]
    fn directories_give_their_manifests_in_name_order_and_recursive_descends() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for file in [
            "b.yaml",
            "a.yml",
            "notes.md",
            "sub/c.json",
            "sub/deeper/d.yaml",
            ".git/e.yaml",
        ] {
            let path = root.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "kind: X\n").unwrap();
        }
        let (flat, errors) = expand(&[root.to_owned()], false);
        assert!(errors.is_empty());
        assert_eq!(names(&flat, root), ["a.yml", "b.yaml"]);
        assert!(flat.iter().all(|s| !s.named));
        let (deep, _) = expand(&[root.to_owned()], true);
        assert_eq!(
            names(&deep, root),
            ["a.yml", "b.yaml", "sub/c.json", "sub/deeper/d.yaml"]
        );
        // A file named on the command line is read whatever its name.
        let (named, _) = expand(&[root.join("notes.md")], true);
        assert!(named[0].named);
    }

    #[test]
    fn links_are_not_followed_depth_is_bounded_and_patterns_explained() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let root = root.as_path();
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("a/x.yaml"), "kind: X\n").unwrap();
        std::fs::write(dir.path().join("out.yaml"), "kind: X\n").unwrap();
        let link = |target: &Path, name: &str| std::os::unix::fs::symlink(target, root.join(name));
        link(root, "a/loop.yaml").unwrap();
        link(&root.join("a/x.yaml"), "in.yaml").unwrap();
        link(&dir.path().join("out.yaml"), "out.yaml").unwrap();
        link(&root.join("gone"), "dangling.yaml").unwrap();
        let (found, errors) = expand(&[root.to_owned()], true);
        assert_eq!(names(&found, root), ["a/x.yaml"]);
        let errors: Vec<&str> = errors.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        for (error, link) in errors.iter().zip(["dangling.yaml", "out.yaml"]) {
            assert!(
                error.contains(link) && error.contains("to outside"),
                "{error}"
            );
        }

        let mut deep = root.join("deep");
        for _ in 0..=MAX_DEPTH {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("too-deep.yaml"), "kind: X\n").unwrap();
        let (found, errors) = expand(&[root.join("deep")], true);
        assert!(found.is_empty());
        assert!(errors.iter().any(|e| e.0.contains("directories deep")));

        let (_, errors) = expand(&[root.join("**/*.yaml")], true);
        assert!(errors[0].0.contains("does not expand patterns"));
    }
}
