//! `minfer tokenize` and `minfer template` end to end on the 0.5B model file, against llama.cpp's
//! reference ids and renderings (`tests/data/`).

mod common;

use std::process::Command;

fn minfer(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_minfer")).args(args).output().expect("run minfer")
}

fn model() -> String {
    common::model_path(common::QWEN2_05B).to_str().expect("utf-8 path").to_string()
}

#[test]
fn tokenize_json_matches_reference_ids() {
    let text = std::fs::read_to_string(common::data_path("qwen2.5-0.5b.tokenizer.jsonl")).unwrap();
    let m = model();
    let mut checked = 0;
    // Every 7th line: process start-up dominates, the library test covers all 120.
    for line in text.lines().step_by(7) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let t = v["text"].as_str().unwrap();
        if t.starts_with('-') {
            continue; // would parse as a flag; the library test covers it
        }
        let mut args = vec!["tokenize", "-m", &m, "--json"];
        if v["parse_special"].as_bool().unwrap() {
            args.push("--special");
        }
        args.push(t);
        let out = minfer(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(got, v["ids"], "{t:?}");
        checked += 1;
    }
    assert!(checked >= 15, "{checked}");
}

#[test]
fn template_renders_reference_prompts_from_the_model_file() {
    let text = std::fs::read_to_string(common::data_path("chat_reference.jsonl")).unwrap();
    let dir = std::env::temp_dir().join(format!("minfer-tmpl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut n = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let path = dir.join(format!("{n}.json"));
        std::fs::write(&path, serde_json::to_string(&v["messages"]).unwrap()).unwrap();
        let out = minfer(&["template", "-m", &model(), "--messages", path.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8(out.stdout).unwrap(), v["prompt_text"].as_str().unwrap());
        n += 1;
    }
    assert_eq!(n, 4, "4 chat records");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn template_errors_are_one_line() {
    let dir = std::env::temp_dir().join(format!("minfer-tmpl-err-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, body, needle) in [
        ("notjson", "{", "not valid JSON"),
        ("norole", r#"[{"content": "x"}]"#, "missing \"role\""),
        ("shape", r#"{"messages": 3}"#, "must be an array"),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        let out = minfer(&["template", "-m", &model(), "--messages", p.to_str().unwrap()]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{err}");
    }
    let out = minfer(&["tokenize", "-m", "/nonexistent.gguf", "x"]);
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    std::fs::remove_dir_all(dir).ok();
}
