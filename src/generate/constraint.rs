//! A grammar constraint in the sampler chain: before each draw the tokens the grammar does
//! not allow get a logit of -inf; the drawn token is then committed to the grammar. The
//! end-of-generation tokens are allowed exactly where the grammar may stop, and once it cannot
//! go on they are the only ones allowed.
//!
//! The matcher lives on a thread of its own: committing a token hands it over and returns at
//! once, and the thread computes the next mask while the forward pass for that token runs.
//! The sampler waits for the mask only when the logits are ready (computing a mask takes tens
//! of microseconds to a few milliseconds against a decode step of tens of milliseconds).

use std::sync::mpsc::{Receiver, Sender, channel};

use crate::grammar::{Grammar, Matcher, TokenMask};

/// What the grammar allows next.
#[derive(Debug)]
enum Allowed {
    Tokens(TokenMask),
    /// The grammar is complete and cannot go on: only an end-of-generation token.
    EndOnly,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConstraintError {
    /// The grammar refused a token (only a token the mask did not allow can do that).
    #[error("the grammar refused the token: {0}")]
    Refused(String),
    #[error("the grammar allows no token here")]
    Stuck,
    #[error("the grammar's worker thread stopped")]
    WorkerGone,
}

/// One generation's grammar state.
pub struct Constraint {
    commits: Sender<u32>,
    masks: Receiver<Result<Allowed, String>>,
    /// The mask for the tokens committed so far, once it has arrived.
    current: Option<Allowed>,
    eog: Vec<u32>,
    /// Tokens committed.
    n_committed: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("n_committed", &self.n_committed).finish_non_exhaustive()
    }
}

/// The worker: the mask at the start, then one per committed token; ends when the
/// constraint is dropped.
fn work(mut m: Matcher, commits: Receiver<u32>, masks: Sender<Result<Allowed, String>>) {
    let next = |m: &mut Matcher| -> Result<Allowed, String> {
        if m.is_stopped() {
            return Ok(Allowed::EndOnly);
        }
        m.compute_mask().map(Allowed::Tokens).map_err(|e| e.to_string())
    };
    if masks.send(next(&mut m)).is_err() {
        return;
    }
    while let Ok(id) = commits.recv() {
        let r = m.consume_token(id).map_err(|e| e.to_string()).and_then(|()| next(&mut m));
        let failed = r.is_err();
        if masks.send(r).is_err() || failed {
            return;
        }
    }
}

impl Constraint {
    /// Starts a matcher for `grammar`; its first mask is computed at once, while the prompt
    /// is evaluated.
    pub fn new(grammar: &Grammar) -> Result<Constraint, ConstraintError> {
        let (commits, commit_rx) = channel();
        let (mask_tx, masks) = channel();
        let m = grammar.matcher();
        std::thread::Builder::new()
            .name("minfer-grammar".into())
            .spawn(move || work(m, commit_rx, mask_tx))
            .map_err(|_| ConstraintError::WorkerGone)?;
        Ok(Constraint { commits, masks, current: None, eog: grammar.vocab().eog().to_vec(), n_committed: 0 })
    }

    fn wait(&mut self) -> Result<&Allowed, ConstraintError> {
        if self.current.is_none() {
            let got = self.masks.recv().map_err(|_| ConstraintError::WorkerGone)?;
            self.current = Some(got.map_err(ConstraintError::Refused)?);
        }
        self.current.as_ref().ok_or(ConstraintError::WorkerGone)
    }

    /// Sets the logits of the tokens the grammar does not allow now to -inf (waiting for the
    /// mask if it is still being computed).
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        let eog = self.eog.clone();
        match self.wait()? {
            Allowed::Tokens(mask) => {
                let words = mask.as_slice();
                let mut any = false;
                for (chunk, &word) in logits.chunks_mut(32).zip(words.iter().chain(std::iter::repeat(&0))) {
                    match word {
                        0 => chunk.fill(f32::NEG_INFINITY),
                        u32::MAX => any = true,
                        _ => {
                            any = true;
                            for (bit, l) in chunk.iter_mut().enumerate() {
                                if word >> bit & 1 == 0 {
                                    *l = f32::NEG_INFINITY;
                                }
                            }
                        }
                    }
                }
                if !any {
                    return Err(ConstraintError::Stuck);
                }
            }
            Allowed::EndOnly => {
                for (id, l) in logits.iter_mut().enumerate() {
                    if eog.binary_search(&(id as u32)).is_err() {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether the grammar allows `id` now (waiting for the mask if need be).
    pub fn allows(&mut self, id: u32) -> Result<bool, ConstraintError> {
        let is_eog = self.eog.binary_search(&id).is_ok();
        Ok(match self.wait()? {
            Allowed::Tokens(mask) => (id as usize) < mask.len() && mask.is_allowed(id),
            Allowed::EndOnly => is_eog,
        })
    }

    /// Commits a drawn token; the next mask is computed in the background. An
    /// end-of-generation token ends the generation and is not passed on.
    pub fn commit(&mut self, id: u32) -> Result<(), ConstraintError> {
        if self.eog.binary_search(&id).is_ok() {
            return Ok(());
        }
        self.commits.send(id).map_err(|_| ConstraintError::WorkerGone)?;
        self.current = None;
        self.n_committed += 1;
        Ok(())
    }
}
