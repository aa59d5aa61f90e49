//! `minfer serve` end to end, driven by the official `openai` Python client
//! (`tests/server/test_openai.py`) against real server processes on the 0.5B model.
//!
//! The Python comes from `MINFER_TEST_PYTHON`, else `.venv-test/bin/python`, which
//! `scripts/python_env.sh` makes (`scripts/test.sh` runs it first). Without it the test fails
//! with that instruction: it never skips.

mod common;

use std::path::PathBuf;
use std::process::Command;

fn python() -> PathBuf {
    let p = std::env::var_os("MINFER_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-test/bin/python"));
    assert!(p.is_file(), "no Python with the openai client at {}: run scripts/python_env.sh (or scripts/test.sh)", p.display());
    p
}

#[test]
fn openai_client_against_minfer_serve() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let report = std::env::temp_dir().join(format!("minfer-serve-load-{}.json", std::process::id()));
    let out = Command::new(python())
        .arg(root.join("tests/server/test_openai.py"))
        .env("MINFER_BIN", env!("CARGO_BIN_EXE_minfer"))
        .env("MINFER_MODEL", common::model_path(common::QWEN2_05B))
        .env("MINFER_DATA", root.join("tests/data"))
        .env("MINFER_REPORT", &report)
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .expect("run the Python server tests");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "server tests failed:\n{text}");
    let load: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).expect("the load run wrote its report")).unwrap();
    assert_eq!(load["errors"], 0);
    assert_eq!(load["requests"], 60);
    std::fs::remove_file(report).ok();
}

/// The Llama (SmolLM2) and Gemma 3 models behind `minfer serve`, through the same client
/// (`tests/server/test_openai_models.py`): chat and completions equal llama.cpp's greedy text,
/// a chat request to a model without a template is a 400 saying what to do, and
/// `--chat-template FILE` gives it one.
#[test]
fn openai_client_against_llama_and_gemma3() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python())
        .arg(root.join("tests/server/test_openai_models.py"))
        .env("MINFER_BIN", env!("CARGO_BIN_EXE_minfer"))
        .env("MINFER_MODEL", common::model_path(common::SMOLLM2))
        .env("MINFER_SMOLLM2", common::model_path(common::SMOLLM2))
        .env("MINFER_GEMMA3", common::model_path(common::GEMMA3))
        .env("MINFER_GEMMA_TEMPLATE", root.join("examples/chat-templates/gemma3.jinja"))
        .env("MINFER_DATA", root.join("tests/data"))
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .expect("run the Python server tests");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "server tests failed:\n{text}");
}

/// Structured output through the server (`tests/server/test_structured.py`): a suite of over 40
/// JSON schemas (`tests/server/structured_schemas.json`), each answered greedy, sampled with
/// three seeds and streamed, validated by Python's `jsonschema`; `json_object`; GBNF grammars
/// checked by a regular expression and a parser written for the test; forced tool calls
/// through the official client; invalid schemas and grammars as 400s naming the place.
#[test]
fn structured_output_through_the_openai_client() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python())
        .arg(root.join("tests/server/test_structured.py"))
        .env("MINFER_BIN", env!("CARGO_BIN_EXE_minfer"))
        .env("MINFER_MODEL", common::model_path(common::QWEN2_05B))
        .env("MINFER_DATA", root.join("tests/data"))
        .env("MINFER_SCHEMAS", root.join("tests/server/structured_schemas.json"))
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .expect("run the Python server tests");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "structured-output tests failed:\n{text}");
}
