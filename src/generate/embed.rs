//! Embeddings: a text's final hidden states (after the output norm, llama.cpp's `t_embd`),
//! pooled into one vector per input the way llama.cpp pools them, and normalised the way its
//! server does (`common_embd_normalize`).
//!
//! A generative model has no pooling of its own (no `{arch}.pooling_type` key): minfer then
//! pools the last token's state, which under causal attention is the only one that has seen the
//! whole input (what decoder embedding models such as Qwen3-Embedding train for).

use std::fmt;
use std::str::FromStr;

use super::{Engine, EngineError, SeqChunk};
use crate::gguf::GgufFile;

/// How per-token hidden states become one vector (llama.cpp's `llama_pooling_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's state, no pooling (llama-server's `/embedding` only).
    None,
    /// The average of the tokens' states.
    Mean,
    /// The first token's state.
    Cls,
    /// The last token's state.
    Last,
}

impl Pooling {
    pub const NAMES: &'static str = "none, mean, cls, last";

    pub const fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// The file's `{arch}.pooling_type` (llama.cpp's numbering: 0 none, 1 mean, 2 cls, 3 last,
    /// 4 rank), else [`Pooling::Last`]. A rank head (a classifier, not an embedding) or an
    /// unknown number is an error.
    pub fn of_model(file: &GgufFile) -> Result<Pooling, EmbedError> {
        let arch = file.opt_str("general.architecture").ok().flatten().unwrap_or_default();
        let key = format!("{arch}.pooling_type");
        if file.get(&key).is_none() {
            return Ok(Pooling::Last);
        }
        match file.get_u32(&key) {
            Ok(0) => Ok(Pooling::None),
            Ok(1) => Ok(Pooling::Mean),
            Ok(2) => Ok(Pooling::Cls),
            Ok(3) => Ok(Pooling::Last),
            Ok(n) => Err(EmbedError::UnsupportedPooling { key, value: n }),
            Err(_) => Err(EmbedError::UnsupportedPooling { key, value: u32::MAX }),
        }
    }
}

impl fmt::Display for Pooling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Pooling {
    type Err = EmbedError;
    fn from_str(s: &str) -> Result<Pooling, EmbedError> {
        match s {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            other => Err(EmbedError::BadPoolingName { name: other.to_string() }),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("unknown pooling {name:?} (expected one of: {})", Pooling::NAMES)]
    BadPoolingName { name: String },
    #[error("the model's {key} is {value}: only none (0), mean (1), cls (2) and last (3) pool embeddings")]
    UnsupportedPooling { key: String, value: u32 },
    #[error("nothing to embed: the input has no tokens")]
    Empty,
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The hidden states of `tokens` pooled by `pooling`: one vector (`n_embd` wide), or one per
/// token for [`Pooling::None`]. Evaluated on sequence `seq` from an empty KV (the sequence is
/// truncated first; afterwards it holds `tokens`), in chunks of the engine's `n_ubatch`.
/// Mean pooling sums in f64.
pub fn embed(engine: &mut Engine, seq: usize, tokens: &[u32], pooling: Pooling) -> Result<Vec<Vec<f32>>, EmbedError> {
    if tokens.is_empty() {
        return Err(EmbedError::Empty);
    }
    let n_embd = engine.n_embd();
    engine.seq_truncate(seq, 0)?;
    let ub = engine.n_ubatch().max(1);
    let n_chunks = tokens.len().div_ceil(ub);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    let mut sum = vec![0f64; if pooling == Pooling::Mean { n_embd } else { 0 }];
    for (k, part) in tokens.chunks(ub).enumerate() {
        let n = part.len();
        let wanted = match pooling {
            Pooling::None | Pooling::Mean => 0..n,
            Pooling::Cls if k == 0 => 0..1,
            // Later chunks only fill the KV: their last row is the cheapest to produce.
            Pooling::Cls | Pooling::Last => n - 1..n,
        };
        let hidden = engine.eval_hidden(SeqChunk { seq, tokens: part }, wanted)?; // [rows][n_embd]
        match pooling {
            Pooling::None => rows.extend(hidden.chunks_exact(n_embd).map(<[f32]>::to_vec)),
            Pooling::Mean => {
                for row in hidden.chunks_exact(n_embd) {
                    sum.iter_mut().zip(row).for_each(|(s, &x)| *s += f64::from(x));
                }
            }
            Pooling::Cls if k == 0 => rows.push(hidden),
            Pooling::Cls => {}
            Pooling::Last if k + 1 == n_chunks => rows.push(hidden),
            Pooling::Last => {}
        }
    }
    if pooling == Pooling::Mean {
        let n = tokens.len() as f64;
        rows.push(sum.iter().map(|&s| (s / n) as f32).collect());
    }
    Ok(rows)
}

/// Scales `v` the way llama.cpp's `common_embd_normalize` does: `-1` leaves it, `0` scales the
/// largest magnitude to 32760 (an int16 range), `2` to unit Euclidean length, any other `p` to
/// unit p-norm. A zero vector stays zero.
pub fn normalize(v: &mut [f32], norm: i32) {
    let sum: f64 = match norm {
        -1 => 1.0,
        0 => v.iter().fold(0f64, |m, &x| m.max(f64::from(x.abs()))) / 32760.0,
        2 => v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt(),
        p => v.iter().map(|&x| f64::from(x.abs()).powi(p)).sum::<f64>().powf(1.0 / f64::from(p)),
    };
    let scale = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    v.iter_mut().for_each(|x| *x *= scale);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_matches_hand_values() {
        let mut v = [3.0f32, -4.0];
        normalize(&mut v, 2);
        assert_eq!(v, [0.6, -0.8]);
        let mut v = [3.0f32, -4.0];
        normalize(&mut v, -1);
        assert_eq!(v, [3.0, -4.0]);
        let mut v = [1.0f32, -2.0];
        normalize(&mut v, 0);
        assert_eq!(v, [16380.0, -32760.0]);
        // p = 1: |3| + |-4| = 7.
        let mut v = [3.0f32, -4.0];
        normalize(&mut v, 1);
        assert!((v[0] - 3.0 / 7.0).abs() < 1e-7 && (v[1] + 4.0 / 7.0).abs() < 1e-7);
        let mut z = [0.0f32; 3];
        normalize(&mut z, 2);
        assert_eq!(z, [0.0; 3]);
    }

    #[test]
    fn pooling_names_round_trip() {
        for p in [Pooling::None, Pooling::Mean, Pooling::Cls, Pooling::Last] {
            assert_eq!(p.name().parse::<Pooling>().unwrap(), p);
        }
        assert!(matches!("rank".parse::<Pooling>(), Err(EmbedError::BadPoolingName { .. })));
    }
}
