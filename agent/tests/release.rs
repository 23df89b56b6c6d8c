//! The binary as it ships (`agent/build.sh`): statically linked, so it runs on any Linux node
//! of its architecture without a runtime to install, and still resolves host names.
//!
//! Builds it with the script (cargo finds it fresh after the first time), or takes the path in
//! `BOOTPLATE_AGENT_RELEASE`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use object::Endianness;
use object::elf;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};

fn release_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(build).clone()
}

fn build() -> PathBuf {
    if let Some(path) = std::env::var_os("BOOTPLATE_AGENT_RELEASE") {
        return PathBuf::from(path);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("build.sh");
    let output = Command::new(&script)
        .env("CARGO", env!("CARGO"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} failed:\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).expect("a path");
    PathBuf::from(stdout.lines().last().expect("the binary's path"))
}

/// What the ELF file asks of the system at load time: its program interpreter (the dynamic
/// loader) and the shared libraries it needs.
fn load_time_needs(data: &[u8]) -> (Option<String>, Vec<String>) {
    let file = ElfFile64::<Endianness>::parse(data).expect("an ELF64 file");
    let endian = file.endian();
    let header = file.elf_header();
    let interpreter = header
        .program_headers(endian, data)
        .expect("program headers")
        .iter()
        .find_map(|segment| segment.interpreter(endian, data).expect("PT_INTERP"))
        .map(|path| String::from_utf8_lossy(path).into_owned());
    let sections = header.sections(endian, data).expect("section headers");
    let needed = match sections.dynamic_table(endian, data) {
        // No dynamic section at all: nothing to load either.
        Err(_) => Vec::new(),
        Ok(table) => table
            .iter()
            .filter(|entry| entry.tag == elf::DT_NEEDED)
            .map(|entry| {
                let name = table.string(entry).expect("a library name");
                String::from_utf8_lossy(name).into_owned()
            })
            .collect(),
    };
    (interpreter, needed)
}

#[test]
fn the_release_agent_is_one_static_file() {
    let binary = release_binary();
    let data = std::fs::read(&binary).unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    let (interpreter, needed) = load_time_needs(&data);
    assert_eq!(
        interpreter,
        None,
        "{} asks for a dynamic loader: it is not statically linked",
        binary.display()
    );
    assert!(
        needed.is_empty(),
        "{} needs shared libraries: {needed:?}",
        binary.display()
    );
    let version = Command::new(&binary)
        .arg("--version")
        .output()
        .expect("runs");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout),
        format!("bootplate-agent {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// A dynamically linked binary built here counts as dynamic: the check above can fail.
#[test]
fn a_dynamic_binary_is_told_apart() {
    let own = std::fs::read(std::env::current_exe().expect("this test")).expect("readable");
    let (interpreter, needed) = load_time_needs(&own);
    assert!(
        interpreter.is_some() && needed.iter().any(|n| n.starts_with("libc.so")),
        "{interpreter:?} {needed:?}"
    );
}

/// Static glibc resolves host names with its built-in `files` and `dns` lookups (/etc/hosts,
/// /etc/resolv.conf): the API server's host name in the kubeconfig is found, here `localhost`,
/// and the connection reaches its port (closed, so it is refused) instead of failing to
/// resolve.
#[test]
fn the_release_agent_resolves_host_names() {
    let binary = release_binary();
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("its address").port()
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: c, cluster: {{server: \"https://localhost:{port}\", insecure-skip-tls-verify: true}}}}]\n\
             users: [{{name: u, user: {{token: sample}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n"
        ),
    )
    .expect("kubeconfig");
    let output = Command::new(&binary)
        .args(["--node-name", "n", "--once", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg("--root")
        .arg(dir.path())
        .env("RUST_BACKTRACE", "0")
        .env("NO_COLOR", "1")
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{text}");
    assert!(
        text.contains("Connection refused") && !text.contains("dns error"),
        "the agent did not reach localhost:{port}:\n{text}"
    );
}
