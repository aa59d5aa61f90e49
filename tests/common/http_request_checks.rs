//! What a request body's reading must give, shared by the fuzz target
//! (`fuzz/fuzz_targets/http_request.rs`) and its stable twin (`tests/http_request_fuzz.rs`):
//! an error is a 4xx in the OpenAI shape with a one-line message, accepted options stay within
//! the documented bounds.

use minfer::server::ApiError;
use minfer::server::fields::parse_object;
use minfer::server::request::{GenOptions, MAX_STOP_BYTES, MAX_STOPS, MAX_TOP_LOGPROBS, chat_request, completion_request};

/// A vocabulary of one token (every bias bans everything) and Qwen2's.
const VOCABS: [usize; 2] = [1, 151_936];

pub fn check_error(e: &ApiError) {
    let v = e.to_json();
    let msg = e.to_string();
    assert_eq!(v["error"]["message"].as_str(), Some(msg.as_str()));
    assert_eq!(v["error"]["type"].as_str(), Some(e.kind()));
    assert!(v["error"].get("param").is_some() && v["error"].get("code").is_some(), "{v}");
    assert!(e.status().is_client_error(), "{e:?}");
    assert!(!msg.contains('\n') && msg.len() < 4096, "{msg:?}");
}

pub fn check_opts(o: &GenOptions, n_vocab: usize) {
    assert!(o.max_tokens.is_none_or(|n| n >= 1));
    assert!((1..=minfer::server::request::MAX_CHOICES as usize).contains(&o.n));
    assert!(o.stop.len() <= MAX_STOPS && o.stop.iter().all(|s| s.len() <= MAX_STOP_BYTES));
    assert!(o.n_probs.is_none_or(|n| n as i64 <= MAX_TOP_LOGPROBS));
    assert!(!o.include_usage || o.stream, "include_usage without stream");
    assert!(o.sampler.logit_bias.iter().all(|&(id, _)| (id as usize) < n_vocab));
    assert!(o.sampler.validate().is_ok(), "{:?}", o.sampler);
}

/// What the fuzz target does with one body: read it as both endpoints' request, under both
/// vocabularies, and check whatever comes back.
pub fn exercise(data: &[u8]) {
    let body = match parse_object(data) {
        Ok(body) => body,
        Err(e) => return check_error(&e),
    };
    for n_vocab in VOCABS {
        match chat_request(&body, n_vocab, &Default::default()) {
            Ok(r) => {
                assert!(!r.messages.is_empty());
                check_opts(&r.opts, n_vocab);
            }
            Err(e) => check_error(&e),
        }
        match completion_request(&body, n_vocab, &Default::default()) {
            Ok(r) => check_opts(&r.opts, n_vocab),
            Err(e) => check_error(&e),
        }
    }
}
