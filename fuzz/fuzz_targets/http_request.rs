//! Any request body: reading it as a `/v1/chat/completions` or `/v1/completions` request
//! either succeeds with values inside the documented bounds or fails with an [`ApiError`] whose
//! answer is a 4xx in the OpenAI error shape with a one-line message — never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use minfer::server::fields::parse_object;
use minfer::server::request::{chat_request, completion_request};

#[path = "../../tests/common/http_request_checks.rs"]
mod checks;
use checks::{check_error, check_opts};

/// A vocabulary of one token (every bias bans everything) and Qwen2's.
const VOCABS: [usize; 2] = [1, 151_936];

fuzz_target!(|data: &[u8]| {
    let body = match parse_object(data) {
        Ok(body) => body,
        Err(e) => return check_error(&e),
    };
    for n_vocab in VOCABS {
        match chat_request(&body, n_vocab) {
            Ok(r) => {
                assert!(!r.messages.is_empty());
                check_opts(&r.opts, n_vocab);
            }
            Err(e) => check_error(&e),
        }
        match completion_request(&body, n_vocab) {
            Ok(r) => check_opts(&r.opts, n_vocab),
            Err(e) => check_error(&e),
        }
    }
});
