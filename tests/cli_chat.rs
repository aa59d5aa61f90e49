//! `minfer chat` end to end: scripted through a pipe (turns, /stats, /reset, /save, /load, the
//! corrupt-session cases) and through tmux (a terminal: streaming, Ctrl-C, commands).

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

struct Run {
    stdout: String,
    stderr: String,
}

/// `minfer chat` (greedy, 2 threads, at most `n` tokens per answer) on `model` with `input`
/// piped in.
fn chat_n(model: &Path, input: &str, n: usize) -> Run {
    chat_with(model, input, n, "f32")
}

fn chat_with(model: &Path, input: &str, n: usize, cache_type: &str) -> Run {
    run_chat(model, input.as_bytes().to_vec(), n, cache_type)
}

fn chat_bytes(model: &Path, input: Vec<u8>) -> Run {
    run_chat(model, input, 32, "f32")
}

fn run_chat(model: &Path, input: Vec<u8>, n: usize, cache_type: &str) -> Run {
    run_chat_args(model, input, n, &["--cache-type", cache_type])
}

fn run_chat_args(model: &Path, input: Vec<u8>, n: usize, extra: &[&str]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["chat", "-m", model.to_str().unwrap(), "--temp", "0", "-t", "2", "-n", &n.to_string(), "--ctx", "1024"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Run { stdout: String::from_utf8(out.stdout).unwrap(), stderr: String::from_utf8(out.stderr).unwrap() }
}

fn chat(model: &Path, input: &str) -> Run {
    chat_n(model, input, 32)
}

/// llama.cpp's greedy record for "What is 12 * 7? Answer with the number only.": its prompt
/// and generated ids (tests/data/qwen2.5-0.5b.greedy.jsonl).
fn chat_math() -> (usize, usize, String) {
    let text = std::fs::read_to_string(common::data_path("qwen2.5-0.5b.greedy.jsonl")).unwrap();
    let r: serde_json::Value = text.lines().map(|l| serde_json::from_str(l).unwrap()).find(|v: &serde_json::Value| v["id"] == "chat_math").unwrap();
    let n = |k: &str| r[k].as_array().unwrap().len();
    (n("prompt_ids"), n("generated_ids"), r["generated_text"].as_str().unwrap().to_string())
}

const MATH: &str = "What is 12 * 7? Answer with the number only.";

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("minfer-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn stats_line(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("context: ")).collect()
}

#[test]
fn piped_turns_stats_and_reset() {
    let m = common::model_path(common::QWEN2_05B);
    let r = chat(&m, &format!("{MATH}\n/stats\n/reset\n/stats\n/exit\nnever read\n"));
    // a session saved before the first turn loads back; a line that is not UTF-8 is refused
    let empty = tmp("empty.kv");
    let e = chat_bytes(&m, format!("/save {0}\n/load {0}\n", empty.display()).as_bytes().iter().chain(b"\xff\xfe\n/stats\n").copied().collect());
    assert!(e.stderr.contains("loaded 0 tokens"), "{}", e.stderr);
    assert!(e.stderr.contains("error: the line is not valid UTF-8"), "{}", e.stderr);
    assert!(stats_line(&e.stdout)[0].starts_with("context: 0 / 1024"));
    let lines: Vec<&str> = r.stdout.lines().collect();
    let (n_prompt, n_generated, answer) = chat_math();
    assert_eq!(lines[0], answer, "{}", r.stdout);
    let stats = stats_line(&r.stdout);
    assert_eq!(stats.len(), 2, "{}", r.stdout);
    // the prompt, then the answer's tokens but the last (<|im_end|>: sampled, never evaluated)
    let context = format!("context: {} / 1024 tokens", n_prompt + n_generated - 1);
    assert!(stats[0].starts_with(&context), "{} vs {context}", stats[0]);
    assert!(stats[0].contains(&format!("last prefill: {n_prompt} tokens")), "{}", stats[0]);
    assert!(stats[1].starts_with("context: 0 / 1024 tokens"), "{}", stats[1]);
    assert!(r.stderr.contains("conversation reset"));
    assert!(!r.stdout.contains("never"));
    // progress bars are for terminals only
    assert!(!r.stderr.contains("loading [") && !r.stderr.contains("prefill ["), "{}", r.stderr);
}

#[test]
fn a_saved_session_continues_in_a_new_process_as_if_never_stopped() {
    let m = common::model_path(common::QWEN2_05B);
    let file = tmp("s.kv");
    let f = file.to_str().unwrap();
    let turns = "My name is Ada and I like green tea.\nWhat is my name?\n";
    let last = "What do I like to drink?\n";
    let whole = chat(&m, &format!("{turns}/save {f}\n{last}/stats\n"));
    let resumed = chat(&m, &format!("/load {f}\n{last}/stats\n"));
    let answer = |r: &Run| r.stdout.lines().rfind(|l| !l.starts_with("context: ")).unwrap().to_string();
    assert_eq!(answer(&resumed), answer(&whole), "whole:\n{}\nresumed:\n{}", whole.stdout, resumed.stdout);
    assert!(resumed.stderr.contains("loaded"), "{}", resumed.stderr);
    // the resumed turn prefilled only the new turn, like the uninterrupted one
    let prefill = |r: &Run| stats_line(&r.stdout)[0].split("last prefill: ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    assert_eq!(prefill(&resumed), prefill(&whole));
    assert!(prefill(&whole).parse::<usize>().unwrap() < 30);
    std::fs::remove_file(file).ok();
}

#[test]
fn a_q8_0_session_continues_in_a_q8_0_engine_and_is_refused_by_an_f32_one() {
    let m = common::model_path(common::QWEN2_05B);
    let file = tmp("q8.kv");
    let f = file.to_str().unwrap();
    let last = "What is my name?\n";
    let whole = chat_with(&m, &format!("My name is Ada.\n/save {f}\n{last}"), 32, "q8_0");
    let resumed = chat_with(&m, &format!("/load {f}\n{last}"), 32, "q8_0");
    assert_eq!(resumed.stdout.lines().last(), whole.stdout.lines().last(), "{}\n{}", whole.stdout, resumed.stdout);
    assert!(resumed.stderr.contains("loaded"), "{}", resumed.stderr);
    let refused = chat_with(&m, &format!("/load {f}\n"), 32, "f32");
    assert!(refused.stderr.contains("error: ") && refused.stderr.contains("q8_0"), "{}", refused.stderr);
    std::fs::remove_file(file).ok();
}

#[test]
fn corrupt_sessions_are_refused_and_the_conversation_goes_on() {
    let m = common::model_path(common::QWEN2_05B);
    let good = tmp("good.kv");
    chat(&m, &format!("Say hello.\n/save {}\n", good.display()));
    let bytes = std::fs::read(&good).unwrap();
    let write = |name: &str, b: &[u8]| {
        let p = tmp(name);
        std::fs::write(&p, b).unwrap();
        p
    };
    let mut flipped = bytes.clone();
    let mid = bytes.len() / 2;
    flipped[mid] ^= 0x40;
    let mut version = bytes.clone();
    version[8] = 99;
    let other_model = tmp("tiny.kv");
    chat_n(&common::model_path(common::QWEN3_TINY), &format!("hi\n/save {}\n", other_model.display()), 2);
    let (n_prompt, n_generated, _) = chat_math();
    let context = format!("context: {} / 1024", n_prompt + n_generated - 1);
    let cases = [
        (write("trunc.kv", &bytes[..bytes.len() - 100]), "checksum"),
        (write("short.kv", &bytes[..6]), "not a minfer session"),
        (write("flip.kv", &flipped), "checksum"),
        (write("version.kv", &version), "version 99"),
        (write("junk.kv", b"just some text, not a session"), "not a minfer session"),
        (other_model, "another model"),
        (tmp("missing.kv"), "No such file"),
    ];
    for (file, why) in cases {
        // a turn, the bad load, then the conversation must still be the one before the load
        let r = chat(&m, &format!("{MATH}\n/load {}\n/stats\n", file.display()));
        assert!(r.stderr.lines().any(|l| l.starts_with("error: ") && l.contains(why)), "{why}: {}", r.stderr);
        let stats = stats_line(&r.stdout);
        assert!(stats[0].starts_with(&context), "{why}: {}", stats[0]);
    }
}

/// A real terminal: tmux runs `minfer chat`; keys are typed with send-keys, the screen read
/// with capture-pane.
#[test]
fn tmux_session_streams_and_obeys_commands() {
    let m = common::model_path(common::QWEN2_05B);
    let name = format!("minfer-chat-test-{}", std::process::id());
    let tmux = |args: &[&str]| {
        let out = Command::new("tmux").args(args).output().expect("tmux is needed for this test (apt-get install tmux)");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let screen = || tmux(&["capture-pane", "-p", "-t", &name, "-S", "-200"]);
    let wait_for = |what: &dyn Fn(&str) -> bool, secs: u64| -> String {
        let t0 = std::time::Instant::now();
        loop {
            let s = screen();
            if what(&s) {
                return s;
            }
            assert!(t0.elapsed().as_secs() < secs, "timed out; screen:\n{s}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let cmd = format!("{} chat -m {} --temp 0 -t 2 --ctx 1024", env!("CARGO_BIN_EXE_minfer"), m.display());
    tmux(&["new-session", "-d", "-s", &name, "-x", "200", "-y", "50", &cmd]);
    // The session (and minfer in it) goes away even when an assertion fails.
    struct Kill(String);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = Command::new("tmux").args(["kill-session", "-t", &self.0]).stderr(Stdio::null()).status();
        }
    }
    let _kill = Kill(name.clone());
    // capture-pane trims trailing spaces: the prompt "> " shows as ">"
    wait_for(&|s| s.lines().any(|l| l == ">"), 60);
    tmux(&["send-keys", "-t", &name, "Write a long story about a dragon.", "Enter"]);
    // streaming: text appears while the answer is still being generated, then Ctrl-C stops it
    let partial = wait_for(&|s| s.lines().any(|l| l.split_whitespace().count() >= 5 && !l.starts_with('>') && !l.starts_with("minfer")), 60);
    tmux(&["send-keys", "-t", &name, "C-c"]);
    let stopped = wait_for(&|s| s.contains("[stopped]"), 30);
    // the answer had been shown in pieces before it ended
    assert!(stopped.len() >= partial.len());
    tmux(&["send-keys", "-t", &name, "/stats", "Enter"]);
    let s = wait_for(&|s| s.contains("context: "), 30);
    assert!(s.contains("turns: 1"), "{s}");
    tmux(&["send-keys", "-t", &name, "/reset", "Enter"]);
    wait_for(&|s| s.contains("conversation reset"), 30);
    tmux(&["send-keys", "-t", &name, "/stats", "Enter"]);
    wait_for(&|s| s.contains("context: 0 / 1024"), 30);
    tmux(&["send-keys", "-t", &name, "/exit", "Enter"]);
    // the session ends with the program
    let t0 = std::time::Instant::now();
    while Command::new("tmux").args(["has-session", "-t", &name]).stderr(Stdio::null()).status().unwrap().success() {
        assert!(t0.elapsed().as_secs() < 10, "minfer chat did not exit:\n{}", screen());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `--draft`: the random-weight Qwen3 fixture drafts for the 0.5B (same vocabulary, most drafts
/// rejected). The answers of a three-turn conversation are those of plain decoding, the KV
/// holds what plain decoding leaves there, and `/stats` reports the last answer's drafts.
#[test]
fn speculative_answers_equal_plain_answers() {
    let m = common::model_path(common::QWEN2_05B);
    let tiny = common::model_path(common::QWEN3_TINY);
    let input = format!("My name is Ada.\n/stats\nWhat is my name?\n/stats\n{MATH}\n/stats\n");
    let plain = chat_n(&m, &input, 24);
    let spec = run_chat_args(&m, input.clone().into_bytes(), 24, &["--draft", tiny.to_str().unwrap(), "--draft-n", "3"]);
    let answers = |r: &Run| r.stdout.lines().filter(|l| !l.starts_with("context: ") && !l.starts_with("last answer's draft: ")).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(answers(&spec), answers(&plain), "plain:\n{}\nspeculative:\n{}", plain.stdout, spec.stdout);
    let context = |l: &str| l.split(" / ").next().unwrap().to_string();
    let (ps, ss) = (stats_line(&plain.stdout), stats_line(&spec.stdout));
    assert_eq!(ps.len(), 3);
    for (p, s) in ps.iter().zip(&ss) {
        assert_eq!(context(p), context(s), "{p} vs {s}");
    }
    let drafts: Vec<&str> = spec.stdout.lines().filter(|l| l.starts_with("last answer's draft: ")).collect();
    assert_eq!(drafts.len(), 3, "{}", spec.stdout);
    assert!(drafts.iter().all(|l| l.contains("drafted") && l.contains("accepted")), "{drafts:?}");
}
