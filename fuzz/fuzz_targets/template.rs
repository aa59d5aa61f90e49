//! Any template source and any conversation JSON: compiling and rendering either succeed or
//! return a typed error — no panic, no hang (fuel), no stack overflow (recursion limit).
#![no_main]

use libfuzzer_sys::fuzz_target;
use minfer::chat::{ChatMessage, ChatTemplate, Limits, RenderOptions, parse_chat_request_json};

fuzz_target!(|data: &[u8]| {
    // Layout: template source, a NUL, then the conversation JSON (optional).
    let (src, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(src) = std::str::from_utf8(src) else { return };
    let limits = Limits { fuel: 20_000, recursion: 100 };
    let Ok(t) = ChatTemplate::with_limits("fuzz", src, limits) else { return };
    let (messages, tools) = match std::str::from_utf8(rest).ok().map(parse_chat_request_json) {
        Some(Ok(req)) => (req.messages, req.tools),
        _ => (vec![ChatMessage::system("s"), ChatMessage::user("hi")], None),
    };
    let opts = RenderOptions { add_generation_prompt: true, tools, ..RenderOptions::default() };
    let _ = t.render(&messages, &opts);
});
