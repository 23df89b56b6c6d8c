//! What a hostile input makes the render allocate.
//!
//! - Helpers are bounded before they allocate: a template whose helper would build a result
//!   far larger than the output limit (`{{join list separator}}` with a long list and
//!   separator, `indent` on many lines, the same hidden in an `{{#if}}` that prints nothing)
//!   fails with the output size error, and the render allocates little more than its input.
//! - A gzip member in a file of an in-place part (what the node payload, the update hooks and
//!   the webhook decode) is decompressed only up to the output limit, so a bomb of a few hundred
//!   KiB that expands far past it fails with the size error after allocating about the limit.
//!
//! Allocations are counted by this test binary's global allocator, per thread (each test runs
//! on its own thread), so the measure is the render's own: what it asked for, not what a
//! process-wide RSS reading mixes in from other tests.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::Write as _;

use base64::Engine as _;
use crd_types::{BootplateConfigSpec, ConfigFile, FileEncoding, Role};
use render::generator::Generated;
use render::{CompiledTemplate, RenderError, sample_context};
use serde_json::json;

mod common;

/// The system allocator, counting the bytes live on each thread and their peak.
struct Counting;

thread_local! {
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn count(delta: i64) {
    // `try_with`: a thread being torn down still allocates after its locals are gone.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as i64);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as i64));
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as i64 - layout.size() as i64);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns its result with the most bytes live on this thread meanwhile, above
/// what was live before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = LIVE.get();
    PEAK.set(before);
    let out = f();
    (out, (PEAK.get() - before).max(0) as u64)
}

const MIB: u64 = 1 << 20;

/// gzip+base64 of `mib` MiB of zeros, compressed a MiB at a time.
fn gzip_bomb(mib: usize) -> String {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; MIB as usize];
    for _ in 0..mib {
        encoder.write_all(&zeros).unwrap();
    }
    base64::engine::general_purpose::STANDARD.encode(encoder.finish().unwrap())
}

#[test]
fn a_gzip_bomb_in_an_in_place_file_fails_with_the_size_error_within_the_limit() {
    let spec = common::spec_yaml(
        "os: {name: test}\nformat: cloud-config\nparts:\n  - name: configure\n    update: InPlace\n    commands: [\"true\"]\n",
    );
    let template = CompiledTemplate::compile("BootstrapTemplate test/bomb", &spec).unwrap();
    let bomb = gzip_bomb(64);
    assert!(bomb.len() < 2 * MIB as usize, "{} bytes", bomb.len());
    let config = BootplateConfigSpec {
        files: vec![ConfigFile {
            path: "/etc/bomb".into(),
            content: Some(bomb),
            encoding: Some(FileEncoding::GzipBase64),
            ..Default::default()
        }],
        ..Default::default()
    };
    let ctx = sample_context(Role::Worker);
    let (result, peak) = peak_of(|| template.render_parts(&config, &ctx, &Generated::new()));
    match result {
        Err(e @ RenderError::RenderFailed { .. }) => {
            assert_eq!(e.reason(), "OutputTooLarge", "{e}");
            let message = e.to_string();
            assert!(message.contains("file /etc/bomb"), "{message}");
        }
        other => panic!("expected the size error, got {other:?}"),
    }
    // The decoded files may take 16 MiB (16 times the 1 MiB Secret limit); the bomb expands
    // to 64 MiB. The input itself is a few hundred KiB, copied a few times.
    assert!(
        peak < 40 * MIB,
        "the render had {} MiB live at its peak",
        peak / MIB
    );
}

/// Each hostile body with its variables: the helper's result would be hundreds of MiB (about
/// 200 MiB each here; a 2 MiB variable in the controller makes it gigabytes), the input a few
/// hundred KiB.
fn hostile() -> Vec<(&'static str, &'static str)> {
    vec![
        ("join", "{{join values.list values.sep}}"),
        (
            "join hidden in a condition",
            "{{#if (join values.list values.sep)}}{{/if}}",
        ),
        (
            "join inside another helper",
            "{{shell_quote (join values.list values.sep)}}",
        ),
        ("indent", "{{indent 256 values.lines}}"),
        ("nindent", "x:{{nindent 256 values.lines}}"),
        ("json", "{{json (join values.list values.sep)}}"),
        (
            "default",
            "{{#if (default (join values.list values.sep) \"\")}}{{/if}}",
        ),
    ]
}

fn compile(body: &str) -> CompiledTemplate {
    let spec = common::spec_yaml(&format!(
        "os: {{name: test}}\nformat: script\nvariables:\n  - {{name: list, schema: {{type: array}}}}\n  - {{name: sep, schema: {{type: string}}}}\n  - {{name: lines, schema: {{type: string}}}}\ntemplate: |\n  #!/bin/sh\n  {body}\n"
    ));
    CompiledTemplate::compile("BootstrapTemplate test/hostile", &spec)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn config() -> BootplateConfigSpec {
    BootplateConfigSpec {
        variables: BTreeMap::from([
            ("list".to_owned(), json!(vec!["a"; 2_000])),
            ("sep".to_owned(), json!("s".repeat(100_000))),
            ("lines".to_owned(), json!("x\n".repeat(400_000))),
        ]),
        ..Default::default()
    }
}

#[test]
fn a_hostile_helper_fails_with_the_size_error_without_allocating_its_result() {
    let config = config();
    for (what, body) in hostile() {
        let template = compile(body);
        let ctx = sample_context(Role::Worker);
        let (result, peak) = peak_of(|| template.render(&config, &ctx));
        match result {
            Err(RenderError::OutputTooLarge { limit, .. }) => assert_eq!(limit, MIB, "{what}"),
            other => panic!("{what}: expected the output size error, got {other:?}"),
        }
        // The input is under 1.5 MiB and the render copies it a few times (the values map);
        // the helper's result alone would be 200 MiB.
        assert!(
            peak < 16 * MIB,
            "{what}: the render had {} MiB live at its peak",
            peak / MIB
        );
    }
}

/// The same template with a small input renders: the bound refuses only what cannot fit.
#[test]
fn the_same_helpers_render_small_values() {
    let config = BootplateConfigSpec {
        variables: BTreeMap::from([
            ("list".to_owned(), json!(["a", "b"])),
            ("sep".to_owned(), json!(",")),
            ("lines".to_owned(), json!("x\ny")),
        ]),
        ..Default::default()
    };
    for (what, body) in hostile() {
        let rendered = compile(body).render(&config, &sample_context(Role::Worker));
        assert!(rendered.is_ok(), "{what}: {rendered:?}");
    }
}
