//! The memory plan is reserved once: after an engine is built (KV regions and compute arenas
//! sized for the worst-case graph), forward passes of any token count — prefill chunks, decode
//! steps, a few logit rows, KV edits with their K-shift graph — allocate nothing more. Measured
//! from the backend's own allocation counters. And a byte cap refuses what does not fit with a
//! one-line error naming the backend and the sizes: in the library, the CLI and the server.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::rng::Rng;
use minfer::generate::{Engine, EngineParams};
use minfer::gguf::GgufFile;
use minfer::graph::{Backend, MemoryStats};
use minfer::models::{Model, load_model};

fn model(name: &str) -> Arc<Model> {
    let f = GgufFile::open(common::model_path(name)).expect("model opens");
    Arc::new(load_model(Arc::new(f)).expect("model loads"))
}

fn params(n_ctx: usize, n_ubatch: usize) -> EngineParams {
    EngineParams { n_ctx, n_ubatch, n_threads: 2, trace: false, dump: None, ..EngineParams::default() }
}

fn cpu(e: &Engine) -> MemoryStats {
    e.memory(Backend::CPU).expect("the CPU is always enabled")
}

#[test]
fn two_hundred_varied_passes_after_the_reserve_allocate_nothing() {
    for name in [common::QWEN2_05B, common::QWEN3_TINY] {
        let m = model(name);
        let n_vocab = m.hparams().n_vocab;
        let (n_ctx, n_ubatch) = (256, 48);
        let mut e = Engine::new(m.clone(), &params(n_ctx, n_ubatch)).unwrap();
        let reserved = cpu(&e);
        let n_layer = m.hparams().n_layer as u64;
        // The reserve: two KV regions per layer and one arena, nothing else.
        assert_eq!(reserved.allocations, 2 * n_layer + 1, "{name}: {reserved:?}");
        let mut rng = Rng(0x5eed_0001);
        let mut shapes = std::collections::BTreeSet::new();
        let mut edits = 0;
        for pass in 0..200 {
            let nt = match rng.next() % 4 {
                0 | 1 => 1,
                2 => 2 + (rng.next() as usize % 7),
                _ => 1 + (rng.next() as usize % n_ubatch),
            };
            let n_out = 1 + rng.next() as usize % nt.min(minfer::generate::RESERVED_OUTPUTS);
            if e.n_past() + nt > n_ctx {
                // Make room the three ways a conversation does: forget, drop the tail, shift.
                match pass % 3 {
                    0 => e.reset(),
                    1 => e.kv_rm(e.n_past() / 2, e.n_past()).unwrap(),
                    _ => e.context_shift(4, e.n_past() / 2).unwrap(),
                }
                edits += 1;
            }
            let tokens: Vec<u32> = (0..nt).map(|_| rng.next() % n_vocab).collect();
            let logits = e.eval(&tokens, n_out).unwrap();
            assert_eq!(logits.len(), n_out * n_vocab as usize);
            shapes.insert((nt, n_out));
            let now = cpu(&e);
            assert_eq!(
                (now.allocations, now.bytes_in_use),
                (reserved.allocations, reserved.bytes_in_use),
                "{name}: pass {pass} ({nt} tokens, {n_out} rows) allocated after the reserve"
            );
        }
        assert!(shapes.len() > 40 && edits > 2, "{name}: the passes varied ({} shapes, {edits} KV edits)", shapes.len());
        println!(
            "{name}: 200 passes, {} shapes, {edits} KV edits: {} allocations, {} bytes held, all at the reserve",
            shapes.len(),
            reserved.allocations,
            reserved.bytes_in_use
        );
        // The counter does count: a pass past the reserve (twice n_ubatch tokens, every row's
        // logits) grows the arena once, and the next pass of that size fits.
        e.reset();
        let long: Vec<u32> = (0..n_ubatch as u32 * 2).map(|i| i % n_vocab).collect();
        e.eval(&long, long.len()).unwrap();
        assert_eq!(cpu(&e).allocations, reserved.allocations + 1, "{name}: a larger graph needs a larger arena");
        e.reset();
        e.eval(&long, long.len()).unwrap();
        assert_eq!(cpu(&e).allocations, reserved.allocations + 1);
    }
}

#[test]
fn a_context_that_does_not_fit_the_cap_is_refused_naming_the_backend_and_sizes() {
    let m = model(common::QWEN2_05B);
    // 24 layers x 2 regions x 4096 cells x 128 floats x 4 bytes = 96 MiB of KV: a 64 MiB cap
    // refuses it; the model's weights stay in the file map and do not count.
    let mut p = params(4096, 512);
    p.memory_cap = Some(64 << 20);
    let err = Engine::new(m.clone(), &p).err().expect("the KV does not fit");
    let msg = err.to_string();
    assert!(msg.starts_with("cpu: out of memory allocating 2097152 bytes for a KV region"), "{msg}");
    assert!(msg.contains("cap 67108864 bytes") && !msg.contains('\n'), "{msg}");
    // With room for it, the same engine builds and runs.
    p.memory_cap = Some(256 << 20);
    let mut e = Engine::new(m, &p).unwrap();
    e.eval(&[1, 2, 3], 1).unwrap();
    assert!(cpu(&e).bytes_in_use <= 256 << 20);
}

fn minfer(args: &[&str], cap: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_minfer")).args(args).env("MINFER_CPU_MEMORY_CAP", cap).output().expect("run minfer")
}

#[test]
fn the_cli_exits_and_the_server_refuses_to_start_when_memory_runs_out() {
    let path = common::model_path(common::QWEN2_05B);
    let path = path.to_str().unwrap();
    let out = minfer(&["run", "-m", path, "--raw", "-p", "hello", "-n", "4", "--ctx", "4096"], "64M");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let last = stderr.lines().filter(|l| !l.trim().is_empty()).last().unwrap_or("");
    assert!(last.contains("cpu: out of memory allocating") && last.contains("cap 67108864 bytes"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing generated: {}", String::from_utf8_lossy(&out.stdout));

    let out = minfer(&["serve", "-m", path, "--host", "127.0.0.1", "--port", "0", "--ctx", "4096"], "64M");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("cpu: out of memory allocating") && !stderr.contains("panicked"), "{stderr}");

    // A malformed cap is refused by name, not ignored.
    let out = minfer(&["run", "-m", path, "--raw", "-p", "hello", "-n", "1"], "lots");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("MINFER_CPU_MEMORY_CAP='lots'"), "{stderr}");
}
