//! `minfer run` and `minfer logits` end to end on the 0.5B model, against llama.cpp's greedy
//! reference (`tests/data/qwen2.5-0.5b.greedy.jsonl`).

mod common;

use std::process::Command;

fn minfer(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_minfer")).args(args).output().expect("run minfer")
}

fn model() -> String {
    common::model_path(common::QWEN2_05B).to_str().unwrap().to_string()
}

fn record(id: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(common::data_path("qwen2.5-0.5b.greedy.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["id"] == id)
        .unwrap_or_else(|| panic!("no record {id}"))
}

fn run_json(args: &[&str]) -> serde_json::Value {
    let out = minfer(args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn greedy_raw_prompt_equals_llama_cpp() {
    // "count": every step's top-1/top-2 margin is >= 1.19, so the whole continuation must match.
    let r = record("count");
    let text = r["prompt_text"].as_str().unwrap().to_string();
    let m = model();
    let v = run_json(&["run", "-m", &m, "--raw", "-p", &text, "--temp", "0", "-n", "64", "--json", "-t", "2"]);
    assert_eq!(v["prompt_ids"], r["prompt_ids"]);
    assert_eq!(v["generated_ids"], r["generated_ids"]);
    assert!(v["gen_tokens_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn greedy_chat_equals_llama_cpp_and_stops_on_end_of_generation() {
    // "chat_math": ends with <|im_end|> after 3 tokens; generated_ids keeps it, text leaves it out.
    let r = record("chat_math");
    let dir = std::env::temp_dir().join(format!("minfer-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let msgs = dir.join("m.json");
    std::fs::write(&msgs, r["messages"].to_string()).unwrap();
    let v = run_json(&["run", "-m", &model(), "--messages", msgs.to_str().unwrap(), "--temp", "0", "--json"]);
    assert_eq!(v["prompt_ids"], r["prompt_ids"]);
    assert_eq!(v["generated_ids"], r["generated_ids"]);
    assert_eq!(v["text"], r["generated_text"]);
    assert!(!v["text"].as_str().unwrap().contains("<|im_end|>"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn dump_graph_census_is_440_for_a_30_token_prompt() {
    let r = record("chat_system");
    assert_eq!(r["prompt_ids"].as_array().unwrap().len(), 30);
    let dir = std::env::temp_dir().join(format!("minfer-dump-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let msgs = dir.join("m.json");
    std::fs::write(&msgs, r["messages"].to_string()).unwrap();
    let (dot, json) = (dir.join("g.dot"), dir.join("g.json"));
    let out = minfer(&[
        "run", "-m", &model(), "--messages", msgs.to_str().unwrap(),
        "--dump-graph", dot.to_str().unwrap(), "--dump-graph-json", json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("440 nodes"));
    let dot = std::fs::read_to_string(dot).unwrap();
    assert_eq!(dot.lines().filter(|l| l.trim_start().starts_with('n') && l.contains("[label=")).count(), 440);
    assert_eq!(dot.matches("doublecircle").count(), 4, "3 inputs and the logits");
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    assert_eq!(j["format"], "minfer-graph");
    assert_eq!(j["version"], 1);
    assert_eq!(j["nodes"].as_array().unwrap().len(), 440);
    // A one-token prompt builds the decode-shaped graph: no tail_ids input, no tail get_rows.
    let out = minfer(&["run", "-m", &model(), "--raw", "-p", "Hello", "--dump-graph", dir.join("d.dot").to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("437 nodes for 1 tokens"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn logits_command_is_chunking_invariant_and_matches_reference_top1() {
    let r = record("count");
    let mut ids: Vec<u64> = r["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    let n_prompt = ids.len();
    ids.extend(r["generated_ids"].as_array().unwrap().iter().take(4).map(|x| x.as_u64().unwrap()));
    let ids_arg = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let from = (n_prompt - 1).to_string();
    let a = minfer(&["logits", "-m", &model(), "--ids", &ids_arg, "--from", &from, "--top", "5"]);
    let b = minfer(&["logits", "-m", &model(), "--ids", &ids_arg, "--from", &from, "--top", "5", "--ubatch", "3", "-t", "1"]);
    assert!(a.status.success() && b.status.success());
    assert_eq!(a.stdout, b.stdout, "--ubatch and -t change nothing");
    let lines: Vec<serde_json::Value> = a.stdout.split(|&c| c == b'\n').filter(|l| !l.is_empty()).map(|l| serde_json::from_slice(l).unwrap()).collect();
    assert_eq!(lines.len(), 5);
    for (step, line) in lines.iter().enumerate() {
        assert_eq!(line["pos"].as_u64().unwrap() as usize, n_prompt - 1 + step);
        assert_eq!(line["top"][0][0], r["top20_per_step"][step][0][0], "step {step}");
    }
}

#[test]
fn prompt_longer_than_context_fails_before_compute() {
    let out = minfer(&["run", "-m", &model(), "-p", "one two three four five six seven eight nine ten", "--ctx", "4"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("does not fit the context of 4"), "{err}");
    let out = minfer(&["logits", "-m", &model(), "--ids", "1,2", "--from", "5"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--from 5"));
}

/// `--draft`: the `count` reference continuation (llama.cpp's, margin >= 1.19 at every step)
/// with the random-weight Qwen3 fixture drafting (same vocabulary, so its drafts are mostly
/// rejected): still the reference tokens; `--json` reports the draft's statistics and
/// `--verbose` prints them.
#[test]
fn draft_model_keeps_the_reference_output_and_reports_statistics() {
    let r = record("count");
    let text = r["prompt_text"].as_str().unwrap().to_string();
    let (m, tiny) = (model(), common::model_path(common::QWEN3_TINY).to_str().unwrap().to_string());
    let args = ["run", "-m", &m, "--draft", &tiny, "--draft-n", "3", "--raw", "-p", &text, "--temp", "0", "-n", "64", "-t", "2"];
    let v = run_json(&[&args[..], &["--json"]].concat());
    assert_eq!(v["generated_ids"], r["generated_ids"]);
    let d = &v["draft"];
    let (drafted, accepted) = (d["drafted"].as_u64().unwrap(), d["accepted"].as_u64().unwrap());
    assert!(drafted > 0 && accepted <= drafted, "{d}");
    assert!(d["rounds"].as_u64().unwrap() > 0 && d["draft_secs"].as_f64().unwrap() > 0.0, "{d}");
    assert!((d["acceptance"].as_f64().unwrap() - accepted as f64 / drafted as f64).abs() < 1e-9);

    let out = minfer(&[&args[..], &["--verbose"]].concat());
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.lines().any(|l| l.starts_with("minfer: draft: ") && l.contains("accepted")), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), r["generated_text"].as_str().unwrap().trim_end());
}

#[test]
fn unusable_drafts_are_one_line_errors() {
    let dir = std::env::temp_dir().join(format!("minfer-draft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A GGUF whose tokenizer has 3 tokens.
    let small = dir.join("small-vocab.gguf");
    let bytes = common::gguf_bytes::valid()
        .kv_str("tokenizer.ggml.model", "gpt2")
        .kv_str("tokenizer.ggml.pre", "qwen2")
        .kv_str_array("tokenizer.ggml.merges", &[])
        .build();
    std::fs::write(&small, bytes).unwrap();
    let m = model();
    let missing = dir.join("missing.gguf");
    let cases: [(&[&str], &str); 4] = [
        (&["--draft", small.to_str().unwrap()], "the draft model cannot draft for this target: the target has 151936 tokens, the draft 3"),
        (&["--draft", missing.to_str().unwrap()], "missing.gguf"),
        (&["--draft", &m, "--draft-n", "0"], "--draft-n must be at least 1"),
        (&["--draft", &m, "--draft-min-p", "2"], "--draft-min-p = 2"),
    ];
    for (extra, what) in cases {
        let out = minfer(&[&["run", "-m", &m, "-p", "hi", "-n", "2", "--temp", "0"][..], extra].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?}");
        assert_eq!(err.trim_end().lines().count(), 1, "{extra:?}: {err}");
        assert!(err.contains(what), "{extra:?}: {err}");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// `minfer run` with stdin fed from `input`.
fn minfer_stdin(args: &[&str], input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run minfer");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// Plain `-p TEXT` on a model with a chat template is the user's message: "chat_math" (one user
/// message) and "chat_system" (`--system` + `-p`) give llama.cpp's templated prompt ids and
/// greedy answers, ending at <|im_end|>.
#[test]
fn plain_prompt_speaks_the_chat_template_like_llama_cpp() {
    let m = model();
    let r = record("chat_math");
    let user = r["messages"][0]["content"].as_str().unwrap();
    let v = run_json(&["run", "-m", &m, "-p", user, "--temp", "0", "--json"]);
    assert_eq!(v["prompt_ids"], r["prompt_ids"]);
    assert_eq!(v["generated_ids"], r["generated_ids"]);
    assert_eq!(v["text"], r["generated_text"]);

    let r = record("chat_system");
    let (system, user) = (r["messages"][0]["content"].as_str().unwrap(), r["messages"][1]["content"].as_str().unwrap());
    let v = run_json(&["run", "-m", &m, "--system", system, "-p", user, "--temp", "0", "--json"]);
    assert_eq!(v["prompt_ids"], r["prompt_ids"]);
    assert_eq!(v["generated_ids"], r["generated_ids"]);

    // --verbose says which template formed the prompt and shows the rendered text.
    let out = minfer(&["run", "-m", &m, "-p", user, "-n", "1", "--temp", "0", "--verbose"]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("minfer: prompt: the model's chat template (tokenizer.chat_template), 1 message(s)"), "{err}");
    assert!(err.contains("<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n"), "{err}");
    let out = minfer(&["run", "-m", &m, "--raw", "-p", user, "-n", "1", "--temp", "0", "--verbose"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("minfer: prompt: raw text (--raw)"));
    // --system belongs to chat mode.
    let out = minfer(&["run", "-m", &m, "--raw", "--system", "s", "-p", "x"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--system"));
}

/// Prompts are data: a prompt starting with '-', `-p -` from a pipe, `-f FILE` and `-p @FILE`
/// reach the tokenizer byte for byte (leading spaces, CR LF, trailing newlines kept).
#[test]
fn prompts_that_start_with_a_dash_or_come_from_files_and_pipes() {
    let m = model();
    let dashed = "-- list the tables";
    let v = run_json(&["run", "-m", &m, "--raw", "-p", dashed, "-n", "1", "--temp", "0", "--json"]);
    let tokenized: serde_json::Value = serde_json::from_slice(&minfer(&["tokenize", "-m", &m, "--json", dashed]).stdout).unwrap();
    assert_eq!(v["prompt_ids"], tokenized);
    // Chat mode: the same ids as a --messages file with that user message.
    let dir = std::env::temp_dir().join(format!("minfer-prompts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let msgs = dir.join("m.json");
    std::fs::write(&msgs, serde_json::json!([{"role": "user", "content": dashed}]).to_string()).unwrap();
    let chat = run_json(&["run", "-m", &m, "-p", dashed, "-n", "1", "--temp", "0", "--json"]);
    let from_file = run_json(&["run", "-m", &m, "--messages", msgs.to_str().unwrap(), "-n", "1", "--temp", "0", "--json"]);
    assert_eq!(chat["prompt_ids"], from_file["prompt_ids"]);

    let text = "  two\r\nlines -x\n\n";
    let expect = run_json(&["run", "-m", &m, "--raw", "-p", text, "-n", "1", "--temp", "0", "--json"])["prompt_ids"].clone();
    let piped = minfer_stdin(&["run", "-m", &m, "--raw", "-p", "-", "-n", "1", "--temp", "0", "--json"], text.as_bytes());
    assert!(piped.status.success(), "{}", String::from_utf8_lossy(&piped.stderr));
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&piped.stdout).unwrap()["prompt_ids"], expect);
    let file = dir.join("-prompt.txt");
    std::fs::write(&file, text).unwrap();
    let f = file.to_str().unwrap();
    assert_eq!(run_json(&["run", "-m", &m, "--raw", "-f", f, "-n", "1", "--temp", "0", "--json"])["prompt_ids"], expect);
    assert_eq!(run_json(&["run", "-m", &m, "--raw", "-p", &format!("@{f}"), "-n", "1", "--temp", "0", "--json"])["prompt_ids"], expect);
    let piped = minfer_stdin(&["run", "-m", &m, "--raw", "-f", "-", "-n", "1", "--temp", "0", "--json"], text.as_bytes());
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&piped.stdout).unwrap()["prompt_ids"], expect);

    // Not UTF-8, a missing file, two sources: one line each, nothing generated.
    let bad = dir.join("bad.txt");
    std::fs::write(&bad, b"ok \xc3\x28").unwrap();
    let at_missing = format!("@{}", dir.join("missing.txt").display());
    let cases: [(Vec<&str>, &str); 3] = [
        (vec!["-f", bad.to_str().unwrap()], "is not UTF-8 text (invalid byte at byte 3)"),
        (vec!["-p", &at_missing], "missing.txt"),
        (vec!["-p", "x", "-f", f], "cannot be used with"),
    ];
    for (extra, what) in cases {
        let out = minfer(&[&["run", "-m", &m, "-n", "1"][..], &extra].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && out.stdout.is_empty(), "{extra:?}");
        assert!(err.contains(what), "{extra:?}: {err}");
    }
    let out = minfer_stdin(&["run", "-m", &m, "-p", "-", "-n", "1"], b"\xff\xfe");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.trim_end().lines().count() == 1 && err.contains("standard input is not UTF-8"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}
