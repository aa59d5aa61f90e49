//! Any request body: reading it as a `/v1/chat/completions` or `/v1/completions` request
//! either succeeds with values inside the documented bounds or fails with an [`ApiError`] whose
//! answer is a 4xx in the OpenAI error shape with a one-line message — never a panic. The
//! checks are shared with the stable twin, `tests/http_request_fuzz.rs`.
//!
//! [`ApiError`]: minfer::server::ApiError
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/common/http_request_checks.rs"]
mod checks;

fuzz_target!(|data: &[u8]| checks::exercise(data));
