//! Chat-template rendering: a conversation (OpenAI-shaped messages, optional tools) to the
//! prompt text a model was trained on, by the model's own `tokenizer.chat_template` (Jinja),
//! rendered the way HF transformers' `apply_chat_template` and llama.cpp render it.
//!
//! - [`message`]: [`ChatMessage`] and reading conversations from JSON;
//! - [`options`]: [`RenderOptions`], the variables of one render;
//! - [`template`]: [`ChatTemplate`], compile once, render many;
//! - `source`: which template is in force (`--chat-template FILE`, else the model's);
//! - [`error`]: [`TemplateError`], which names the template and the line;
//! - `pyjson`, `pyrepr`, `methods`, `strftime`, `convert`: the Python behaviour templates rely
//!   on (`json.dumps`, `str()`, `str.strip()`, `datetime.strftime`) and JSON-to-template values.

pub mod builtin;
mod convert;
pub mod error;
pub mod message;
mod methods;
pub mod options;
mod pyjson;
mod source;
mod pyrepr;
mod strftime;
pub mod template;

pub use error::{Limit, TemplateError};
pub use message::{ChatMessage, ChatRequest, parse_chat_request_json, parse_messages_json};
pub use options::RenderOptions;
pub use source::{NO_TEMPLATE, TemplateSourceError, chat_template_for, require_chat_template};
pub use template::{ChatTemplate, Limits};
