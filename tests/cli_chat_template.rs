//! A model without a chat template (Gemma-3-270M has none in its file): `chat` and chat-mode
//! `run` refuse with one line saying what to do, a raw `run -p` says on stderr that it
//! continues raw text, and `--chat-template FILE` gives the model a template on `template`,
//! `run` and `chat` (the server's flag is tested in `tests/server_openai.rs`).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

const NO_TEMPLATE: &str = "minfer: error: this model has no chat template; use --chat-template FILE or a raw prompt";

fn gemma() -> String {
    common::model_path(common::GEMMA3).to_str().expect("utf-8 path").to_string()
}

fn gemma_template() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/examples/chat-templates/gemma3.jinja").to_string()
}

fn minfer(args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run minfer");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
    child.wait_with_output().expect("minfer exits")
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn messages_file(name: &str, json: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("minfer-{}-{name}.json", std::process::id()));
    std::fs::write(&p, json).expect("write messages");
    p
}

#[test]
fn chat_and_chat_mode_run_refuse_without_a_template() {
    let m = gemma();
    let o = minfer(&["chat", "-m", &m, "-t", "2"], "hello\n");
    assert!(!o.status.success());
    assert_eq!(stderr(&o).trim_end(), NO_TEMPLATE);
    let msgs = messages_file("refuse", r#"[{"role": "user", "content": "hi"}]"#);
    let o = minfer(&["run", "-m", &m, "--messages", msgs.to_str().unwrap(), "-n", "1"], "");
    assert!(!o.status.success());
    assert_eq!(stderr(&o).trim_end(), NO_TEMPLATE);
    std::fs::remove_file(msgs).ok();
    // A template file that is not there is its own error, naming the file.
    let o = minfer(&["chat", "-m", &m, "--chat-template", "/nonexistent/t.jinja"], "");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot read the chat template /nonexistent/t.jinja"), "{}", stderr(&o));
}

#[test]
fn raw_run_says_it_continues_raw_text() {
    let o = minfer(&["run", "-m", &gemma(), "-p", "The capital of France is", "-n", "4", "--temp", "0", "-t", "2"], "");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("this model has no chat template: continuing the prompt as raw text"), "{}", stderr(&o));
    assert!(!o.stdout.is_empty());
}

#[test]
fn a_template_file_renders_and_chats() {
    let (m, t) = (gemma(), gemma_template());
    let msgs = messages_file(
        "render",
        r#"[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]"#,
    );
    let o = minfer(&["template", "-m", &m, "--messages", msgs.to_str().unwrap(), "--chat-template", &t], "");
    assert!(o.status.success(), "{}", stderr(&o));
    let want = "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n\
                <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n";
    assert_eq!(String::from_utf8_lossy(&o.stdout), want);
    // run: the rendered turns, BOS first (the tokenizer adds it), special tokens parsed.
    let o = minfer(&["run", "-m", &m, "--messages", msgs.to_str().unwrap(), "--chat-template", &t, "-n", "2", "--temp", "0", "--json"], "");
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let ids: Vec<u64> = v["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(ids[0], 2, "BOS");
    assert_eq!(ids.iter().filter(|&&i| i == 105).count(), 4, "four <start_of_turn> tokens: {ids:?}");
    assert_eq!(ids.iter().filter(|&&i| i == 106).count(), 3, "three <end_of_turn> tokens: {ids:?}");
    // chat: one turn through the REPL, answered.
    let o = minfer(&["chat", "-m", &m, "--chat-template", &t, "-n", "4", "--temp", "0", "-t", "2"], "Hi\n");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!o.stdout.is_empty());
    std::fs::remove_file(msgs).ok();
}
