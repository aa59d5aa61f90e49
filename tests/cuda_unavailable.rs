//! A cuda-feature build on a machine without an NVIDIA driver: the registry says why CUDA is
//! not usable, `--backend cuda` (and `MINFER_BACKENDS=cuda`) exit non-zero with that one line,
//! and a run that never asked for CUDA uses the CPU and succeeds. Nothing panics.
//! On a machine with a working driver the refusal cases do not apply; the test says so and
//! checks that the probe found a device instead.
#![cfg(feature = "cuda")]

mod common;

use std::process::Command;

use minfer::backends::cuda::driver;
use minfer::graph::{Backend, GraphError};

fn minfer(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_minfer"));
    c.args(args).env_remove("MINFER_BACKENDS");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run minfer")
}

#[test]
fn cuda_is_refused_with_the_probe_reason_and_the_default_run_uses_the_cpu() {
    let reason = match driver::probe() {
        Ok(dev) => {
            eprintln!("a CUDA device is present ({}): the no-driver refusals are not checked here", dev.name);
            assert!(!dev.name.is_empty() && dev.total_mem > 0);
            return;
        }
        Err(reason) => reason,
    };
    assert!(reason.contains("libcuda.so.1"), "the reason names the library: {reason}");

    let registry = minfer::backends::registry();
    let entry = registry.entry(Backend::CUDA).expect("cuda entry");
    assert!(entry.compiled_in && !entry.usable_here());
    match registry.parse_fence("cuda") {
        Err(GraphError::BackendUnusable { name, reason: r }) => {
            assert_eq!(name, "cuda");
            assert_eq!(r, reason);
        }
        other => panic!("expected BackendUnusable, got {other:?}"),
    }

    let model = common::model_path(common::QWEN3_TINY);
    let m = model.to_str().expect("utf-8 path");
    let run = ["run", "-m", m, "-p", "hi", "-n", "2", "--temp", "0"];
    for (args, env) in [
        ([&run[..], &["--backend", "cuda"]].concat(), vec![]),
        (run.to_vec(), vec![("MINFER_BACKENDS", "cuda")]),
        (vec!["info", "--backend", "cuda", m], vec![]),
    ] {
        let out = minfer(&args, &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a refused backend exits non-zero");
        assert!(out.stdout.is_empty(), "nothing is generated: {}", String::from_utf8_lossy(&out.stdout));
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(lines[0].contains("backend 'cuda' is not usable on this machine") && lines[0].contains(&reason), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }

    let out = minfer(&run, &[]);
    assert!(out.status.success(), "the default run uses the CPU: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!out.stdout.is_empty());
    // `info --backend` loads the model and reports each backend it was placed on.
    let out = minfer(&["info", "--backend", "cpu", m], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.lines().any(|l| l.starts_with("backend cpu") && l.contains("weights read from the file's map")), "{text}");
}
