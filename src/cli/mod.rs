//! Command-line interface: argument definitions and the subcommands behind them.

mod info;
mod model_files;
mod output;
mod run;
mod template;
mod tokenize;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use output::Out;

/// Errors a subcommand can end with; each prints as one line.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error(transparent)]
    Model(#[from] crate::models::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error(transparent)]
    Template(#[from] crate::chat::TemplateError),
    #[error("{path}: {source}")]
    Messages { path: PathBuf, source: crate::chat::TemplateError },
    #[error("cannot read {path}: {source}")]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("cannot read standard input: {0}")]
    Stdin(String),
    #[error("{0}")]
    Usage(&'static str),
    #[error("cannot write output: {0}")]
    Output(std::io::Error),
}

#[derive(Debug, Parser)]
#[command(name = "minfer", version, about = "LLM inference for GGUF models (Qwen2, Qwen3)")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a model's architecture, hyper-parameters, vocabulary and quant mix.
    Info {
        /// The GGUF model file.
        model: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also list every tensor (name, type, shape, size, offset).
        #[arg(long)]
        tensors: bool,
    },
    /// Turn text into token ids, as the model's tokenizer does (BOS added when the model asks).
    Tokenize {
        /// The GGUF model file.
        #[arg(short, long)]
        model: PathBuf,
        /// Parse special-token text (`<|im_end|>`) into special tokens.
        #[arg(long)]
        special: bool,
        /// Print the ids as one JSON array.
        #[arg(long)]
        json: bool,
        /// The text to tokenize (`-` reads standard input).
        text: String,
    },
    /// Render a conversation with the model's chat template.
    Template {
        /// The GGUF model file.
        #[arg(short, long)]
        model: PathBuf,
        /// JSON file: an array of {role, content} messages, or {"messages": [...], "tools": [...]}.
        #[arg(long)]
        messages: PathBuf,
        /// Do not end with the assistant header (by default the prompt asks for a reply).
        #[arg(long)]
        no_generation_prompt: bool,
    },
    /// Generate text from a prompt.
    Run {
        /// The GGUF model file.
        #[arg(short, long)]
        model: PathBuf,
        /// The prompt, tokenized as is.
        #[arg(short, long, conflicts_with = "messages", required_unless_present = "messages")]
        prompt: Option<String>,
        /// A conversation to render with the chat template (with the generation prompt).
        #[arg(long)]
        messages: Option<PathBuf>,
    },
}

pub fn run_cli(cli: Cli) -> Result<(), CliError> {
    let mut out = Out::stdout();
    let r = match cli.command {
        Command::Info { model, json, tensors } => info::run(&mut out, &model, json, tensors),
        Command::Tokenize { model, special, json, text } => tokenize::run(&mut out, &model, &text, special, json),
        Command::Template { model, messages, no_generation_prompt } => {
            template::run(&mut out, &model, &messages, !no_generation_prompt)
        }
        Command::Run { model, prompt, messages } => {
            let prompt = match (&prompt, &messages) {
                (Some(p), None) => run::Prompt::Text(p),
                (None, Some(m)) => run::Prompt::Messages(m),
                _ => return Err(CliError::Usage("give exactly one of -p TEXT and --messages FILE")),
            };
            run::run(&mut out, &model, prompt)
        }
    };
    out.finish(r)
}
