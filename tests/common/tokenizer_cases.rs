//! Shared checks of a real model's tokenizer against llama.cpp's reference ids
//! (`tests/data/*.tokenizer.jsonl`: `{"text", "parse_special", "ids"}` per line, produced by
//! llama.cpp's tokenize without BOS) and its greedy prompts (`*.greedy.jsonl`).

use minfer::gguf::GgufFile;
use minfer::tokenizer::Tokenizer;

/// One line of a reference file.
pub struct Case {
    pub text: String,
    pub parse_special: bool,
    pub ids: Vec<u32>,
}

/// The tokenizer of test model `name`; a missing model file fails the test.
pub fn load_tokenizer(name: &str) -> Tokenizer {
    let path = super::model_path(name);
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("cannot build the tokenizer of {}: {e}", path.display()))
}

fn read_jsonl(name: &str) -> Vec<serde_json::Value> {
    let path = super::data_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .enumerate()
        .map(|(n, line)| serde_json::from_str(line).unwrap_or_else(|e| panic!("{name} line {}: {e}", n + 1)))
        .collect()
}

fn ids_of(v: &serde_json::Value, what: &str) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("{what}: not an array"))
        .iter()
        .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()).unwrap_or_else(|| panic!("{what}: bad id {x}")))
        .collect()
}

fn str_of<'v>(v: &'v serde_json::Value, key: &str, what: &str) -> &'v str {
    v.get(key).and_then(|x| x.as_str()).unwrap_or_else(|| panic!("{what}: no string {key:?}"))
}

/// The lines of `tests/data/<name>`.
pub fn load_cases(name: &str) -> Vec<Case> {
    read_jsonl(name)
        .iter()
        .enumerate()
        .map(|(n, v)| {
            let what = format!("{name} line {}", n + 1);
            Case {
                text: str_of(v, "text", &what).to_owned(),
                parse_special: v.get("parse_special").and_then(|x| x.as_bool()).unwrap_or_else(|| panic!("{what}: parse_special")),
                ids: ids_of(v.get("ids").unwrap_or(&serde_json::Value::Null), &what),
            }
        })
        .collect()
}

/// Encodes every line with its `parse_special` and compares with llama.cpp's ids; fails with
/// every differing line. Returns the number of matching lines with `parse_special` false and true.
pub fn check_every_line(tok: &Tokenizer, cases: &[Case]) -> (usize, usize) {
    let mut failures = Vec::new();
    let mut matched = (0, 0);
    for (n, case) in cases.iter().enumerate() {
        let got = tok.encode(&case.text, case.parse_special);
        if got == case.ids {
            if case.parse_special { matched.1 += 1 } else { matched.0 += 1 }
        } else {
            failures.push(format!(
                "line {} {:?} (parse_special={}):\n  want {:?}\n  got  {:?}",
                n + 1,
                case.text,
                case.parse_special,
                case.ids,
                got
            ));
        }
    }
    assert!(failures.is_empty(), "{} of {} lines differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
    println!("matched {} lines with parse_special=false, {} with parse_special=true", matched.0, matched.1);
    matched
}

/// `decode`, `detokenize` and the stream decoder give each reference text back from its ids.
pub fn check_round_trip(tok: &Tokenizer, cases: &[Case]) {
    for case in cases {
        let decoded = tok.decode(&case.ids).unwrap_or_else(|e| panic!("{:?}: {e}", case.text));
        assert_eq!(decoded, case.text, "decode");
        let detok = tok.detokenize(&case.ids, true).unwrap_or_else(|e| panic!("{:?}: {e}", case.text));
        assert_eq!(detok, case.text, "detokenize");
        let mut stream = tok.stream_decoder();
        let mut text = String::new();
        for &id in &case.ids {
            let part = stream.push(id).unwrap_or_else(|e| panic!("{e}"));
            assert!(!part.contains(char::REPLACEMENT_CHARACTER), "{:?}: U+FFFD emitted", case.text);
            text.push_str(&part);
        }
        assert!(stream.pending_bytes().is_empty(), "{:?}: bytes left over", case.text);
        text.push_str(&stream.flush());
        assert_eq!(text, case.text, "stream");
        let via_bytes = tok.encode_bytes(case.text.as_bytes(), case.parse_special).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(via_bytes, case.ids, "encode_bytes {:?}", case.text);
    }
}

/// The prompts of `tests/data/<name>` (a greedy reference file): `encode_prompt` gives llama.cpp's
/// prompt ids (BOS included where the model asks for it), and the generated ids decode, without
/// special tokens, to llama.cpp's generated text. Returns the number of prompts.
pub fn check_greedy_prompts(tok: &Tokenizer, name: &str) -> usize {
    let lines = read_jsonl(name);
    for (n, v) in lines.iter().enumerate() {
        let what = format!("{name} line {}", n + 1);
        let prompt = str_of(v, "prompt_text", &what);
        let want = ids_of(v.get("prompt_ids").unwrap_or(&serde_json::Value::Null), &what);
        assert_eq!(tok.encode_prompt(prompt, true), want, "{what}: prompt {prompt:?}");
        let generated = ids_of(v.get("generated_ids").unwrap_or(&serde_json::Value::Null), &what);
        let text = tok.decode_with(&generated, false).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(text, str_of(v, "generated_text", &what), "{what}: generated text");
    }
    lines.len()
}
