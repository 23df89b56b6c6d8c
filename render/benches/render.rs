//! Render throughput on a realistic kubeadm cloud-config template (benches/kubeadm.yaml: about
//! 6 KiB of template text, 40 variables, 3 partials, 13 files). The template is compiled once,
//! as the controller does per revision; each iteration is one full render for one machine.
//!
//! `cargo bench -p bootplate-render --bench render`; results go in docs/benchmarks.md.

use crd_types::{BootplateConfigSpec, Role, TemplateSpec};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use render::{CompiledTemplate, sample_context};

fn spec() -> TemplateSpec {
    serde_yaml::from_str(include_str!("kubeadm.yaml")).expect("the benchmark template parses")
}

fn config() -> BootplateConfigSpec {
    serde_yaml::from_str(include_str!("kubeadm-config.yaml")).expect("the benchmark config parses")
}

fn bench(c: &mut Criterion) {
    let spec = spec();
    let compiled = CompiledTemplate::compile("ClusterBootstrapTemplate bench", &spec)
        .unwrap_or_else(|e| panic!("{e}"));
    let config = config();
    let mut group = c.benchmark_group("render");
    group.throughput(Throughput::Elements(1));
    for role in [Role::Init, Role::Worker] {
        let ctx = sample_context(role);
        group.bench_function(format!("kubeadm-cloud-config/{role}"), |b| {
            b.iter(|| compiled.render(&config, &ctx).expect("renders"))
        });
    }
    group.bench_function("compile", |b| {
        b.iter(|| {
            CompiledTemplate::compile("ClusterBootstrapTemplate bench", &spec).expect("compiles")
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
