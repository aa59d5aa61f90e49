//! `minfer chat`: an interactive conversation that keeps its KV between turns.
//!
//! Each line of standard input is one user turn (a terminal gets a `> ` prompt; a pipe is
//! read line by line, so the REPL can be scripted). Lines starting with `/` are commands:
//! `/reset`, `/save FILE`, `/load FILE`, `/stats`, `/exit` (`/help` lists them). Ctrl-C stops
//! the answer being generated and returns to the prompt; at the prompt it leaves.

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;

use super::draft_args::DraftArgs;
use super::engine_args::EngineArgs;
use super::progress::{PREFILL_BAR_TOKENS, Progress};
use super::{CliError, Out, SamplingArgs, model_files};
use crate::generate::session::{Session, model_fingerprint};
use crate::generate::{Conversation, ConversationParams, GenerateParams};

#[derive(Debug, Clone, Args)]
pub struct ChatArgs {
    /// The GGUF model file.
    #[arg(short, long, allow_hyphen_values = true)]
    pub model: PathBuf,
    /// System prompt.
    #[arg(long, allow_hyphen_values = true)]
    pub system: Option<String>,
    /// Chat with this Jinja chat template instead of the model's (a model without one needs
    /// it).
    #[arg(long, allow_hyphen_values = true)]
    pub chat_template: Option<PathBuf>,
    /// Most tokens per answer (default: the context size).
    #[arg(short = 'n', long = "n-predict")]
    pub n_predict: Option<usize>,
    /// Tokens kept at the start when the context is full and old tokens are dropped
    /// (default: the system prompt).
    #[arg(long)]
    pub keep: Option<usize>,
    /// Make a full context an error instead of dropping the oldest tokens.
    #[arg(long)]
    pub no_context_shift: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub grammar: super::grammar_args::GrammarArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

const HELP: &str = "commands: /reset (forget the conversation), /save FILE, /load FILE, /stats, /exit";

pub fn run(out: &mut Out, a: &ChatArgs) -> Result<(), CliError> {
    let (f, tok) = model_files::open_with_tokenizer(&a.model)?;
    let tok = Arc::new(tok);
    let grammar = a.grammar.compile(&tok)?;
    let template = model_files::chat_template(&f, a.chat_template.as_deref())?;
    let render = crate::chat::RenderOptions::for_tokenizer(&tok);
    let fingerprint = model_fingerprint(&f);
    let engine = a.engine.engine(Arc::new(f), 1)?;
    let generate = GenerateParams {
        max_tokens: a.n_predict.unwrap_or(engine.n_ctx()),
        sampler: a.sampling.params(),
        stop: Vec::new(),
        ubatch: a.engine.ubatch,
        n_probs: None,
        post_sampling_probs: false,
        grammar,
    };
    let params = ConversationParams { system: a.system.clone(), keep: a.keep, context_shift: !a.no_context_shift, generate };
    let spec = a.draft.speculator(&a.engine, &engine, &tok)?;
    let mut conv = Conversation::new(engine, &tok, &template, render, params).map_err(|e| CliError::Chat(e.to_string()))?;
    if let Some(spec) = spec {
        conv.set_speculator(spec);
    }

    // A bar for long prefills (on a terminal only), made when one starts, cleared at its end.
    // A prefill that failed part-way leaves its bar until the next one starts (done goes back).
    let mut bar: Option<(Progress, usize)> = None;
    conv.set_prefill_progress(Box::new(move |done, total| {
        if total < PREFILL_BAR_TOKENS {
            return;
        }
        if bar.as_ref().is_some_and(|(_, last)| done <= *last) {
            bar = None;
        }
        let (b, last) = bar.get_or_insert_with(|| (Progress::tokens(total, "prefill"), 0));
        b.set(done as u64);
        *last = done;
        if done >= total {
            bar = None;
        }
    }));
    let interactive = std::io::stdin().is_terminal();
    // Ctrl-C: stop the answer being generated; at the prompt, leave.
    let generating = Arc::new(AtomicBool::new(false));
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let (generating, cancel) = (generating.clone(), cancel.clone());
        ctrlc::set_handler(move || {
            if generating.load(Ordering::SeqCst) {
                cancel.store(true, Ordering::SeqCst);
            } else {
                eprintln!();
                std::process::exit(130);
            }
        })
        .map_err(|e| CliError::Chat(format!("cannot handle Ctrl-C: {e}")))?;
    }
    if interactive {
        eprintln!("minfer chat: {} tokens of context; {HELP}; Ctrl-C stops an answer", conv.engine().n_ctx());
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            out.write("> ")?;
            out.flush()?;
        }
        let Some(line) = lines.next() else { break };
        let line = match line {
            Ok(l) => l,
            // A line that is not UTF-8 is refused; the conversation goes on.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                eprintln!("error: the line is not valid UTF-8");
                continue;
            }
            Err(e) => return Err(CliError::Stdin(e.to_string())),
        };
        let line = line.trim_end_matches(['\r', '\n']);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(cmd) = line.strip_prefix('/') {
            match command(out, &mut conv, cmd.trim(), fingerprint)? {
                Flow::Exit => break,
                Flow::Continue => continue,
            }
        }
        cancel.store(false, Ordering::SeqCst);
        generating.store(true, Ordering::SeqCst);
        let r = conv.turn(line, &cancel, &mut |s| out.write(s).and_then(|_| out.flush()).map_err(|e| e.to_string()));
        generating.store(false, Ordering::SeqCst);
        match r {
            Ok(turn) => {
                out.line("")?;
                if turn.stop.is_none() {
                    eprintln!("[stopped]");
                }
            }
            Err(e) => {
                out.flush()?;
                eprintln!("error: {e}");
            }
        }
        out.flush()?;
    }
    Ok(())
}

enum Flow {
    Continue,
    Exit,
}

/// A `/command`; its errors are reported and the REPL goes on.
fn command(out: &mut Out, conv: &mut Conversation, cmd: &str, fingerprint: u64) -> Result<Flow, CliError> {
    let (name, arg) = cmd.split_once(char::is_whitespace).map_or((cmd, ""), |(n, a)| (n, a.trim()));
    let report = |r: Result<String, String>| match r {
        Ok(msg) => eprintln!("{msg}"),
        Err(e) => eprintln!("error: {e}"),
    };
    match (name, arg) {
        ("exit" | "quit", _) => return Ok(Flow::Exit),
        ("reset", _) => report(conv.reset().map(|_| "conversation reset".to_string()).map_err(|e| e.to_string())),
        ("stats", _) => {
            let (e, s) = (conv.engine(), conv.last_stats());
            out.line(format!(
                "context: {} / {} tokens ({} dropped by context shift), turns: {}; last prefill: {} tokens at {:.1} t/s; last decode: {} tokens at {:.1} t/s",
                e.n_past(),
                e.n_ctx(),
                conv.dropped().len(),
                conv.messages().iter().filter(|m| m.role == "user").count(),
                s.n_prefilled,
                s.prefill_tokens_per_s(),
                s.n_generated,
                s.gen_tokens_per_s()
            ))?;
            if let Some(st) = conv.speculator().map(|sp| sp.stats()) {
                out.line(format!(
                    "last answer's draft: {} rounds, drafted {} tokens, accepted {} ({:.1}%)",
                    st.rounds,
                    st.drafted,
                    st.accepted,
                    100.0 * st.acceptance()
                ))?;
            }
        }
        ("save", file) if !file.is_empty() => report(save(conv, Path::new(file), fingerprint)),
        ("load", file) if !file.is_empty() => report(load(conv, Path::new(file), fingerprint)),
        ("save" | "load", _) => eprintln!("error: /{name} needs a file name"),
        ("help", _) => eprintln!("{HELP}"),
        _ => eprintln!("error: unknown command /{name}; {HELP}"),
    }
    out.flush()?;
    Ok(Flow::Continue)
}

fn save(conv: &mut Conversation, path: &Path, fingerprint: u64) -> Result<String, String> {
    let s = conv.to_session(fingerprint).map_err(|e| e.to_string())?;
    s.save(path).map_err(|e| e.to_string())?;
    Ok(format!("saved {} tokens to {}", s.kv.tokens.len(), path.display()))
}

fn load(conv: &mut Conversation, path: &Path, fingerprint: u64) -> Result<String, String> {
    let s = Session::load(path).map_err(|e| e.to_string())?;
    let n = s.kv.tokens.len();
    conv.restore_session(s, fingerprint).map_err(|e| e.to_string())?;
    Ok(format!("loaded {n} tokens from {}", path.display()))
}
