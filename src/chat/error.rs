//! The one error type of chat-template handling.
//!
//! Every variant that comes from a template names the template and, where the engine knows it,
//! the 1-based source line, so that a broken `tokenizer.chat_template` can be found without a
//! debugger.

use std::fmt;

/// A resource limit that stopped a render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The per-render instruction/memory budget ran out (a loop that runs too long, output that
    /// grows too large).
    Fuel,
    /// Macro calls, recursive loops, nested data or the template source's own nesting went
    /// too deep.
    Recursion,
    /// One value was asked to be larger than the engine ever builds (a `range` of more than
    /// 100 000 items, a string or list repeated past 100 million items), refused before any
    /// work is done.
    Size,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limit::Fuel => "fuel",
            Limit::Recursion => "recursion",
            Limit::Size => "size",
        })
    }
}

/// Formats an optional line as ` line N` (or nothing).
struct At(Option<usize>);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(line) => write!(f, " line {line}"),
            None => Ok(()),
        }
    }
}

/// Errors from compiling or rendering a chat template, or from reading chat input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template source does not parse.
    #[error("chat template `{template}`{}: syntax error: {message}", At(*.line))]
    Syntax {
        template: String,
        line: Option<usize>,
        message: String,
    },
    /// The template failed while rendering (undefined method, bad operand types, ...).
    #[error("chat template `{template}`{}: {message}", At(*.line))]
    Render {
        template: String,
        line: Option<usize>,
        message: String,
    },
    /// The template itself refused the input through `raise_exception(...)`, the way HF
    /// templates reject e.g. a conversation that does not alternate roles.
    #[error("chat template `{template}`{}: raise_exception: {message}", At(*.line))]
    Raised {
        template: String,
        line: Option<usize>,
        message: String,
    },
    /// A resource limit stopped the render (a hostile or runaway template).
    #[error("chat template `{template}`{}: {limit} limit exceeded: {message}", At(*.line))]
    LimitExceeded {
        template: String,
        line: Option<usize>,
        limit: Limit,
        message: String,
    },
    /// The messages, tools or options handed to the renderer have the wrong shape.
    #[error("invalid chat input: {message}")]
    BadInput { message: String },
}

impl TemplateError {
    /// The template the error comes from (`None` for [`TemplateError::BadInput`]).
    pub fn template(&self) -> Option<&str> {
        match self {
            TemplateError::Syntax { template, .. }
            | TemplateError::Render { template, .. }
            | TemplateError::Raised { template, .. }
            | TemplateError::LimitExceeded { template, .. } => Some(template),
            TemplateError::BadInput { .. } => None,
        }
    }

    /// The 1-based template line the error points at, where known.
    pub fn line(&self) -> Option<usize> {
        match self {
            TemplateError::Syntax { line, .. }
            | TemplateError::Render { line, .. }
            | TemplateError::Raised { line, .. }
            | TemplateError::LimitExceeded { line, .. } => *line,
            TemplateError::BadInput { .. } => None,
        }
    }

    pub(crate) fn bad_input(message: impl Into<String>) -> TemplateError {
        TemplateError::BadInput {
            message: message.into(),
        }
    }
}
