//! Test support shared by the integration tests.
#![allow(dead_code)]

pub mod gguf_bytes;
pub mod rng;
pub mod tokenizer_cases;

use std::path::PathBuf;

/// Directory of the test models: `$MINFER_MODEL_DIR`, else `<repo>/models`.
pub fn model_dir() -> PathBuf {
    std::env::var_os("MINFER_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"))
}

pub const QWEN2_05B: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
pub const QWEN2_15B: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
pub const QWEN3_TINY: &str = "qwen3-tiny.gguf";
pub const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// Path of a test model; panics with the command to fetch it when it is missing, so a missing
/// model fails the test instead of skipping it.
pub fn model_path(name: &str) -> PathBuf {
    let p = model_dir().join(name);
    assert!(p.is_file(), "test model {} is missing: run scripts/fetch_models.sh first", p.display());
    p
}

/// Path of a file in `tests/data`.
pub fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("data").join(name)
}

/// Serves `app` on a free loopback port from a background runtime (two workers); returns the
/// port. The listener is bound before this returns, so requests may follow at once.
pub fn serve_app(app: axum::Router) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    port
}

/// A command that runs this test binary again (tests that need a fresh process, e.g. for the
/// ISA levers). Under an emulator without binfmt (scripts/test_neon.sh) the child goes through
/// `MINFER_TEST_RUNNER`, e.g. `qemu-aarch64 -L /usr/aarch64-linux-gnu`.
pub fn rerun_self() -> std::process::Command {
    let exe = std::env::current_exe().expect("test binary path");
    let runner = std::env::var("MINFER_TEST_RUNNER").unwrap_or_default();
    let mut runner = runner.split_whitespace();
    match runner.next() {
        Some(program) => {
            let mut c = std::process::Command::new(program);
            c.args(runner).arg(exe);
            c
        }
        None => std::process::Command::new(exe),
    }
}
