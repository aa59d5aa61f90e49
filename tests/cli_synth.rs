//! `minfer synth`: a synthetic model has the real model's tensor table (checked against the
//! real GGUF files), loads, runs with finite values everywhere, is the same bytes for the same
//! seed, and bad arguments are one line on stderr.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use minfer::generate::{Engine, EngineParams};
use minfer::gguf::GgufFile;
use minfer::models::load_model;
use minfer::quants::dequantize_row;

fn minfer(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_minfer")).args(args).output().expect("run minfer")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("minfer-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn synth(like: &str, out: &Path, seed: &str) {
    let o = minfer(&["synth", "--like", like, "-o", out.to_str().unwrap(), "--seed", seed]);
    assert!(o.status.success(), "synth --like {like}: {}", String::from_utf8_lossy(&o.stderr));
}

/// (name, dims, type id) of every tensor, in file order.
fn table(f: &GgufFile) -> Vec<(String, Vec<u64>, u32)> {
    f.tensors().iter().map(|t| (t.name.clone(), t.dims.clone(), t.type_id)).collect()
}

/// The built-in profiles are the real models' tensor tables and hyper-parameters.
#[test]
fn builtin_profiles_have_the_real_models_tensors() {
    for (profile, real) in [("qwen2.5-0.5b-q4_k_m", common::QWEN2_05B), ("qwen2.5-1.5b-q4_k_m", common::QWEN2_15B)] {
        let real = GgufFile::open(common::model_path(real)).expect("real model");
        let out = tmp(&format!("{profile}.gguf"));
        synth(profile, &out, "1");
        let fake = GgufFile::open(&out).expect("the synthetic file opens");
        assert_eq!(table(&fake), table(&real), "{profile}: tensor table");
        let (hr, hf) = (load_model(Arc::new(real)).expect("real loads"), load_model(Arc::new(fake)).expect("synthetic loads"));
        assert_eq!(format!("{:?}", hf.hparams()), format!("{:?}", hr.hparams()), "{profile}: hyper-parameters");
        let _ = std::fs::remove_file(&out);
    }
}

/// A model copied from a file: every value of every tensor is finite, a forward pass gives
/// finite logits, and the same seed writes the same bytes (another seed other ones).
#[test]
fn a_synthetic_copy_is_finite_runs_and_is_reproducible() {
    let like = common::model_path(common::QWEN3_TINY);
    let (a, b, c) = (tmp("a.gguf"), tmp("b.gguf"), tmp("c.gguf"));
    synth(like.to_str().unwrap(), &a, "7");
    synth(like.to_str().unwrap(), &b, "7");
    synth(like.to_str().unwrap(), &c, "8");
    let (ba, bb, bc) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), std::fs::read(&c).unwrap());
    assert!(ba == bb, "the same seed writes the same file");
    assert!(ba != bc, "another seed writes other weights");

    let f = Arc::new(GgufFile::open(&a).expect("opens"));
    assert_eq!(table(&f), table(&GgufFile::open(&like).unwrap()));
    for t in f.tensors() {
        let ty = t.ty.expect("a known type");
        let mut v = vec![0.0f32; t.n_elements as usize];
        dequantize_row(ty, f.tensor_data(t).unwrap(), &mut v).unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{} ({}) has a non-finite value", t.name, t.type_name());
        assert!(v.iter().any(|&x| x != 0.0), "{} is all zeros", t.name);
    }
    let model = Arc::new(load_model(f).expect("loads"));
    let mut e = Engine::new(model, &EngineParams { n_ctx: 64, n_threads: 2, ..EngineParams::default() }).expect("engine");
    let logits = e.prefill(&[1, 2, 3, 300], None).expect("prefill");
    assert!(logits.iter().all(|x| x.is_finite()), "finite logits");
    for p in [a, b, c] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn bad_arguments_are_one_line() {
    let o = minfer(&["synth", "--like", "no-such-model", "-o", tmp("x.gguf").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no-such-model") && err.contains("qwen2.5-0.5b-q4_k_m"), "{err}");
    let o = minfer(&["synth", "--like", "qwen2.5-0.5b-q4_k_m"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.lines().count() == 1 && err.contains("-o"), "{err}");
}
