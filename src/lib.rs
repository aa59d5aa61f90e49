//! minfer — an LLM inference engine for GGUF models.
//!
//! Layout follows the design of record: `gguf` reads model files, `quants` holds the block
//! formats and reference kernels, `tokenizer` turns text into ids and back, `chat` renders chat
//! templates.

pub mod backends;
pub mod chat;
pub mod cli;
pub mod generate;
pub mod gguf;
pub mod grammar;
pub mod graph;
pub mod http;
pub mod models;
pub mod quants;
pub mod server;
pub mod tensor;
pub mod tokenizer;
pub mod viz;
pub mod workers;
