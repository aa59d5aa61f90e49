//! Chat templates known by name, as llama.cpp's `--chat-template NAME` knows them, for models
//! whose file has no template (or a wrong one). Each is Jinja written to give the text llama.cpp
//! gives for that name (its `llm_chat_apply_template`): the BOS token is the tokenizer's to add.

/// `(name, Jinja)`, in the order `--help` lists them.
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "chatml",
        "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}\
         {%- if add_generation_prompt -%}<|im_start|>assistant\n{% endif -%}",
    ),
    (
        "llama3",
        "{%- for m in messages -%}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>{%- endfor -%}\
         {%- if add_generation_prompt -%}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif -%}",
    ),
    (
        "command-r",
        "{%- for m in messages -%}<|START_OF_TURN_TOKEN|>\
         {%- if m.role == 'system' -%}<|SYSTEM_TOKEN|>{%- elif m.role == 'user' -%}<|USER_TOKEN|>{%- else -%}<|CHATBOT_TOKEN|>{%- endif -%}\
         {{ m.content | trim }}<|END_OF_TURN_TOKEN|>{%- endfor -%}\
         {%- if add_generation_prompt -%}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{%- endif -%}",
    ),
];

/// The Jinja of a built-in template.
pub fn builtin(name: &str) -> Option<&'static str> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, src)| *src)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatMessage, ChatTemplate, RenderOptions};

    fn render(name: &str) -> String {
        let t = ChatTemplate::new(name, builtin(name).unwrap()).unwrap();
        let msgs = [ChatMessage::system("You are a test."), ChatMessage::new("user", "Hi there")];
        t.render(&msgs, &RenderOptions { add_generation_prompt: true, ..RenderOptions::default() }).unwrap()
    }

    /// The texts llama.cpp's `llm_chat_apply_template` gives (its server tests hold the
    /// command-r one; chatml and llama3 written from its code).
    #[test]
    fn builtins_render_as_llama_cpp() {
        assert_eq!(
            render("command-r"),
            "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
        );
        assert_eq!(render("chatml"), "<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
        assert_eq!(
            render("llama3"),
            "<|start_header_id|>system<|end_header_id|>\n\nYou are a test.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert!(builtin("nope").is_none());
    }
}
