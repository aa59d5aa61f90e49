//! `--json-schema`, `--json-object` and `--grammar` on `minfer run` and `minfer chat`, end to
//! end on the 0.5B model: answers checked by the `jsonschema` crate, `serde_json` and a
//! hand-written matcher; bad schemas and grammars are one-line errors naming the place, before
//! the model is even loaded.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

fn minfer(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_minfer")).args(args).output().expect("run minfer")
}

fn model() -> String {
    common::model_path(common::QWEN2_05B).to_str().unwrap().to_string()
}

const SCHEMA: &str = r#"{"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
  "population": {"type": "integer", "minimum": 0}, "capital": {"type": "boolean"}},
  "required": ["city", "population", "capital"], "additionalProperties": false}"#;

fn text_of(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json output");
    v["text"].as_str().unwrap().to_string()
}

#[test]
fn run_answers_follow_the_schema_the_object_and_the_grammar() {
    let m = model();
    let schema: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for seed in ["1", "2"] {
        let text = text_of(&minfer(&["run", "-m", &m, "-p", "Describe Paris.", "--json-schema", SCHEMA, "--temp", "1", "--seed", seed, "-n", "200", "--json", "-t", "2"]));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(validator.is_valid(&v), "{text}");
    }
    let dir = std::env::temp_dir().join(format!("minfer-cli-structured-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let schema_file = dir.join("s.json");
    std::fs::write(&schema_file, SCHEMA).unwrap();
    let text = text_of(&minfer(&["run", "-m", &m, "-p", "Describe Rome.", "--json-schema", schema_file.to_str().unwrap(), "--temp", "0", "-n", "200", "--json", "-t", "2"]));
    assert!(validator.is_valid(&serde_json::from_str(&text).unwrap()), "{text}");
    let text = text_of(&minfer(&["run", "-m", &m, "-p", "Describe a cat.", "--json-object", "--temp", "0", "-n", "200", "--json", "-t", "2"]));
    assert!(serde_json::from_str::<serde_json::Value>(&text).unwrap().is_object(), "{text}");
    // A time of day: HH:MM, 24-hour.
    let gbnf = dir.join("time.gbnf");
    std::fs::write(&gbnf, "root ::= hour \":\" [0-5] [0-9]\nhour ::= [01] [0-9] | \"2\" [0-3]\n").unwrap();
    let text = text_of(&minfer(&["run", "-m", &m, "-p", "What time does the shop open?", "--grammar", gbnf.to_str().unwrap(), "--temp", "1", "--seed", "3", "-n", "20", "--json", "-t", "2"]));
    let b = text.as_bytes();
    let hour_ok = b.len() == 5 && ((b[0] == b'0' || b[0] == b'1') && b[1].is_ascii_digit() || b[0] == b'2' && (b'0'..=b'3').contains(&b[1]));
    assert!(hour_ok && b[2] == b':' && (b'0'..=b'5').contains(&b[3]) && b[4].is_ascii_digit(), "{text:?}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn chat_answers_every_turn_under_the_schema() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["chat", "-m", &model(), "--json-schema", SCHEMA, "--temp", "0", "-t", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"Describe Paris.\nNow Lyon.\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let schema: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let answers: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(answers.len(), 2, "{text}");
    for a in answers {
        assert!(validator.is_valid(&serde_json::from_str(a).unwrap_or_else(|e| panic!("{e}: {a:?}"))), "{a}");
    }
}

#[test]
fn bad_schemas_and_grammars_are_one_line_errors() {
    let m = model();
    let dir = std::env::temp_dir().join(format!("minfer-cli-structured-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad_gbnf = dir.join("bad.gbnf");
    std::fs::write(&bad_gbnf, "root ::= \"a\" (b\n").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--json-schema", r#"{"type": "object", "properties": {"age": {"type": "integr"}}}"#], "--json-schema: properties.age.type: unknown type 'integr'"),
        (vec!["--json-schema", r#"{"type": "array", "uniqueItems": true}"#], "--json-schema: uniqueItems: the keyword 'uniqueItems' cannot be enforced"),
        (vec!["--json-schema", "{not json"], "--json-schema: not JSON"),
        (vec!["--json-schema", "/no/such/schema.json"], "/no/such/schema.json"),
        (vec!["--grammar", bad_gbnf.to_str().unwrap()], "--grammar: line 2, column 1: expected ')'"),
    ];
    for (args, says) in cases {
        let mut all = vec!["run", "-m", m.as_str(), "-p", "x", "-t", "2"];
        all.extend(args.iter());
        let out = minfer(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing generated");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = minfer(&["run", "-m", &m, "-p", "x", "--json-object", "--grammar", "g"]);
    assert!(!out.status.success());
    std::fs::remove_dir_all(dir).ok();
}
