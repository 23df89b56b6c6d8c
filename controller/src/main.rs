//! `bootplate`: the controller binary. This file only wires the subcommands up; their code
//! lives in the library (src/lib.rs).

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

/// The binary picks the allocator, as it picks the Kubernetes API version; see Cargo.toml.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, which it reads as a C string when it starts (`_RJEM_MALLOC_CONF` in the
/// environment still overrides them): one arena, since the controller's allocations come from
/// a few runtime threads and every further arena holds freed memory apart; freed pages given
/// back after one second instead of ten. Together about 1.5 % off the peak RSS at 20 000
/// configs (docs/benchmarks.md). A thin pointer to the first byte: jemalloc declares
/// `const char *malloc_conf`.
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: &u8 = &b"narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0\0"[0];

/// bootplate: a Cluster API bootstrap provider whose bootstrap data comes from templates
/// published as Kubernetes objects.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller: watch BootplateConfigs and render their data Secrets.
    Run(Box<bootplate::runtime::flags::RunArgs>),
    /// Render a template offline: template + Machine + Cluster (+ config) files to user-data.
    Render(cli::render::RenderArgs),
    /// Check bootplate objects offline (files or directories of a GitOps tree): templates,
    /// configs against their templates, bootstrap references; text, short, JSON, JUnit or SARIF.
    Lint(cli::lint::LintArgs),
    /// Preview a change offline: two revisions of templates or configs (files or directories)
    /// rendered for the same machine; per role unchanged, in place or replacement, with the
    /// diff by part. Exit 3 when a machine would be replaced.
    Diff(cli::diff::DiffArgs),
    /// Turn KubeadmConfigTemplates and KubeadmConfigs into BootplateConfigTemplates and
    /// BootplateConfigs of the shipped template kubeadm-compat, naming every field not carried.
    Import(cli::import::ImportArgs),
    /// Serve a template's parts as a BootstrapGenerator (the reference generator).
    Generator(cli::generator::GeneratorArgs),
    /// Print the CustomResourceDefinitions of all bootplate kinds as one multi-document YAML.
    Crds {
        /// Write one file per CRD (`<group>_<plural>.yaml`) into this directory instead
        /// (`deploy/crds` in this repository).
        #[arg(long, value_name = "DIR")]
        output_dir: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(*args),
        Command::Render(args) => cli::render::run(&args),
        Command::Lint(args) => cli::lint::run(&args),
        Command::Diff(args) => cli::diff::run(&args),
        Command::Import(args) => cli::import::run(&args),
        Command::Generator(args) => cli::generator::run(&args),
        Command::Crds { output_dir } => crds(output_dir.as_deref()),
    }
}

fn run(args: bootplate::runtime::flags::RunArgs) -> ExitCode {
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match runtime.block_on(bootplate::runtime::run::main(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bootplate run: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn crds(output_dir: Option<&std::path::Path>) -> ExitCode {
    let mut out = std::io::stdout().lock();
    for crd in crd_types::crds::all() {
        let yaml = format!(
            "---\n{}",
            serde_yaml::to_string(&crd).expect("a CRD always serializes")
        );
        let written = match output_dir {
            Some(dir) => {
                let path = dir.join(crd_types::crds::file_name(&crd));
                std::fs::write(&path, yaml)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))
            }
            None => out.write_all(yaml.as_bytes()).map_err(|e| e.to_string()),
        };
        if let Err(message) = written {
            eprintln!("bootplate crds: {message}");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
