//! Any bytes, with and without special-token parsing: encoding never panics, valid UTF-8
//! round-trips through decode, and the stream decoder never emits a broken code point.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use minfer::gguf::GgufFile;
use minfer::tokenizer::Tokenizer;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = std::env::var_os("MINFER_MODEL_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models"));
        let f = GgufFile::open(dir.join("qwen3-tiny.gguf")).expect("models/qwen3-tiny.gguf (scripts/fetch_models.sh)");
        Tokenizer::from_gguf(&f).expect("tokenizer loads")
    })
}

fuzz_target!(|data: &[u8]| {
    let tok = tokenizer();
    let special = data.first().is_some_and(|b| b & 1 == 1);
    let Ok(ids) = tok.encode_bytes(data, special) else {
        assert!(std::str::from_utf8(data).is_err(), "valid UTF-8 was refused");
        return;
    };
    let text = std::str::from_utf8(data).expect("encode_bytes accepted it");
    if !special {
        assert_eq!(tok.decode(&ids).expect("own ids decode"), text);
    }
    let mut stream = tok.stream_decoder();
    let mut out = String::new();
    for &id in &ids {
        out.push_str(&stream.push(id).expect("own ids decode"));
    }
    out.push_str(&stream.flush());
    assert_eq!(out, tok.decode(&ids).expect("own ids decode"));
});
