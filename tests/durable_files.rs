//! Files minfer writes for later runs — KV session files (`chat /save`) and `MINFER_TRACE`
//! traces — are replaced whole or not at all: a write that fails part-way (a full disk,
//! simulated with `AtomicWrite::fail_after_bytes`) returns the error, leaves the previous file
//! loadable and byte-identical, and leaves no temporary file behind. Damaged session files are
//! refused on load with an error that says what is wrong.

mod common;

use std::path::{Path, PathBuf};

use minfer::chat::ChatMessage;
use minfer::generate::session::{Session, SessionError};
use minfer::generate::{AtomicWrite, DurableError, KvSnapshot, TraceError, TraceOptions, TraceRecorder};
use minfer::gguf::GgufFile;
use minfer::graph::KvType;
use minfer::tokenizer::Tokenizer;

/// A fresh empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-durable-files-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// A session of `n` tokens over two layers; `salt` makes the KV bytes differ between calls.
fn session(n: usize, salt: u8) -> Session {
    let row_bytes = 34; // one q8_0 block
    let rows = |k: u8| (0..n * row_bytes).map(|i| (i as u8).wrapping_mul(31).wrapping_add(k).wrapping_add(salt)).collect::<Vec<u8>>();
    Session {
        fingerprint: 0x1234_5678_9ABC_DEF0,
        keep: 2,
        kv: KvSnapshot {
            tokens: (0..n as u32).map(|t| t * 7 + u32::from(salt)).collect(),
            positions: (0..n as i32).collect(),
            kv_type: KvType::Q8_0,
            row_bytes,
            layers: vec![(rows(1), rows(2)), (rows(3), rows(4))],
        },
        dropped: vec![3, 1, 4],
        messages: vec![ChatMessage::system("be brief"), ChatMessage::user(format!("question {salt}"))],
    }
}

#[test]
fn a_failed_session_save_keeps_the_previous_file() {
    let dir = scratch("session");
    let path = dir.join("chat.kv");
    let old = session(100, 0);
    old.save(&path).unwrap();
    let old_bytes = std::fs::read(&path).unwrap();
    assert_eq!(old_bytes, old.encode().unwrap());
    let new = session(300, 9);
    let len = new.encode().unwrap().len() as u64;
    assert!(len > 8192, "the new file ({len} bytes) is larger than one write buffer");
    for at in [0, 1, len / 2, len - 1] {
        let e = new.save_with(&path, &AtomicWrite { fail_after_bytes: Some(at) }).unwrap_err();
        match &e {
            SessionError::Save(DurableError::Write { path: p, .. }) => assert_eq!(p, &path),
            other => panic!("failure after {at} bytes: {other:?}"),
        }
        assert!(e.to_string().contains("chat.kv: writing failed"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), old_bytes, "failure after {at} bytes changed the file");
        assert_eq!(Session::load(&path).unwrap(), old, "failure after {at} bytes");
        assert_eq!(entries(&dir), ["chat.kv"], "failure after {at} bytes left a temporary file");
    }
    // A budget of exactly the file's length is enough: the injected offsets above were inside
    // the file, not past it.
    new.save_with(&path, &AtomicWrite { fail_after_bytes: Some(len) }).unwrap();
    assert_eq!(Session::load(&path).unwrap(), new);
    assert_eq!(entries(&dir), ["chat.kv"]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_session_save_into_a_missing_directory_names_the_path() {
    let path = Path::new("/nonexistent-minfer-dir/chat.kv");
    let e = session(3, 0).save(path).unwrap_err();
    assert!(matches!(&e, SessionError::Save(DurableError::CreateTemp { .. })), "{e:?}");
    assert!(e.to_string().starts_with("/nonexistent-minfer-dir/chat.kv: cannot create the temporary file"), "{e}");
}

/// Damage at the places the other corruption tests leave out: those (session.rs's unit
/// tests on bytes, tests/cli_chat.rs through `/load`) cut 100 bytes off the end or inside the
/// magic, and flip a bit in the middle; these cut the last byte and inside the version field,
/// and flip a bit in the messages' JSON and in the stored checksum itself.
#[test]
fn damaged_session_files_are_refused_with_a_clear_error() {
    let dir = scratch("damaged");
    let good = dir.join("good.kv");
    let s = session(50, 1);
    s.save(&good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let load = |name: &str, b: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, b).unwrap();
        Session::load(&p).unwrap_err()
    };

    let e = load("cut-last.kv", &bytes[..bytes.len() - 1]);
    assert!(matches!(e, SessionError::Checksum { .. }), "{e:?}");
    assert!(e.to_string().contains("checksum mismatch") && e.to_string().ends_with("the file is corrupted"), "{e}");
    let e = load("cut-version.kv", &bytes[..10]);
    assert!(matches!(e, SessionError::Truncated { need: 12, have: 10 }), "{e:?}");
    assert_eq!(e.to_string(), "session file is truncated: 12 bytes needed, 10 present");

    let json_at = bytes.windows(8).position(|w| w == b"be brief").unwrap();
    for (what, at) in [("messages", json_at), ("checksum", bytes.len() - 3)] {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x10;
        let e = load(&format!("flip-{what}.kv"), &flipped);
        assert!(matches!(e, SessionError::Checksum { .. }), "{what}: {e:?}");
    }
    assert_eq!(Session::load(&good).unwrap(), s, "the intact file still loads");
    std::fs::remove_dir_all(dir).ok();
}

fn tokenizer() -> Tokenizer {
    let f = GgufFile::open(common::model_path(common::QWEN3_TINY)).unwrap();
    Tokenizer::from_gguf(&f).unwrap()
}

#[test]
fn a_failed_trace_write_keeps_the_previous_trace() {
    let dir = scratch("trace");
    let opts = TraceOptions { path: dir.join("run.trace.json"), max_values: 8 };
    let tok = tokenizer();
    let rec = TraceRecorder::new(8);
    // As `minfer run` does: the file is opened before the run, written after it.
    let file = opts.create().unwrap();
    assert_eq!(entries(&dir).len(), 1, "the temporary file exists from the start");
    assert!(!opts.path.exists(), "the trace appears only once complete");
    rec.write(file, "tiny", "the first prompt", &tok).unwrap();
    let old = std::fs::read(&opts.path).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&old).unwrap();
    assert_eq!((v["format"].as_str(), v["prompt"].as_str()), (Some("minfer-trace"), Some("the first prompt")));

    // A long prompt makes the new trace larger than one write buffer.
    let prompt = "a second, much longer prompt ".repeat(1000);
    let mut full = Vec::new();
    rec.write_json(&mut full, "tiny", &prompt, &tok).unwrap();
    let len = full.len() as u64;
    for at in [0, len / 2, len - 1] {
        let file = opts.create_with(&AtomicWrite { fail_after_bytes: Some(at) }).unwrap();
        let e = rec.write(file, "tiny", &prompt, &tok).unwrap_err();
        assert!(matches!(e, TraceError::Write(DurableError::Write { .. })), "after {at}: {e:?}");
        assert!(e.to_string().starts_with(&format!("cannot write trace {}: writing failed", opts.path.display())), "{e}");
        assert_eq!(std::fs::read(&opts.path).unwrap(), old, "failure after {at} bytes changed the trace");
        assert_eq!(entries(&dir), ["run.trace.json"], "failure after {at} bytes left a temporary file");
    }
    let file = opts.create_with(&AtomicWrite { fail_after_bytes: Some(len) }).unwrap();
    rec.write(file, "tiny", &prompt, &tok).unwrap();
    assert_eq!(std::fs::read(&opts.path).unwrap(), full);
    assert_eq!(entries(&dir), ["run.trace.json"]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_trace_that_cannot_be_saved_fails_before_the_run() {
    let opts = TraceOptions { path: PathBuf::from("/nonexistent-minfer-dir/t.json"), max_values: 8 };
    let e = opts.create().unwrap_err();
    assert!(matches!(e, TraceError::Write(DurableError::CreateTemp { .. })), "{e:?}");
    // The CLI test (tests/graph_trace.rs) looks for this prefix.
    assert!(e.to_string().starts_with("cannot write trace /nonexistent-minfer-dir/t.json: "), "{e}");
}
