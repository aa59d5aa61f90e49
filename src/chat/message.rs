//! Chat messages in the OpenAI shape, and reading them from JSON
//! (`minfer template --messages FILE.json`).
//!
//! Templates see each message as the dict HF would pass: the fields the caller gave, with an
//! absent field undefined (`message.tool_calls is defined` is false) and an explicit `null`
//! defined but `none`. The optional fields therefore keep "absent" and "null" apart.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value as Json};

use super::convert::json_to_value;
use super::error::TemplateError;

/// `deserialize_with` for optional fields: a present field (even `null`) becomes `Some`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Json>, D::Error> {
    Json::deserialize(d).map(Some)
}

/// One message of a conversation, as in OpenAI's chat API.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// Usually a string; `null` for an assistant turn that only calls tools; a list of parts
    /// for multimodal input. `None` means the field was absent.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub content: Option<Json>,
    /// The assistant's tool calls: `[{"type": "function", "function": {"name", "arguments"}}]`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_calls: Option<Json>,
    /// The name of the tool a `tool` message answers for, or of a participant.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<Json>,
    /// The id of the tool call a `tool` message answers.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_call_id: Option<Json>,
    /// Any other fields (e.g. `reasoning_content`), passed to the template unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}

impl ChatMessage {
    /// A message with a role and text content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: Some(Json::String(content.into())),
            ..ChatMessage::default()
        }
    }

    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }

    /// The message as the dict a template sees: `role`, then the present optional fields,
    /// then the extra ones.
    pub(crate) fn to_value(&self) -> Result<minijinja::Value, TemplateError> {
        let mut pairs = vec![(
            "role".to_string(),
            minijinja::Value::from(self.role.as_str()),
        )];
        let optional = [
            ("content", &self.content),
            ("tool_calls", &self.tool_calls),
            ("name", &self.name),
            ("tool_call_id", &self.tool_call_id),
        ];
        for (key, field) in optional {
            if let Some(v) = field {
                pairs.push((key.to_string(), json_to_value(v)?));
            }
        }
        for (key, v) in &self.extra {
            pairs.push((key.clone(), json_to_value(v)?));
        }
        Ok(minijinja::Value::from_pairs(pairs))
    }
}

/// What a `--messages` file holds: the conversation and, optionally, the tools offered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// The JSON array of tool schemas (`None` when absent or `null`).
    pub tools: Option<Json>,
}

/// What kind of JSON value `v` is ("a string", "null", ...), for error messages.
pub fn kind_of(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

fn parse_message(index: usize, v: Json) -> Result<ChatMessage, TemplateError> {
    let Json::Object(map) = v else {
        return Err(TemplateError::bad_input(format!(
            "messages[{index}]: expected an object with a \"role\", found {}",
            kind_of(&v)
        )));
    };
    match map.get("role") {
        Some(Json::String(_)) => {}
        Some(other) => {
            return Err(TemplateError::bad_input(format!(
                "messages[{index}]: \"role\" must be a string, found {}",
                kind_of(other)
            )));
        }
        None => {
            return Err(TemplateError::bad_input(format!(
                "messages[{index}]: missing \"role\""
            )));
        }
    }
    serde_json::from_value(Json::Object(map))
        .map_err(|e| TemplateError::bad_input(format!("messages[{index}]: {e}")))
}

fn parse_message_list(v: Json) -> Result<Vec<ChatMessage>, TemplateError> {
    let Json::Array(items) = v else {
        return Err(TemplateError::bad_input(format!(
            "\"messages\" must be an array, found {}",
            kind_of(&v)
        )));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, m)| parse_message(i, m))
        .collect()
}

/// Checks a tool list: an array of objects, or `null` for none.
pub(crate) fn check_tools(tools: &Json) -> Result<(), TemplateError> {
    let Json::Array(items) = tools else {
        return Err(TemplateError::bad_input(format!(
            "\"tools\" must be an array, found {}",
            kind_of(tools)
        )));
    };
    for (i, tool) in items.iter().enumerate() {
        if !tool.is_object() {
            return Err(TemplateError::bad_input(format!(
                "tools[{i}]: expected an object, found {}",
                kind_of(tool)
            )));
        }
    }
    Ok(())
}

/// Reads a conversation from JSON: either an array of messages, or an object with a
/// `"messages"` array and an optional `"tools"` array (other keys, such as an OpenAI request's
/// `"model"`, are ignored).
pub fn parse_chat_request_json(text: &str) -> Result<ChatRequest, TemplateError> {
    let v: Json = serde_json::from_str(text)
        .map_err(|e| TemplateError::bad_input(format!("not valid JSON: {e}")))?;
    match v {
        Json::Array(_) => Ok(ChatRequest {
            messages: parse_message_list(v)?,
            tools: None,
        }),
        Json::Object(mut map) => {
            let messages = map.remove("messages").ok_or_else(|| {
                TemplateError::bad_input(
                    "expected an array of messages or an object with \"messages\"",
                )
            })?;
            let messages = parse_message_list(messages)?;
            let tools = match map.remove("tools") {
                None | Some(Json::Null) => None,
                Some(tools) => {
                    check_tools(&tools)?;
                    Some(tools)
                }
            };
            Ok(ChatRequest { messages, tools })
        }
        other => Err(TemplateError::bad_input(format!(
            "expected an array of messages or an object with \"messages\", found {}",
            kind_of(&other)
        ))),
    }
}

/// Reads the messages of a conversation from JSON (see [`parse_chat_request_json`], which also
/// returns the tools).
pub fn parse_messages_json(text: &str) -> Result<Vec<ChatMessage>, TemplateError> {
    parse_chat_request_json(text).map(|r| r.messages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_and_null_fields_stay_apart() {
        let m: Vec<ChatMessage> = parse_messages_json(
            r#"[{"role": "assistant", "content": null, "tool_calls": [], "x": 1}]"#,
        )
        .unwrap();
        assert_eq!(m[0].content, Some(Json::Null));
        assert_eq!(m[0].tool_calls, Some(Json::Array(vec![])));
        assert_eq!(m[0].name, None);
        assert_eq!(m[0].extra.get("x"), Some(&Json::from(1)));
    }
}
