//! What a hostile input makes the render allocate. A gzip member in a file of an in-place
//! part (what the node payload, the update hooks and the webhook decode) is decompressed only
//! up to the output limit, so a bomb of a few hundred KiB that expands to hundreds of MiB fails
//! with the size error after allocating about the limit.
//!
//! Allocations are counted by this test binary's global allocator, per thread (each test runs
//! on its own thread), so the measure is the render's own: what it asked for, not what a
//! process-wide RSS reading mixes in from other tests.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write as _;

use base64::Engine as _;
use crd_types::{BootplateConfigSpec, ConfigFile, FileEncoding, Role};
use render::generator::Generated;
use render::{CompiledTemplate, RenderError, sample_context};

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
