//! Text generation: sampling, stop conditions, and the prefill → decode loop.

mod constraint;
mod conversation;
pub mod durable;
mod embed;
mod engine;
mod logprobs;
mod rng;
mod run;
mod sampler;
pub mod session;
mod speculative;
mod stop;
pub mod trace;

pub use constraint::{Constraint, ConstraintError};
pub use conversation::{Conversation, ConversationError, ConversationParams, Turn, TurnStats};
pub use durable::{AtomicFile, AtomicWrite, DurableError, write_atomic};
pub use embed::{EmbedError, Pooling, embed, normalize};
pub use engine::kv::KvSnapshot;
pub use engine::{DEFAULT_UBATCH, RESERVED_OUTPUTS, Engine, EngineError, EngineParams, EngineShared, EvalInfo, NodeDump, SeqChunk, default_threads, trace_from_env};
pub use rng::SampleRng;
pub use logprobs::{TokenLogprobs, token_logprobs};
pub use run::{GenerateError, GenerateParams, Generation, Generator, NextPass, Pass, StepOutput, StopReason, generate};
pub use sampler::{Sampler, SamplerError, SamplerParams, TokenDist, argmax, top_logits};
pub use speculative::{DraftParams, SpecError, SpecStats, Speculator, check_vocab, generate_speculative, run_speculative};
pub use stop::{StopOutcome, StopStrings};
pub use trace::{TraceError, TraceEvent, TraceOptions, TracePhase, TraceRecorder, TraceSink, TraceStep};
pub(crate) use stop::longest_suffix_prefix;
