//! Stable stand-in for the `cargo fuzz` target `http_request`
//! (fuzz/fuzz_targets/http_request.rs): thousands of mutated request bodies — byte-level
//! damage to the seed corpus (fuzz/seeds/http_request) and fields of the seeds set to hostile
//! values — plus 10^5-deep nesting, each read as a chat and as a completion request, must give
//! a request inside the documented bounds or an [`ApiError`] that is a one-line 4xx in the
//! OpenAI shape; never a panic or a stack overflow. Inputs under fuzz/regressions/http_request
//! (crashes the fuzzer found, once fixed) are replayed too.

use std::path::PathBuf;
use std::sync::OnceLock;

use minfer::server::ApiError;
use minfer::server::fields::parse_object;
use minfer::server::request::{Prompt, chat_request, completion_request};
use proptest::prelude::*;
use serde_json::{Value as Json, json};

#[path = "common/http_request_checks.rs"]
mod checks;
use checks::{check_error, exercise};

const QWEN_VOCAB: usize = 151_936;

fn fuzz_dir(sub: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz").join(sub).join("http_request")
}

/// The files of a directory, by name; none when it does not exist.
fn files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<(String, Vec<u8>)> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v
}

fn seeds() -> &'static Vec<(String, Vec<u8>)> {
    static SEEDS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let v = files(&fuzz_dir("seeds"));
        assert!(v.len() >= 10, "the seed corpus fuzz/seeds/http_request has {} files", v.len());
        v
    })
}

fn seed(name: &str) -> &'static [u8] {
    &seeds().iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("seed {name}")).1
}

/// The seeds read as written: the valid ones are accepted with their values, the broken ones
/// refused naming the first bad parameter. (Without this, mutating seeds that all fail early
/// would test little.)
#[test]
fn the_seeds_read_as_written() {
    let obj = |name: &str| parse_object(seed(name)).unwrap();
    // The OpenAI `param` of an error: a refused field or parameter.
    let param = |e: ApiError| e.to_json()["error"]["param"].as_str().unwrap_or_else(|| panic!("{e:?}")).to_string();
    let c = chat_request(&obj("chat_minimal.json"), QWEN_VOCAB, &Default::default()).unwrap();
    assert_eq!((c.messages.len(), c.messages[0].role.as_str()), (1, "user"));
    let c = chat_request(&obj("chat_sampling.json"), QWEN_VOCAB, &Default::default()).unwrap();
    assert_eq!((c.opts.max_tokens, c.opts.sampler.seed, c.opts.sampler.top_k), (Some(64), 42, 40));
    assert_eq!(c.opts.stop, ["\n\n", "END"]);
    let c = chat_request(&obj("chat_stream.json"), QWEN_VOCAB, &Default::default()).unwrap();
    assert!(c.opts.stream && c.opts.include_usage);
    assert_eq!(c.opts.max_tokens, Some(16));
    let c = chat_request(&obj("chat_tools.json"), QWEN_VOCAB, &Default::default()).unwrap();
    assert_eq!(c.messages[1].tool_calls.as_ref().unwrap()[0]["function"]["arguments"], json!({"city": "Paris"}));
    assert!(c.tools.is_some());
    let c = chat_request(&obj("chat_logit_bias.json"), QWEN_VOCAB, &Default::default()).unwrap();
    assert_eq!(c.opts.sampler.logit_bias, [(0, f32::NEG_INFINITY), (15, 2.5), (151_935, -1.0)]);
    assert_eq!((c.messages[0].role.as_str(), c.opts.n_probs), ("system", Some(5)));
    assert_eq!(c.messages[0].content, Some(json!("Part one.\nPart two.")));
    assert_eq!(param(chat_request(&obj("chat_logit_bias.json"), 1, &Default::default()).unwrap_err()), "logit_bias");
    let p = completion_request(&obj("completion_text.json"), QWEN_VOCAB, &Default::default()).unwrap();
    assert_eq!((p.prompt, p.echo, p.opts.stop), (Prompt::Text("def fib(n):".into()), true, vec!["\n\n".to_string()]));
    let p = completion_request(&obj("completion_ids.json"), QWEN_VOCAB, &Default::default()).unwrap();
    assert_eq!((p.prompt, p.opts.n_probs, p.opts.sampler.seed), (Prompt::Ids(vec![151_643, 8, 9, 10]), Some(3), u64::MAX));
    assert_eq!(param(completion_request(&obj("completion_ids.json"), 1000, &Default::default()).unwrap_err()), "prompt[0][0]");
    // `echo` is read before the generation options.
    assert_eq!(param(completion_request(&obj("completion_out_of_range.json"), QWEN_VOCAB, &Default::default()).unwrap_err()), "echo");
    // `n` is the first generation option read.
    assert_eq!(param(chat_request(&obj("mixed_errors.json"), QWEN_VOCAB, &Default::default()).unwrap_err()), "temperature");
    assert_eq!(param(chat_request(&obj("nested_garbage.json"), QWEN_VOCAB, &Default::default()).unwrap_err()), "messages[0].content[0]");
    assert_eq!(parse_object(seed("top_level_array.json")), Err(ApiError::NotAnObject));
    for (_, bytes) in seeds() {
        exercise(bytes);
    }
}

#[test]
fn regression_inputs_stay_fixed() {
    let found = files(&fuzz_dir("regressions"));
    for (name, bytes) in &found {
        println!("replaying regression {name} ({} bytes)", bytes.len());
        exercise(bytes);
    }
    println!("{} regression inputs replayed", found.len());
}

/// 10^5 levels of nesting, alone, inside a field and inside a message: serde_json's recursion
/// limit (128) turns each into a malformed-JSON error before the stack is at risk.
#[test]
fn deep_nesting_is_refused_by_the_json_parser() {
    let n = 100_000;
    let bodies = [
        "[".repeat(n),
        format!("{}{}", "[".repeat(n), "]".repeat(n)),
        format!("{}1{}", "{\"a\":".repeat(n), "}".repeat(n)),
        format!("{{\"messages\": {}", "[".repeat(n)),
        format!("{{\"messages\": [{{\"role\": \"user\", \"content\": {}\"x\"{}}}]}}", "[".repeat(n), "]".repeat(n)),
        format!("{{\"prompt\": \"x\", \"logit_bias\": {}1{}}}", "{\"1\":".repeat(n), "}".repeat(n)),
    ];
    for body in &bodies {
        match parse_object(body.as_bytes()) {
            Err(e @ ApiError::MalformedJson(_)) => {
                assert!(e.to_string().contains("recursion limit exceeded"), "{e}");
                check_error(&e);
            }
            other => panic!("{}...: {other:?}", &body[..40]),
        }
    }
    // Just under the limit, the whole body reaches the readers, which must cope with it.
    let depth = 120;
    let deep = format!("{}\"x\"{}", "[".repeat(depth), "]".repeat(depth));
    for body in [
        format!("{{\"messages\": [{{\"role\": \"user\", \"content\": {deep}}}], \"tools\": [{{\"f\": {deep}}}]}}"),
        format!("{{\"prompt\": {deep}, \"stop\": {deep}, \"chat_template_kwargs\": {{\"k\": {deep}}}}}"),
    ] {
        assert!(parse_object(body.as_bytes()).is_ok());
        exercise(body.as_bytes());
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    SetByte(usize, u8),
    FlipBit(usize, u8),
    Truncate(usize),
    /// Insert JSON-ish bytes: a token the parser cares about, or random bytes.
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
    /// Copy a slice of the body to another place (duplicates keys, nests structures).
    Splice { from: usize, len: usize, to: usize },
}

fn json_token() -> impl Strategy<Value = Vec<u8>> {
    let tokens: Vec<&'static [u8]> = vec![
        b"{", b"}", b"[", b"]", b",", b":", b"\"", b"\\", b"\\u", b"\\ud800", b"null", b"true", b"-", b"0", b"1e999",
        b"-1", b"18446744073709551616", b"9223372036854775808", b"1.5", b"\"messages\"", b"\"prompt\"", b"\"role\"",
        b"\"content\"", b"\"logit_bias\"", b"\"stop\"", b"\"tools\"", b"\xff", b"\x00",
    ];
    prop_oneof![
        prop::sample::select(tokens).prop_map(<[u8]>::to_vec),
        prop::collection::vec(any::<u8>(), 1..8),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let pos = any::<usize>();
    prop_oneof![
        (pos, any::<u8>()).prop_map(|(p, b)| Mutation::SetByte(p, b)),
        (pos, 0u8..8).prop_map(|(p, b)| Mutation::FlipBit(p, b)),
        pos.prop_map(Mutation::Truncate),
        (pos, json_token()).prop_map(|(p, b)| Mutation::Insert(p, b)),
        (pos, 1usize..16).prop_map(|(p, n)| Mutation::Remove(p, n)),
        (pos, 1usize..64, pos).prop_map(|(from, len, to)| Mutation::Splice { from, len, to }),
    ]
}

fn apply(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let len = b.len().max(1);
        match m {
            Mutation::SetByte(p, v) => {
                if let Some(x) = b.get_mut(p % len) {
                    *x = *v;
                }
            }
            Mutation::FlipBit(p, bit) => {
                if let Some(x) = b.get_mut(p % len) {
                    *x ^= 1 << bit;
                }
            }
            Mutation::Truncate(p) => b.truncate(p % (b.len() + 1)),
            Mutation::Insert(p, bytes) => {
                let p = p % (b.len() + 1);
                b.splice(p..p, bytes.iter().copied());
            }
            Mutation::Remove(p, n) => {
                let p = (p % len).min(b.len());
                let end = (p + n).min(b.len());
                b.drain(p..end);
            }
            Mutation::Splice { from, len: n, to } => {
                let from = (from % len).min(b.len());
                let piece: Vec<u8> = b[from..(from + n).min(b.len())].to_vec();
                let to = to % (b.len() + 1);
                b.splice(to..to, piece);
            }
        }
    }
    b
}

/// Field names both endpoints read, and those of a message.
const FIELDS: [&str; 32] = [
    "messages", "prompt", "temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "n", "stop",
    "seed", "logit_bias", "stream", "stream_options", "logprobs", "top_logprobs", "tools", "tool_choice",
    "response_format", "chat_template_kwargs", "echo", "suffix", "best_of", "repeat_penalty", "presence_penalty",
    "frequency_penalty", "repeat_last_n", "model", "user", "include_usage", "json_schema", "grammar",
];
const MESSAGE_FIELDS: [&str; 6] = ["role", "content", "tool_calls", "tool_call_id", "name", "type"];

/// Values chosen to sit on or past the readers' boundaries.
fn hostile_value() -> impl Strategy<Value = Json> {
    let fixed = vec![
        Json::Null,
        json!(true),
        json!(0),
        json!(-1),
        json!(1),
        json!(2),
        json!(20),
        json!(21),
        json!(-100),
        json!(100.000001),
        json!(-2.0000001),
        json!(1e300),
        json!(-1e300),
        json!(5e-324),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(u32::MAX),
        json!(u64::from(u32::MAX) + 1),
        json!(1.5),
        json!(""),
        json!("auto"),
        json!("none"),
        json!("text"),
        json!("user"),
        json!("x".repeat(2000)),
        json!("\u{0}\u{ffff}\u{1F600}"),
        json!([]),
        json!([[]]),
        json!([1, 2, 3]),
        json!([151_935, 151_936]),
        Json::from(vec!["a"; 17]),
        json!([null]),
        json!({}),
        json!({"type": "text"}),
        json!({"type": "text", "text": 1}),
        json!({"include_usage": "yes"}),
        json!({"0": -100}),
        json!({"-1": 1}),
        json!({"151936": 0}),
        json!({"1": f64::MAX}),
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]}]),
        json!([{"role": "assistant", "content": null, "tool_calls": [{"function": {"arguments": "{not json"}}]}]),
        json!([{"role": "assistant", "tool_calls": "x"}]),
        json!([{"id": 1, "type": "function", "function": {"name": null, "arguments": {"a": [1]}}}]),
    ];
    prop_oneof![
        4 => prop::sample::select(fixed),
        1 => any::<i64>().prop_map(Json::from),
        1 => any::<f64>().prop_map(Json::from),
        1 => "[a-z0-9 ]{0,12}".prop_map(Json::from),
    ]
}

#[derive(Debug, Clone)]
enum Edit {
    /// Set (or add) a top-level field.
    Field(usize, Json),
    /// Set a field of message `i` (when `messages` is an array of objects).
    MessageField(usize, usize, Json),
    Remove(usize),
    /// Add a field of an odd name (unknown, control characters, very long).
    OddField(usize, Json),
}

/// Names a client may send that no reader knows; some must never reach a message raw.
fn odd_names() -> [String; 6] {
    ["metadata".into(), "temperature\n".into(), "a\nb".into(), "\u{0}x".into(), "z".repeat(10_000), "\u{1b}[31mred".into()]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (0..FIELDS.len(), hostile_value()).prop_map(|(f, v)| Edit::Field(f, v)),
        2 => (any::<usize>(), 0..MESSAGE_FIELDS.len(), hostile_value()).prop_map(|(i, f, v)| Edit::MessageField(i, f, v)),
        1 => (0..FIELDS.len()).prop_map(Edit::Remove),
        1 => (0..odd_names().len(), hostile_value()).prop_map(|(f, v)| Edit::OddField(f, v)),
    ]
}

fn apply_edits(mut v: Json, edits: &[Edit]) -> Json {
    for e in edits {
        let Some(obj) = v.as_object_mut() else { return v };
        match e {
            Edit::Field(f, x) => {
                obj.insert(FIELDS[*f].to_string(), x.clone());
            }
            Edit::Remove(f) => {
                obj.remove(FIELDS[*f]);
            }
            Edit::OddField(f, x) => {
                obj.insert(odd_names()[*f].clone(), x.clone());
            }
            Edit::MessageField(i, f, x) => {
                if let Some(Json::Array(ms)) = obj.get_mut("messages")
                    && !ms.is_empty()
                {
                    let n = ms.len();
                    if let Some(m) = ms[i % n].as_object_mut() {
                        m.insert(MESSAGE_FIELDS[*f].to_string(), x.clone());
                    }
                }
            }
        }
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_seed_bytes_never_panic(seed in any::<prop::sample::Index>(), muts in prop::collection::vec(mutation(), 1..6)) {
        let (_, base) = &seeds()[seed.index(seeds().len())];
        exercise(&apply(base.clone(), &muts));
    }

    #[test]
    fn seeds_with_hostile_field_values_never_panic(seed in any::<prop::sample::Index>(), edits in prop::collection::vec(edit(), 1..5)) {
        let (_, base) = &seeds()[seed.index(seeds().len())];
        let Ok(v) = serde_json::from_slice::<Json>(base) else { return Ok(()) };
        let body = serde_json::to_vec(&apply_edits(v, &edits)).unwrap();
        exercise(&body);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..128), object in any::<bool>()) {
        let mut body = bytes;
        if object {
            body.insert(0, b'{');
        }
        exercise(&body);
    }
}
