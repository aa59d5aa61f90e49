//! Text generation: sampling, stop conditions, and the prefill → decode loop.

mod rng;
mod sampler;
mod stop;

pub use rng::SampleRng;
pub use sampler::{Sampler, SamplerError, SamplerParams, argmax};
pub use stop::{StopOutcome, StopStrings};
