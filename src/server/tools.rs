//! Tool calls in generated text, in the format of Qwen2.5 / Qwen3 templates (Hermes style):
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! When a chat request offers tools, the answer's text goes through a [`ToolCallSplitter`]:
//! text before the first `<tool_call>` is content (streamed as it comes; a partial tag at the
//! end is held back), everything from the tag on is captured and parsed when generation ends.
//! Blocks that parse become OpenAI `tool_calls`; anything that does not parse is given back as
//! content, unchanged.

use serde_json::{Value as Json, json};

use crate::generate::longest_suffix_prefix;

pub const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text (OpenAI sends them as a string).
    pub arguments: String,
}

impl ToolCall {
    /// The OpenAI object; `index` is the call's place in the answer.
    pub fn to_json(&self, id: &str, index: usize) -> Json {
        json!({
            "index": index,
            "id": format!("call_{id}_{index}"),
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

#[derive(Debug, Default)]
pub struct ToolCallSplitter {
    /// Content not yet released: it may be the start of `<tool_call>`.
    held: String,
    /// Everything from the first `<tool_call>` on.
    captured: Option<String>,
}

impl ToolCallSplitter {
    /// Adds generated text; returns the content that can be shown now.
    pub fn push(&mut self, text: &str) -> String {
        if let Some(c) = &mut self.captured {
            c.push_str(text);
            return String::new();
        }
        self.held.push_str(text);
        if let Some(at) = self.held.find(OPEN) {
            self.captured = Some(self.held[at..].to_string());
            self.held.truncate(at);
            return std::mem::take(&mut self.held);
        }
        let keep = longest_suffix_prefix(&self.held, OPEN);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        out
    }

    /// At the end of generation: the content still to show and the tool calls.
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        let held = std::mem::take(&mut self.held);
        match self.captured.take() {
            None => (held, Vec::new()),
            Some(c) => match parse_blocks(&c) {
                Some(calls) => (held, calls),
                None => (held + &c, Vec::new()),
            },
        }
    }
}

/// A run of `<tool_call>{json}</tool_call>` blocks separated by white space (the last close
/// tag may be missing when the model ended right after the JSON).
fn parse_blocks(text: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        rest = rest.strip_prefix(OPEN)?;
        let (body, after) = match rest.find(CLOSE) {
            Some(at) => (&rest[..at], &rest[at + CLOSE.len()..]),
            None => (rest, ""),
        };
        calls.push(parse_call(body.trim())?);
        rest = after.trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

fn parse_call(body: &str) -> Option<ToolCall> {
    let v: Json = serde_json::from_str(body).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments") {
        None | Some(Json::Null) => "{}".to_string(),
        Some(Json::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pieces: &[&str]) -> (String, Vec<ToolCall>) {
        let mut s = ToolCallSplitter::default();
        let mut shown: String = pieces.iter().map(|p| s.push(p)).collect();
        let (tail, calls) = s.finish();
        shown.push_str(&tail);
        (shown, calls)
    }

    #[test]
    fn calls_are_parsed_across_pieces() {
        let (content, calls) = split(&["Let me check.\n<tool", "_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"]);
        assert_eq!(content, "Let me check.\n");
        assert_eq!(calls, vec![ToolCall { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() }]);
    }

    #[test]
    fn several_calls_and_a_missing_last_close_tag() {
        let text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}";
        let (content, calls) = split(&[text]);
        assert_eq!(content, "");
        assert_eq!(calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(calls[1].arguments, r#"{"x": 1}"#);
    }

    #[test]
    fn what_does_not_parse_stays_text() {
        for text in ["<tool_call>\nnot json\n</tool_call>", "<tool_call>{\"name\": \"a\"}</tool_call> and more", "a <tool_c"] {
            assert_eq!(split(&[text]), (text.to_string(), vec![]), "{text}");
        }
        assert_eq!(split(&["no calls here"]), ("no calls here".to_string(), vec![]));
    }
}
