//! Command-line interface: argument definitions and the subcommands behind them.

mod info;
mod output;

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
}

pub fn run_cli(cli: Cli) -> Result<(), CliError> {
    let mut out = Out::stdout();
    let r = match cli.command {
        Command::Info { model, json, tensors } => info::run(&mut out, &model, json, tensors),
    };
    out.finish(r)
}
