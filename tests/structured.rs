//! Structured output in the generation loop, against independent references:
//!
//! * the mask: for a small grammar, the tokens allowed at each step are exactly those whose
//!   bytes a string of the grammar's (finite, listed here) language continues with;
//! * schema errors: each invalid schema is refused at the place written here by hand;
//! * generation: greedy and sampled answers under a schema validate with the `jsonschema`
//!   crate, and speculative decoding (drafts that break the grammar are rejected) gives the
//!   plain constrained greedy tokens, one for one.

mod common;

use std::sync::Arc;

use minfer::generate::{Constraint, DraftParams, Engine, EngineParams, EngineShared, GenerateParams, SamplerParams, Speculator, generate, generate_speculative};
use minfer::gguf::GgufFile;
use minfer::grammar::{GrammarError, GrammarSpec, GrammarVocab};
use minfer::models::{Model, load_model};
use minfer::tokenizer::Tokenizer;
use proptest::prelude::*;
use serde_json::{Value as Json, json};

fn load() -> (Arc<Model>, Arc<Tokenizer>) {
    let f = GgufFile::open(common::model_path(common::QWEN2_05B)).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    (Arc::new(load_model(Arc::new(f)).unwrap()), Arc::new(tok))
}

fn tokenizer() -> Arc<Tokenizer> {
    let f = GgufFile::open(common::model_path(common::QWEN2_05B)).unwrap();
    Arc::new(Tokenizer::from_gguf(&f).unwrap())
}

#[test]
fn the_mask_allows_exactly_the_continuations_of_the_language() {
    let tok = tokenizer();
    let vocab = Arc::new(GrammarVocab::new(tok.clone()).unwrap());
    // A finite language, listed: every allowed token must be a prefix of what is left of one
    // of these strings, and every such token must be allowed. Every step branches (a grammar
    // that forces bytes gets their canonical token only, which this reference does not model).
    let language: Vec<String> =
        (0..10).flat_map(|a| ["x", "yz"].into_iter().flat_map(move |m| (0..10).map(move |b| format!("{a}{m}{b}")))).collect();
    let language: Vec<&str> = language.iter().map(String::as_str).collect();
    let target = "7yz3";
    let g = GrammarSpec::Gbnf("root ::= [0-9] (\"x\" | \"yz\") [0-9]\n".into()).compile(&vocab).unwrap();
    let mut c = Constraint::new(&g).unwrap();
    let n = tok.n_vocab();
    let eog = tok.eog_ids();
    let mut done = String::new();
    for step in 0.. {
        let mut logits = vec![0.0f32; n];
        c.apply(&mut logits).unwrap();
        let allowed: Vec<u32> = (0..n as u32).filter(|&i| logits[i as usize] == 0.0).collect();
        let complete = language.contains(&done.as_str());
        let expect: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                if eog.contains(&id) {
                    return complete;
                }
                if tok.is_control(id) {
                    return false;
                }
                let b = tok.token_bytes(id).unwrap();
                !b.is_empty() && language.iter().any(|s| s.as_bytes().starts_with(done.as_bytes()) && s.as_bytes()[done.len()..].starts_with(b))
            })
            .collect();
        assert_eq!(allowed, expect, "step {step}, after {done:?}");
        if complete {
            break;
        }
        // Walk towards the target one token at a time, the shortest allowed token first.
        let next = *allowed.iter().filter(|&&id| target[done.len()..].as_bytes().starts_with(tok.token_bytes(id).unwrap())).min_by_key(|&&id| tok.token_bytes(id).unwrap().len()).unwrap();
        done.push_str(std::str::from_utf8(tok.token_bytes(next).unwrap()).unwrap());
        c.commit(next).unwrap();
        assert!(step < 10);
    }
    assert_eq!(done, target);
    // A token committed before the first mask was read: the next mask is the one after it (the
    // first mask, now stale, is dropped): "x" or "yz" next, no digit.
    let mut c = Constraint::new(&g).unwrap();
    for id in tok.encode("7", false) {
        c.commit(id).unwrap();
    }
    let mut logits = vec![0.0f32; n];
    c.apply(&mut logits).unwrap();
    let allowed: Vec<&[u8]> = (0..n as u32).filter(|&i| logits[i as usize] == 0.0).map(|i| tok.token_bytes(i).unwrap()).collect();
    assert!(allowed.len() >= 2 && allowed.iter().all(|b| b[0] == b'x' || b[0] == b'y'), "{allowed:?}");
}

#[test]
fn invalid_schemas_are_refused_at_their_place() {
    let vocab = Arc::new(GrammarVocab::new(tokenizer()).unwrap());
    let cases: Vec<(Json, &str, &str)> = vec![
        (json!({"type": "object", "properties": {"age": {"type": "integr"}}}), "properties.age.type", "integr"),
        (json!({"properties": {"a": {"minimum": 4, "maximum": 3}}}), "properties.a.minimum", "greater than maximum"),
        (json!({"type": "array", "uniqueItems": true}), "uniqueItems", "'uniqueItems' cannot be enforced"),
        (json!({"anyOf": [{"type": "string"}, {"if": {}}]}), "anyOf[1].if", "'if' cannot be enforced"),
        (json!({"type": "object", "nullable": true}), "nullable", "unknown keyword 'nullable'"),
        (json!({"format": "phone"}), "format", "'phone'"),
        (json!({"$defs": {"p": {"type": "strin"}}, "$ref": "#/$defs/p"}), "$defs.p.type", "strin"),
        (json!({"properties": {"t": {"items": {"pattern": "(x"}}}}), "properties.t.items", "unclosed group"),
        (json!({"properties": {"x": {"$ref": "#/$defs/none"}}}), "properties.x", "does not exist"),
        (json!({"prefixItems": [{"type": "string"}, 3]}), "prefixItems[1]", "must be an object or a boolean"),
        // The old tuple form is read as prefixItems (llama-server reads it so); its parts are
        // checked at their new place.
        (json!({"items": [{"type": "strin"}]}), "prefixItems[0].type", "strin"),
        (json!({"minLength": -1}), "minLength", "non-negative integer"),
        (json!({"exclusiveMinimum": 1, "exclusiveMaximum": 1}), "exclusiveMinimum", "not below"),
        (json!(false), "", "accepts no value"),
        (json!({"oneOf": [{"type": "object"}, {"type": "object"}], "x-guidance": {"coerce_one_of": true}}), "x-guidance.coerce_one_of", "would change what is enforced"),
        (json!({"type": "object", "x-guidance": {"lenient": true}}), "x-guidance.lenient", "would change what is enforced"),
    ];
    for (schema, path, says) in cases {
        match GrammarSpec::JsonSchema(schema.clone()).compile(&vocab) {
            Err(GrammarError::Schema { path: p, message }) => {
                assert_eq!(p, path, "{schema}: {message}");
                assert!(message.contains(says), "{schema}: {message}");
                assert!(!message.contains('\n'), "{message}");
            }
            other => panic!("{schema}: {other:?}"),
        }
    }
    // Annotations are fine, and so is every enforced keyword.
    let ok = json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "t", "description": "d", "type": "object",
        "properties": {"a": {"type": "string", "format": "date", "default": "2020-01-01", "examples": ["x"]}}, "required": ["a"]});
    GrammarSpec::JsonSchema(ok).compile(&vocab).unwrap();
    GrammarSpec::JsonSchema(json!({"type": "object", "x-guidance": {"whitespace_flexible": true}})).compile(&vocab).unwrap();
    GrammarSpec::JsonSchema(json!({"items": [{"type": "integer"}], "additionalItems": false})).compile(&vocab).unwrap();
}

/// Feeds `text`'s tokens to `c`, each only if the mask allows it: whether all were allowed.
fn walk(c: &mut Constraint, tok: &Tokenizer, text: &str) -> bool {
    for id in tok.encode(text, false) {
        let mut logits = vec![0.0f32; tok.n_vocab()];
        if c.apply(&mut logits).is_err() || logits[id as usize] != 0.0 {
            return false;
        }
        c.commit(id).unwrap();
    }
    true
}

/// GBNF read as llama.cpp reads it, character by character: texts that a greedy lexer would
/// refuse are produced, and the odd corners compile.
#[test]
fn gbnf_follows_llama_cpp() {
    let tok = tokenizer();
    let vocab = Arc::new(GrammarVocab::new(tok.clone()).unwrap());
    // Walks `text` through the grammar token by token (the tokenizer's tokens), then asks
    // whether the grammar may end there.
    let accepts = |g: &str, text: &str| -> bool {
        let grammar = GrammarSpec::Gbnf(g.into()).compile(&vocab).unwrap_or_else(|e| panic!("{g:?}: {e}"));
        let mut c = Constraint::new(&grammar).unwrap();
        let ok = walk(&mut c, &tok, text);
        let mut logits = vec![0.0f32; tok.n_vocab()];
        ok && c.apply(&mut logits).is_ok() && tok.eog_ids().iter().any(|&e| logits[e as usize] == 0.0)
    };
    let g = "root ::= \"a\" \"b\" | \"ab\" \"c\"\n";
    assert!(accepts(g, "ab") && accepts(g, "abc") && !accepts(g, "abb"));
    let g = "root ::= [^] \"x\"{0} \"y\" *\n";
    assert!(accepts(g, "?yy") && accepts(g, "\n") && !accepts(g, "?x"));
    let g = "root ::= (\"a\"?)+ \"\\x7f\"\n";
    assert!(accepts(g, "aa\u{7f}") && accepts(g, "\u{7f}"));
    // A language with no text at all is refused when compiled, not mid-answer.
    assert!(GrammarSpec::Gbnf("root ::= root \"a\"\n".into()).compile(&vocab).is_err());
}

const SCHEMA: &str = r#"{"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 30},
    "born": {"type": "integer", "minimum": 1000, "maximum": 2100},
    "fields": {"type": "array", "items": {"enum": ["math", "physics", "poetry", "computing"]}, "minItems": 1, "maxItems": 3},
    "alive": {"type": "boolean"}},
  "required": ["name", "born", "fields", "alive"], "additionalProperties": false}"#;

fn chat_prompt(tok: &Tokenizer, q: &str) -> Vec<u32> {
    tok.encode_prompt(&format!("<|im_start|>system\nAnswer with JSON.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"), true)
}

#[test]
fn constrained_answers_validate_and_speculation_keeps_them() {
    let (model, tok) = load();
    let schema: Json = serde_json::from_str(SCHEMA).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let vocab = Arc::new(GrammarVocab::new(tok.clone()).unwrap());
    let grammar = GrammarSpec::JsonSchema(schema.clone()).compile(&vocab).unwrap();
    let mut engine = Engine::new(model.clone(), &EngineParams { n_ctx: 1024, n_threads: 2, ..EngineParams::default() }).unwrap();
    let params = |sampler| GenerateParams { max_tokens: 200, sampler, stop: vec![], ubatch: None, n_probs: None, post_sampling_probs: false, grammar: Some(grammar.clone()) };
    let prompts = ["Describe Ada Lovelace.", "Describe Alan Turing.", "Describe a poet you like."];
    let mut greedy = Vec::new();
    for q in prompts {
        let ids = chat_prompt(&tok, q);
        for sampler in [SamplerParams::greedy(), SamplerParams { temperature: 1.0, seed: 7, ..SamplerParams::default() }] {
            engine.kv_rm(0, engine.n_past()).unwrap();
            let g = generate(&mut engine, &tok, &ids, &params(sampler.clone()), &mut |_| Ok(())).unwrap();
            let v: Json = serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("{q}: {e}: {:?}", g.text));
            assert!(validator.is_valid(&v), "{q}: {}", g.text);
            if sampler.temperature == 0.0 {
                greedy.push((ids.clone(), g.generated_ids));
            }
        }
    }
    // The draft is the same model unconstrained: wherever the grammar masks its argmax, its
    // proposal is rejected; the emitted tokens are still the plain constrained greedy ones.
    let shared = EngineShared::with_pool(&model, engine.pool().clone()).unwrap();
    let dp = EngineParams { n_ctx: 1024, n_threads: 1, ..EngineParams::default() };
    let mut spec = Speculator::new(Engine::with_shared(model.clone(), &dp, &shared).unwrap(), DraftParams { n_draft: 6, p_min: 0.0 }).unwrap();
    let mut rejected = 0;
    for (ids, want) in &greedy {
        engine.kv_rm(0, engine.n_past()).unwrap();
        let g = generate_speculative(&mut engine, &mut spec, &tok, ids, &params(SamplerParams::greedy()), &mut |_| Ok(())).unwrap();
        assert_eq!(&g.generated_ids, want);
        rejected += spec.stats().drafted - spec.stats().accepted;
    }
    assert!(rejected > 0, "no draft broke the grammar: the rejection path was not exercised");
}

/// GBNF pieces the generator below strings together: the translator must answer every
/// combination with a grammar or a placed error, never a panic.
const GBNF_PIECES: &[&str] = &[
    "root", " ::= ", "::=", "\"a\"", "\"", "[a-z]", "[^\"\\\\]", "[", "]", "(", ")", "|", "*", "+", "?", "{2,3}", "{", "}",
    "{3,1}", "x-y", "\n", " ", "#c\n", "\\x4", "\\u00e9", "\\", ".", "-", "é", "\t",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn gbnf_translation_never_panics(pieces in proptest::collection::vec(0..GBNF_PIECES.len(), 0..24), bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
        let text: String = pieces.iter().map(|&i| GBNF_PIECES[i]).collect();
        let _ = minfer::grammar::gbnf_to_lark(&text);
        let _ = minfer::grammar::gbnf_to_lark(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn schema_checking_never_panics(v in json_value()) {
        let _ = GrammarSpec::check_schema(&v);
    }
}

fn json_value() -> impl Strategy<Value = Json> {
    let keys = prop_oneof![
        Just("type"), Just("properties"), Just("items"), Just("anyOf"), Just("minimum"), Just("maximum"), Just("minLength"),
        Just("maxLength"), Just("required"), Just("additionalProperties"), Just("$ref"), Just("$defs"), Just("enum"),
        Just("format"), Just("pattern"), Just("prefixItems"), Just("x"), Just("exclusiveMinimum"), Just("multipleOf"),
    ];
    let leaf = prop_oneof![
        Just(Json::Null), any::<bool>().prop_map(Json::Bool), any::<i64>().prop_map(|i| json!(i)), any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![Just("string"), Just("object"), Just("integr"), Just("date"), Just("#/$defs/a"), Just("")].prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(4, 64, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
            proptest::collection::vec((keys.clone(), inner), 0..5).prop_map(|kv| Json::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

/// A triggered grammar allows everything until its trigger appears in the text (here split
/// across tokens), then only what the grammar allows after it.
#[test]
fn a_triggered_grammar_wakes_at_its_trigger() {
    let tok = tokenizer();
    let vocab = Arc::new(GrammarVocab::new(tok.clone()).unwrap());
    let then = GrammarSpec::Lark("start: \"<tool_call>\\n\" %json {\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\"}}, \"required\": [\"n\"], \"additionalProperties\": false, \"x-guidance\": {\"whitespace_flexible\": false}} \"\\n</tool_call>\"\n".into());
    let g = GrammarSpec::Triggered { trigger: "<tool_call>".into(), then: Box::new(then) }.compile(&vocab).unwrap();
    let n = tok.n_vocab();
    let free = |c: &mut Constraint| {
        let mut logits = vec![0.0f32; n];
        c.apply(&mut logits).unwrap();
        logits.iter().filter(|l| **l == 0.0).count()
    };
    // The trigger split over tokens ("<tool" then "_call>" or whatever pieces the tokenizer
    // makes of it), after free text.
    let mut c = Constraint::new(&g).unwrap();
    let before = tok.encode("Let me look that up. <tool", false);
    for &id in &before {
        assert!(!c.active());
        assert_eq!(free(&mut c), n, "a dormant grammar allows every token");
        c.commit(id).unwrap();
    }
    assert!(!c.active());
    for id in tok.encode("_call>", false) {
        c.commit(id).unwrap();
    }
    assert!(c.active(), "the trigger completed across tokens");
    // What is left is forced: "\n{\"n\": " — every allowed token is a prefix of it.
    let mut logits = vec![0.0f32; n];
    c.apply(&mut logits).unwrap();
    let allowed: Vec<u32> = (0..n as u32).filter(|&i| logits[i as usize] == 0.0).collect();
    assert!(!allowed.is_empty());
    for id in &allowed {
        let b = tok.token_bytes(*id).unwrap();
        assert!(b"\n{\"n\": ".starts_with(b), "{:?}", String::from_utf8_lossy(b));
    }
    // Text after the trigger that breaks the grammar is an error, never ignored.
    let mut c = Constraint::new(&g).unwrap();
    // ("<tool_call>" is one token of its own here: " oops" goes to the woken grammar, which
    // refuses it, on the commit after or on the next mask.)
    let bad = tok.encode("<tool_call> oops", false);
    let r: Result<Vec<()>, _> = bad.iter().map(|&id| c.commit(id)).collect();
    use minfer::generate::ConstraintError::{AfterTrigger, Refused};
    let mut logits = vec![0.0f32; n];
    assert!(matches!(r, Err(AfterTrigger(_) | Refused(_))) || matches!(c.apply(&mut logits), Err(AfterTrigger(_) | Refused(_))), "{r:?}");
}

/// A function whose parameters use `$defs` and refer to their own root (`#`), as pydantic
/// writes them: forced calls keep those references' meaning.
#[test]
fn tool_parameters_keep_their_references() {
    use minfer::server::structured::{ToolChoice, tool_calls};
    let tok = tokenizer();
    let vocab = Arc::new(GrammarVocab::new(tok.clone()).unwrap());
    let tools = json!([{"type": "function", "function": {"name": "tree", "parameters": {
        "$defs": {"Unit": {"enum": ["c", "f"]}},
        "type": "object",
        "properties": {"unit": {"$ref": "#/$defs/Unit"}, "child": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["unit", "child"], "additionalProperties": false}}}]);
    let s = tool_calls(&tools, &ToolChoice::Required).unwrap().unwrap();
    let grammar = s.compile(&vocab).unwrap();
    let ok = "<tool_call>\n{\"name\": \"tree\", \"arguments\": {\"unit\": \"c\", \"child\": {\"unit\": \"f\", \"child\": null}}}\n</tool_call>";
    let bad = "<tool_call>\n{\"name\": \"tree\", \"arguments\": {\"unit\": \"c\", \"child\": {\"name\": ";
    for (text, fits) in [(ok, true), (bad, false)] {
        assert_eq!(walk(&mut Constraint::new(&grammar).unwrap(), &tok, text), fits, "{text}");
    }
}
