//! The Qwen2.5 chat template renders the reference prompts byte for byte.
//!
//! - `tests/data/chat_reference.jsonl`: the 4 `kind == "chat"` records of
//!   `shared/reference/qwen2.5-0.5b.greedy.jsonl` (`id`, `messages`, `prompt_text` only), whose
//!   `prompt_text` is the model's own `tokenizer.chat_template` rendered with
//!   `add_generation_prompt=true` and no tools, as the llama.cpp reference run rendered it.
//! - `tests/data/qwen2.5-chat-template.jinja`: the `tokenizer.chat_template` string of
//!   `shared/fixtures/qwen3-tiny.gguf` (the Qwen2.5 template), extracted once with gguf-py:
//!   `GGUFReader(path).fields["tokenizer.chat_template"]`, the string's bytes written as is.
//!   Once the crate's GGUF reader lands, this test can read the template from the fixture.

use minfer::chat::{ChatMessage, ChatTemplate, RenderOptions};

const TEMPLATE: &str = include_str!("data/qwen2.5-chat-template.jinja");
const REFERENCE: &str = include_str!("data/chat_reference.jsonl");

#[derive(serde::Deserialize)]
struct Record {
    id: String,
    messages: Vec<ChatMessage>,
    prompt_text: String,
}

#[test]
fn qwen25_template_matches_the_reference_prompts() {
    let template = ChatTemplate::new("qwen2.5", TEMPLATE).expect("the Qwen2.5 template compiles");
    let opts = RenderOptions {
        add_generation_prompt: true,
        eos_token: "<|im_end|>".to_string(),
        bos_token: "<|endoftext|>".to_string(),
        ..RenderOptions::default()
    };
    let mut checked = 0;
    for line in REFERENCE.lines().filter(|l| !l.trim().is_empty()) {
        let record: Record = serde_json::from_str(line).expect("reference record parses");
        let rendered = template
            .render(&record.messages, &opts)
            .unwrap_or_else(|e| panic!("{}: {e}", record.id));
        assert_eq!(rendered, record.prompt_text, "{}", record.id);
        checked += 1;
    }
    assert_eq!(checked, 4, "the reference holds 4 chat records");
}

#[test]
fn without_generation_prompt_the_last_turn_is_closed() {
    let template = ChatTemplate::new("qwen2.5", TEMPLATE).unwrap();
    let rendered = template
        .render(&[ChatMessage::user("Hi")], &RenderOptions::default())
        .unwrap();
    assert_eq!(
        rendered,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
         assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}
