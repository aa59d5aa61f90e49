//! Command-line interface: argument definitions and the subcommands behind them.

mod bench;
mod bench_batched;
mod bench_structured;
mod chat;
mod draft_args;
mod dump;
mod engine_args;
mod grammar_args;
mod info;
mod logits;
mod model_files;
mod output;
mod progress;
mod prompt_source;
mod run;
mod serve;
mod synth;
mod template;
mod tokenize;
mod viz;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use engine_args::EngineArgs;

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
    #[error(transparent)]
    TemplateSource(#[from] crate::chat::TemplateSourceError),
    #[error("{path}: {source}")]
    Messages { path: PathBuf, source: crate::chat::TemplateError },
    #[error("cannot read {path}: {source}")]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("cannot read standard input: {0}")]
    Stdin(String),
    #[error("the prompt from {what} is not UTF-8 text (invalid byte at byte {offset})")]
    PromptNotUtf8 { what: String, offset: usize },
    #[error("{0}")]
    Usage(&'static str),
    /// A flag's value that its parser could not refuse alone.
    #[error("{flag}: {why}")]
    BadFlag { flag: &'static str, why: String },
    #[error(transparent)]
    Engine(#[from] crate::generate::EngineError),
    #[error(transparent)]
    Generate(#[from] crate::generate::GenerateError),
    #[error(transparent)]
    Graph(#[from] crate::graph::GraphError),
    #[error("prompt of {n_prompt} tokens does not fit the context of {n_ctx} tokens (raise --ctx)")]
    PromptTooLong { n_prompt: usize, n_ctx: usize },
    #[error("--from {from} is past the last of the {n_ids} ids")]
    FromOutOfRange { from: usize, n_ids: usize },
    #[error("--ids: {0}")]
    BadIds(String),
    #[error("cannot write {path}: {source}")]
    WriteFile { path: PathBuf, source: std::io::Error },
    #[error("cannot write output: {0}")]
    Output(std::io::Error),
    #[error(transparent)]
    Serve(#[from] crate::server::ServeError),
    #[error(transparent)]
    Speculative(#[from] crate::generate::SpecError),
    #[error("{0}")]
    Chat(String),
    /// A schema or grammar that cannot be enforced (`--json-schema`, `--grammar`).
    #[error("{0}")]
    Grammar(String),
    #[error("{0}")]
    KvType(String),
    #[error(transparent)]
    Trace(#[from] crate::generate::TraceError),
    #[error(transparent)]
    Viz(#[from] crate::viz::VizError),
    #[error(transparent)]
    Profile(#[from] crate::models::profile::ProfileError),
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
        #[arg(allow_hyphen_values = true)]
        model: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also list every tensor (name, type, shape, size, offset).
        #[arg(long)]
        tensors: bool,
        /// Also load the model on these backends (comma-separated, as `run --backend`) and
        /// report, per backend, its device, the weights it holds and the memory reserved, and
        /// the load time.
        #[arg(long)]
        backend: Option<String>,
    },
    /// Turn text into token ids, as the model's tokenizer does (BOS added when the model asks).
    Tokenize {
        /// The GGUF model file.
        #[arg(short, long, allow_hyphen_values = true)]
        model: PathBuf,
        /// Parse special-token text (`<|im_end|>`) into special tokens.
        #[arg(long)]
        special: bool,
        /// Print the ids as one JSON array.
        #[arg(long)]
        json: bool,
        /// The text to tokenize (`-` reads standard input).
        #[arg(allow_hyphen_values = true)]
        text: String,
    },
    /// Render a conversation with the model's chat template.
    Template {
        /// The GGUF model file.
        #[arg(short, long, allow_hyphen_values = true)]
        model: PathBuf,
        /// JSON file: an array of {role, content} messages, or {"messages": [...], "tools": [...]}.
        #[arg(long, allow_hyphen_values = true)]
        messages: PathBuf,
        /// Do not end with the assistant header (by default the prompt asks for a reply).
        #[arg(long)]
        no_generation_prompt: bool,
        /// Render with this Jinja chat template instead of the model's (a model without one
        /// needs it).
        #[arg(long, allow_hyphen_values = true)]
        chat_template: Option<PathBuf>,
    },
    /// Generate text from a prompt (tokens stream to stdout, timings to stderr). With a chat
    /// template in the model, the prompt is the user's message and the answer ends at the end
    /// of the model's turn, as `ollama run` and `llama-cli` do; `--raw` continues the text as is.
    Run {
        /// The GGUF model file.
        #[arg(short, long, allow_hyphen_values = true)]
        model: PathBuf,
        /// The prompt (`-` reads standard input, `@FILE` a file; `@@…` is a prompt starting
        /// with `@`).
        #[arg(short, long, allow_hyphen_values = true, conflicts_with_all = ["messages", "file"])]
        prompt: Option<String>,
        /// Read the prompt from FILE (`-`: standard input), byte for byte.
        #[arg(short = 'f', long = "file", allow_hyphen_values = true, conflicts_with = "messages")]
        file: Option<PathBuf>,
        /// A conversation (JSON) rendered with the model's chat template and a generation prompt.
        #[arg(long, allow_hyphen_values = true, required_unless_present_any = ["prompt", "file"])]
        messages: Option<PathBuf>,
        /// Tokenize the prompt as it is and continue it (no chat template).
        #[arg(long, conflicts_with = "messages")]
        raw: bool,
        /// System message before the prompt (chat mode only).
        #[arg(long, allow_hyphen_values = true, conflicts_with_all = ["raw", "messages"])]
        system: Option<String>,
        /// Chat with this Jinja chat template instead of the model's (a model without one
        /// continues a `-p` prompt as raw text unless given one).
        #[arg(long, allow_hyphen_values = true, conflicts_with = "raw")]
        chat_template: Option<PathBuf>,
        /// Most tokens to generate.
        #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
        n_predict: usize,
        #[command(flatten)]
        sampling: SamplingArgs,
        #[command(flatten)]
        grammar: grammar_args::GrammarArgs,
        /// Stop when the text contains this string (repeatable).
        #[arg(long, allow_hyphen_values = true)]
        stop: Vec<String>,
        /// Print one JSON object {prompt_ids, generated_ids, text, prompt_tokens_per_s,
        /// gen_tokens_per_s} instead of streaming text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        draft: draft_args::DraftArgs,
        /// Say on stderr how the prompt was formed (the chat template and the rendered text,
        /// or raw), and print speculative-decoding statistics (acceptance, time in the draft
        /// and in the verify passes) after the timings.
        #[arg(short, long)]
        verbose: bool,
        /// Write the prompt's forward graph as Graphviz DOT and exit.
        #[arg(long, allow_hyphen_values = true)]
        dump_graph: Option<PathBuf>,
        /// Write the prompt's forward graph as JSON ({"format": "minfer-graph", ...}) and exit.
        #[arg(long, allow_hyphen_values = true)]
        dump_graph_json: Option<PathBuf>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Teacher-forced logits: ids[0..=FROM] as the prefill, then one id per decode step; one JSON
    /// line per position p >= FROM with the top-K [id, logit] pairs for the token after p.
    Logits {
        /// The GGUF model file.
        #[arg(short, long, allow_hyphen_values = true)]
        model: PathBuf,
        /// Comma-separated token ids.
        #[arg(long)]
        ids: String,
        /// Last position of the prefill (default 0).
        #[arg(long, default_value_t = 0)]
        from: usize,
        /// Pairs per line.
        #[arg(long, default_value_t = 20)]
        top: usize,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Chat with a model: a REPL that keeps the conversation's KV between turns (/reset,
    /// /save FILE, /load FILE, /stats, /exit; one turn per line when stdin is a pipe).
    Chat(chat::ChatArgs),
    /// Serve the OpenAI API over HTTP (/v1/chat/completions, /v1/completions, /v1/models,
    /// /health, /metrics, /tokenize, /detokenize).
    Serve(serve::ServeArgs),
    /// Serve the graph visualizer: the graph layer by layer, a prompt's per-node values live
    /// (default http://127.0.0.1:8081/), saved MINFER_TRACE files.
    Viz(viz::VizArgs),
    /// Write a synthetic model with a real model's tensors (names, shapes, types) and random
    /// but valid weights, for speed measurements where the real file is not at hand.
    Synth(synth::SynthArgs),
    /// Measure prompt processing (pp) and generation (tg) speed, as llama-bench does.
    Bench {
        /// The GGUF model file.
        #[arg(short, long, allow_hyphen_values = true)]
        model: PathBuf,
        /// Prompt tokens of the pp test (0 skips it).
        #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
        n_prompt: usize,
        /// Generated tokens of the tg test (0 skips it).
        #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
        n_gen: usize,
        /// Tokens already in the KV before each test (llama-bench's `-d`): prefilled once,
        /// untimed, and restored before every repetition, so pp and tg run at that depth.
        #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
        n_depth: usize,
        /// Timed repetitions of each test (after one untimed warm-up).
        #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
        reps: usize,
        /// Output: a markdown table or a JSON array.
        #[arg(short = 'o', long = "output", value_enum, default_value = "md")]
        output: bench::BenchOutput,
        /// Batched decoding, as llama-batched-bench measures it: for each B in the list, B
        /// sequences of `-p` prompt tokens are prefilled, then decoded `-n` steps of B tokens
        /// each in one forward pass (its PP, TG, B, N_KV, T/S columns; `-d` does not apply).
        #[arg(long = "batch", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=256))]
        batch: Option<Vec<u32>>,
        /// Structured output (`--json-schema`, `--json-object`, `--grammar`): greedy decoding
        /// of up to `-n` tokens under the constraint against as many unconstrained, alternating;
        /// also the time to build the token trie and to compile the constraint.
        #[command(flatten)]
        grammar: grammar_args::GrammarArgs,
        #[command(flatten)]
        engine: EngineArgs,
    },
}

/// Sampling options (llama.cpp's defaults; `--temp 0` is greedy).
#[derive(Debug, Clone, clap::Args)]
pub struct SamplingArgs {
    /// Temperature; 0 picks the most likely token.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Tokens the penalties look back over.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (the same seed gives the same text).
    #[arg(long, default_value_t = 0xC0FFEE)]
    pub seed: u64,
}

impl SamplingArgs {
    pub fn params(&self) -> crate::generate::SamplerParams {
        crate::generate::SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            seed: self.seed,
            logit_bias: Vec::new(),
        }
    }
}

fn parse_ids(s: &str) -> Result<Vec<u32>, CliError> {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().map_err(|_| CliError::BadIds(format!("'{t}' is not a token id"))))
        .collect()
}

pub fn run_cli(cli: Cli) -> Result<(), CliError> {
    let mut out = Out::stdout();
    // Only `run` records traces (`viz` streams its own); say so rather than ignore it silently.
    if std::env::var_os("MINFER_TRACE").is_some_and(|v| !v.is_empty()) && !matches!(cli.command, Command::Run { .. }) {
        eprintln!("minfer: warning: MINFER_TRACE is recorded by `minfer run` only; this command ignores it");
    }
    let r = match cli.command {
        Command::Info { model, json, tensors, backend } => info::run(&mut out, &model, json, tensors, backend.as_deref()),
        Command::Tokenize { model, special, json, text } => tokenize::run(&mut out, &model, &text, special, json),
        Command::Template { model, messages, no_generation_prompt, chat_template } => {
            template::run(&mut out, &model, &messages, !no_generation_prompt, chat_template.as_deref())
        }
        Command::Run { model, prompt, file, messages, raw, system, chat_template, n_predict, sampling, grammar, stop, json, draft, verbose, dump_graph, dump_graph_json, engine } => {
            let source = |p: &Option<String>, f: &Option<PathBuf>| match (p, f) {
                (Some(p), None) => Some(prompt_source::PromptSource::from_prompt_arg(p)),
                (None, Some(f)) => Some(prompt_source::PromptSource::from_file_arg(f)),
                _ => None,
            };
            let prompt = match (source(&prompt, &file), &messages) {
                (Some(src), None) => run::Prompt::Text { text: src.read()?, raw, system },
                (None, Some(m)) => run::Prompt::Messages(m),
                _ => return Err(CliError::Usage("give exactly one of -p TEXT, -f FILE and --messages FILE")),
            };
            let args = run::RunArgs {
                chat_template,
                engine: engine.resolved(),
                max_tokens: n_predict,
                sampler: sampling.params(),
                grammar,
                stop,
                json,
                dump_graph,
                dump_graph_json,
                draft,
                verbose,
            };
            run::run(&mut out, &model, prompt, &args)
        }
        Command::Bench { model, n_prompt, n_gen, n_depth, reps, output, batch, grammar, engine } => {
            let args = bench::BenchArgs { n_prompt, n_gen, n_depth, reps, output, engine: engine.resolved() };
            if grammar.is_set() {
                bench_structured::run(&mut out, &model, &args, &grammar)
            } else if let Some(b) = batch {
                let b: Vec<usize> = b.into_iter().map(|n| n as usize).collect();
                bench_batched::run(&mut out, &model, &args, &b)
            } else {
                bench::run(&mut out, &model, &args)
            }
        }
        Command::Serve(args) => serve::run(args),
        Command::Synth(args) => synth::run(&mut out, &args),
        Command::Viz(args) => viz::run(args),
        Command::Chat(args) => chat::run(&mut out, &chat::ChatArgs { engine: args.engine.clone().resolved(), ..args }),
        Command::Logits { model, ids, from, top, engine } => {
            let ids = parse_ids(&ids)?;
            logits::run(&mut out, &model, &ids, from, top, &engine.resolved())
        }
    };
    out.finish(r)
}
