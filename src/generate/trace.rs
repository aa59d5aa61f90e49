//! Recording a run node by node: `MINFER_TRACE=PATH` and the visualizer's live mode.
//!
//! An [`Engine`](super::Engine) holding a [`TraceRecorder`] executes every evaluation with an
//! observer ([`crate::graph::BackendScheduler::execute_observed`]) that captures each node's
//! output ([`NodeTrace`]) right after it ran. Evaluations are grouped into *phases*: consecutive
//! evaluations of the same graph (same [`GraphParams`]), so a run is typically one prefill phase
//! and one decode phase, each carrying its graph export once. The trace file is
//!
//! ```text
//! {"format": "minfer-trace", "version": 1, "model", "prompt", "max_values",
//!  "phases": [{"kind", "graph": <minfer-graph>, "steps": [
//!     {"n_past", "input": [ids], "token", "text", "logits_top": [{"id", "logit", "text"}],
//!      "nodes": [{"id", "dtype", "stats", "values", "stride", "n"}]}]}]}
//! ```
//! `token`/`text` are the step's last input token (the one whose logits the step produced);
//! `logits_top` is the prediction from it. `docs/minfer-trace.schema.json` is the schema.
//!
//! A sink sees the same data as it is captured ([`TraceEvent`]); `minfer viz` streams it.
//!
//! The file is written through [`super::durable`]: [`TraceOptions::create`] opens its
//! temporary file before the run (so a trace that could not be saved fails the run before it
//! computes anything), and [`TraceRecorder::write`] renames it into place once complete, so an
//! earlier trace under the name survives a failed write and no reader sees half a trace.

use std::io::Write;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::graph::{CNode, ComputeGraph, DEFAULT_TRACE_VALUES, GraphParams, GraphType, NodeTrace};
use crate::models::Model;
use super::durable::{AtomicFile, AtomicWrite, DurableError};
use super::sampler::top_logits;
use crate::tokenizer::Tokenizer;

pub const TRACE_FORMAT: &str = "minfer-trace";
pub const TRACE_VERSION: u64 = 1;
/// Entries of `logits_top`.
pub const LOGITS_TOP: usize = 10;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("MINFER_TRACE_VALUES={value:?}: expected the number of values kept per node (at least 1)")]
    BadValues { value: String },
    /// The error names the trace file.
    #[error("cannot write trace {0}")]
    Write(#[from] DurableError),
}

/// `MINFER_TRACE=PATH` (where the trace is written) and `MINFER_TRACE_VALUES=N` (samples per
/// node, default [`DEFAULT_TRACE_VALUES`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceOptions {
    pub path: PathBuf,
    pub max_values: usize,
}

impl TraceOptions {
    /// `None` when `MINFER_TRACE` is unset or empty.
    pub fn from_env() -> Result<Option<TraceOptions>, TraceError> {
        let Some(path) = std::env::var_os("MINFER_TRACE").filter(|p| !p.is_empty()) else {
            return Ok(None);
        };
        Ok(Some(TraceOptions { path: path.into(), max_values: TraceOptions::values_from_env()? }))
    }

    /// `MINFER_TRACE_VALUES`, else [`DEFAULT_TRACE_VALUES`]; not a number of at least 1 is an
    /// error.
    pub fn values_from_env() -> Result<usize, TraceError> {
        match std::env::var("MINFER_TRACE_VALUES") {
            Err(_) => Ok(DEFAULT_TRACE_VALUES),
            Ok(v) => match v.trim().parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(TraceError::BadValues { value: v }),
            },
        }
    }

    /// Opens the trace's temporary file beside [`path`](Self::path): a run that could not save
    /// its trace fails before it computes anything. The file appears under `path` only when
    /// [`TraceRecorder::write`] completes.
    pub fn create(&self) -> Result<AtomicFile, TraceError> {
        self.create_with(&AtomicWrite::default())
    }

    /// [`create`](Self::create) with explicit write settings (tests inject failures through
    /// them).
    pub fn create_with(&self, how: &AtomicWrite) -> Result<AtomicFile, TraceError> {
        Ok(how.create(&self.path)?)
    }
}

/// One evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceStep {
    /// Tokens in the KV before this evaluation (the first input's position).
    pub n_past: usize,
    pub input: Vec<u32>,
    /// The most likely next tokens after the last input, `(id, logit)`, best first.
    pub logits_top: Vec<(u32, f32)>,
    /// Captured nodes in execution order (inputs first).
    pub nodes: Vec<NodeTrace>,
}

/// Consecutive evaluations of one graph.
#[derive(Debug, Clone, PartialEq)]
pub struct TracePhase {
    pub params: GraphParams,
    /// The graph's `minfer-graph` export (backends and fusion as executed).
    pub graph: Value,
    pub steps: Vec<TraceStep>,
}

impl TracePhase {
    pub fn kind(&self) -> &'static str {
        match self.params.gtype {
            GraphType::Prefill => "prefill",
            GraphType::Decode => "decode",
        }
    }
}

/// What a sink sees, as it happens. Indices count phases and steps within a phase from 0.
#[derive(Debug, Clone, Copy)]
pub enum TraceEvent<'a> {
    /// A new phase starts; its graph follows before any of its nodes.
    Phase { phase: usize, kind: &'static str, graph: &'a Value },
    /// A step starts: the inputs are filled, nothing has run yet.
    StepStart { phase: usize, step: usize, n_past: usize, input: &'a [u32] },
    /// A node ran.
    Node { phase: usize, step: usize, node: &'a NodeTrace },
    /// The step's logits are read (every node was sent before).
    StepEnd { phase: usize, step: usize, trace: &'a TraceStep },
}

/// Receives [`TraceEvent`]s while the engine runs (on the evaluating thread).
pub type TraceSink = Box<dyn FnMut(TraceEvent<'_>) + Send>;

/// Collects the phases of a run; see the module docs.
pub struct TraceRecorder {
    max_values: usize,
    phases: Vec<TracePhase>,
    sink: Option<TraceSink>,
}

impl std::fmt::Debug for TraceRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceRecorder")
            .field("max_values", &self.max_values)
            .field("phases", &self.phases.len())
            .field("sink", &self.sink.is_some())
            .finish()
    }
}

impl TraceRecorder {
    /// Keeps at most `max_values` (at least 1) samples per node.
    pub fn new(max_values: usize) -> TraceRecorder {
        TraceRecorder { max_values: max_values.max(1), phases: Vec::new(), sink: None }
    }

    pub fn with_sink(mut self, sink: TraceSink) -> TraceRecorder {
        self.sink = Some(sink);
        self
    }

    pub fn phases(&self) -> &[TracePhase] {
        &self.phases
    }

    /// Starts a step of `graph` (built from `params`, inputs filled); a new phase, carrying the
    /// graph's export, when the previous step ran other params.
    pub(crate) fn begin_step(&mut self, params: &GraphParams, graph: &ComputeGraph, model: &Model, n_past: usize, input: &[u32]) {
        // The sink and the phases are borrowed apart: events point into what was recorded.
        if self.phases.last().is_none_or(|p| p.params != *params) {
            let graph = graph.export_json(Some(params), Some(&model.display_name()));
            self.phases.push(TracePhase { params: *params, graph, steps: Vec::new() });
            let (phase, p) = (self.phases.len() - 1, &self.phases[self.phases.len() - 1]);
            if let Some(sink) = &mut self.sink {
                sink(TraceEvent::Phase { phase, kind: p.kind(), graph: &p.graph });
            }
        }
        let phase = self.phases.len() - 1;
        let steps = &mut self.phases[phase].steps;
        steps.push(TraceStep { n_past, input: input.to_vec(), logits_top: Vec::new(), nodes: Vec::new() });
        let step = steps.len() - 1;
        if let Some(sink) = &mut self.sink {
            sink(TraceEvent::StepStart { phase, step, n_past, input });
        }
    }

    /// Captures `node`'s output into the open step (untraced nodes are ignored).
    pub(crate) fn observe(&mut self, node: &CNode, data: &[f32]) {
        let Some(t) = NodeTrace::capture(node, data, self.max_values) else {
            return;
        };
        let Some((phase, step)) = self.open_step() else {
            return;
        };
        if let Some(sink) = &mut self.sink {
            sink(TraceEvent::Node { phase, step, node: &t });
        }
        self.phases[phase].steps[step].nodes.push(t);
    }

    /// Closes the open step with the logits of its last token.
    pub(crate) fn end_step(&mut self, last_logits: &[f32]) {
        let Some((phase, step)) = self.open_step() else {
            return;
        };
        self.phases[phase].steps[step].logits_top = top_logits(last_logits, LOGITS_TOP, |l| !l.is_nan());
        if let Some(sink) = &mut self.sink {
            sink(TraceEvent::StepEnd { phase, step, trace: &self.phases[phase].steps[step] });
        }
    }

    /// Drops the open step (its evaluation failed), and its phase when that was its only step.
    pub(crate) fn abort_step(&mut self) {
        if let Some(p) = self.phases.last_mut() {
            p.steps.pop();
            if p.steps.is_empty() {
                self.phases.pop();
            }
        }
    }

    fn open_step(&self) -> Option<(usize, usize)> {
        let phase = self.phases.len().checked_sub(1)?;
        let step = self.phases[phase].steps.len().checked_sub(1)?;
        Some((phase, step))
    }

    /// Writes the trace document (module docs; token texts from `tok`) to `w`, one node at a
    /// time: a long trace is never held as one JSON value.
    pub fn write_json(&self, w: &mut dyn Write, model: &str, prompt: &str, tok: &Tokenizer) -> std::io::Result<()> {
        let head = json!({
            "format": TRACE_FORMAT, "version": TRACE_VERSION, "model": model, "prompt": prompt,
            "max_values": self.max_values,
        });
        write_open_object(w, &head)?;
        w.write_all(b",\"phases\":[")?;
        for (i, p) in self.phases.iter().enumerate() {
            if i > 0 {
                w.write_all(b",")?;
            }
            write_open_object(w, &json!({ "kind": p.kind(), "graph": p.graph }))?;
            w.write_all(b",\"steps\":[")?;
            for (j, s) in p.steps.iter().enumerate() {
                if j > 0 {
                    w.write_all(b",")?;
                }
                write_open_object(w, &step_summary_json(s, tok))?;
                w.write_all(b",\"nodes\":[")?;
                for (k, n) in s.nodes.iter().enumerate() {
                    if k > 0 {
                        w.write_all(b",")?;
                    }
                    serde_json::to_writer(&mut *w, &n.to_json())?;
                }
                w.write_all(b"]}")?;
            }
            w.write_all(b"]}")?;
        }
        w.write_all(b"]}")
    }

    /// [`write_json`](Self::write_json) into memory.
    pub fn to_json_bytes(&self, model: &str, prompt: &str, tok: &Tokenizer) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = self.write_json(&mut out, model, prompt, tok);
        out
    }

    /// Writes [`write_json`](Self::write_json) into `file` (opened by [`TraceOptions::create`])
    /// and renames it over its target; on an error the target is left as it was.
    pub fn write(&self, file: AtomicFile, model: &str, prompt: &str, tok: &Tokenizer) -> Result<(), TraceError> {
        file.commit_with(|w| self.write_json(w, model, prompt, tok))?;
        Ok(())
    }
}

/// Writes a JSON object without its closing brace, so that more members can follow.
fn write_open_object(w: &mut dyn Write, obj: &Value) -> std::io::Result<()> {
    let text = obj.to_string();
    w.write_all(text.strip_suffix('}').unwrap_or(&text).as_bytes())
}

/// A token's text with special tokens rendered ([`Tokenizer::decode`]); empty for an id the
/// vocabulary does not have.
pub fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id]).unwrap_or_default()
}

/// `logits_top` as JSON: `[{id, logit, text}]`.
pub fn logits_top_json(top: &[(u32, f32)], tok: &Tokenizer) -> Value {
    top.iter().map(|&(id, logit)| json!({ "id": id, "logit": logit, "text": token_text(tok, id) })).collect()
}

/// A step without its nodes: `{n_past, input, token, text, logits_top}`.
pub fn step_summary_json(s: &TraceStep, tok: &Tokenizer) -> Value {
    let token = s.input.last().copied();
    json!({
        "n_past": s.n_past, "input": s.input, "token": token,
        "text": token.map(|t| token_text(tok, t)), "logits_top": logits_top_json(&s.logits_top, tok),
    })
}
