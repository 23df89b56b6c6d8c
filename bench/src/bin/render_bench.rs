//! The Rust half of the render peer benchmark (`bench/render-vs-go.sh`): renders the kubeadm
//! benchmark template (`render/benches/kubeadm.yaml`, the criterion bench's template) for one
//! machine N times, exactly as the controller does per reconcile (variables checked and merged,
//! context built, every file, unit and command rendered, cloud-config written), and prints the
//! rate. `bench/go/render` is the Go text/template half; both write their last output so the
//! script can compare the bytes.
//!
//! ```text
//! render-bench render --role worker --iterations 20000 --output out.yaml
//! render-bench data --role worker   # the same data as JSON, for the Go program
//! ```

use std::time::Instant;

use anyhow::{Context, bail};
use crd_types::{BootplateConfigSpec, Role, TemplateSpec};
use render::{CompiledTemplate, sample_context};
use serde_json::{Map, Value};

const TEMPLATE: &str = include_str!("../../../render/benches/kubeadm.yaml");
const CONFIG: &str = include_str!("../../../render/benches/kubeadm-config.yaml");
/// The object name the template is rendered as: it appears in the output's first comment.
const OBJECT: &str = "ClusterBootstrapTemplate bench";

struct Args {
    command: String,
    role: Role,
    iterations: u64,
    output: Option<String>,
}

fn args() -> anyhow::Result<Args> {
    let mut it = std::env::args().skip(1);
    let command = it.next().unwrap_or_default();
    let mut parsed = Args {
        command,
        role: Role::Worker,
        iterations: 10_000,
        output: None,
    };
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--role" => parsed.role = value.parse().map_err(anyhow::Error::msg)?,
            "--iterations" => parsed.iterations = value.parse()?,
            "--output" => parsed.output = Some(value),
            _ => bail!("unknown flag {flag}"),
        }
    }
    Ok(parsed)
}

/// What the Go program gets: the render context (cluster, machine, join, certs) and `values`,
/// the template's defaults overridden by the config's variables, as the engine merges them.
fn data(spec: &TemplateSpec, config: &BootplateConfigSpec, role: Role) -> anyhow::Result<Value> {
    let Value::Object(mut map) = serde_json::to_value(sample_context(role))? else {
        bail!("the render context is not a map");
    };
    let mut values = Map::new();
    for declaration in &spec.variables {
        let value = config
            .variables
            .get(&declaration.name)
            .or(declaration.default.as_ref())
            .cloned()
            .unwrap_or(Value::Null);
        values.insert(declaration.name.clone(), value);
    }
    map.insert("values".into(), Value::Object(values));
    map.insert(
        "meta".into(),
        serde_json::json!({"object": OBJECT, "revision": spec.revision()}),
    );
    Ok(Value::Object(map))
}

/// CPU time (user + system) of this process so far, from /proc/self/stat (clock ticks of
/// 10 ms): on a shared machine it counts only what the renders cost, not time spent waiting
/// for a core.
fn cpu_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').context("/proc/self/stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 here.
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

fn main() -> anyhow::Result<()> {
    let args = args()?;
    let spec: TemplateSpec = serde_yaml::from_str(TEMPLATE)?;
    let config: BootplateConfigSpec = serde_yaml::from_str(CONFIG)?;
    match args.command.as_str() {
        "data" => {
            println!(
                "{}",
                serde_json::to_string_pretty(&data(&spec, &config, args.role)?)?
            );
            Ok(())
        }
        "render" => {
            let compiled = CompiledTemplate::compile(OBJECT, &spec)?;
            let ctx = sample_context(args.role);
            // Warm-up: caches, allocator, CPU frequency.
            let mut out = compiled.render(&config, &ctx)?;
            for _ in 0..args.iterations / 10 {
                out = compiled.render(&config, &ctx)?;
            }
            let (started, cpu_started) = (Instant::now(), cpu_seconds()?);
            for _ in 0..args.iterations {
                out = std::hint::black_box(compiled.render(&config, &ctx)?);
            }
            let seconds = started.elapsed().as_secs_f64();
            let cpu = cpu_seconds()? - cpu_started;
            if let Some(path) = &args.output {
                std::fs::write(path, &out.data)?;
            }
            println!(
                "engine=handlebars-rust renders={} seconds={seconds:.4} per_sec={:.1} cpu_seconds={cpu:.3} per_cpu_sec={:.1} bytes={}",
                args.iterations,
                args.iterations as f64 / seconds,
                args.iterations as f64 / cpu,
                out.data.len()
            );
            Ok(())
        }
        _ => {
            bail!("usage: render-bench render|data [--role ROLE] [--iterations N] [--output FILE]")
        }
    }
}
