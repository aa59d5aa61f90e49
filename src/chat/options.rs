//! What a render needs besides the messages: the variables HF's `apply_chat_template` passes.

use std::time::SystemTime;

use serde_json::{Map, Value as Json};

/// Template variables for one render.
///
/// HF renders `template.render(messages=..., tools=..., documents=None,
/// add_generation_prompt=..., **special_tokens, **kwargs)`; these fields are those variables.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderOptions {
    /// End with the header of an assistant turn, for the model to continue.
    pub add_generation_prompt: bool,
    /// The tool schemas (a JSON array), or `None`: the template then sees `tools` as `none`,
    /// as with HF's `tools=None`.
    pub tools: Option<Json>,
    /// `bos_token`, e.g. from `tokenizer.ggml.bos_token_id`'s text.
    pub bos_token: String,
    /// `eos_token`, e.g. from `tokenizer.ggml.eos_token_id`'s text.
    pub eos_token: String,
    /// Further variables, as HF's `**kwargs` (`enable_thinking`, `documents`, ...). A name that
    /// collides with one of the fields above is refused.
    pub extra: Map<String, Json>,
    /// The time `strftime_now` reports; `None` reads the clock when the render starts.
    pub now: Option<SystemTime>,
}

impl RenderOptions {
    /// Options whose `bos_token` / `eos_token` are the texts of `tok`'s BOS and EOS tokens
    /// (empty when the vocabulary has none), as HF passes a tokenizer's special tokens.
    pub fn for_tokenizer(tok: &crate::tokenizer::Tokenizer) -> RenderOptions {
        let text_of = |id: Option<u32>| id.and_then(|i| tok.token_text(i).ok()).unwrap_or("").to_string();
        RenderOptions { bos_token: text_of(tok.bos_id()), eos_token: text_of(tok.eos_id()), ..RenderOptions::default() }
    }

    /// Options for a prompt that asks the model for the next assistant turn.
    pub fn generation() -> RenderOptions {
        RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        }
    }
}
