//! A grammar constraint in the sampler chain: before each draw the tokens the grammar does
//! not allow get a logit of -inf; the drawn token is then committed to the grammar. The
//! end-of-generation tokens are allowed exactly where the grammar may stop, and once it cannot
//! go on they are the only ones allowed.
//!
//! The matcher lives on a thread of its own: committing a token hands it over and returns at
//! once, and the thread computes the next mask while the forward pass for that token runs.
//! The sampler waits for the mask only when the logits are ready (computing a mask takes tens
//! of microseconds to a few milliseconds against a decode step of tens of milliseconds).
//!
//! A triggered grammar (`GrammarSpec::Triggered`) starts dormant: every token is allowed and
//! the committed text is watched for the trigger; once it appears, a matcher consumes the text
//! from the trigger on and the constraint applies from the next token.

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
    /// The text that set off a triggered grammar does not fit it.
    #[error("the text after the trigger does not fit the grammar: {0}")]
    AfterTrigger(String),
}

/// The matcher's worker and the latest mask.
struct Active {
    commits: Sender<u32>,
    masks: Receiver<Result<Allowed, String>>,
    /// Replies the worker owes or has sent that were not read yet (one per commit, and the
    /// first mask): only the last is the mask for the tokens committed so far.
    outstanding: usize,
    /// The mask for the tokens committed so far, once it has arrived.
    current: Option<Allowed>,
}

enum State {
    /// A triggered grammar before its trigger: the end of the text so far.
    Dormant { grammar: Grammar, trigger: Vec<u8>, seen: Vec<u8> },
    Active(Active),
}

/// One generation's grammar state.
pub struct Constraint {
    state: State,
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
        let eog = grammar.vocab().eog().to_vec();
        let state = match grammar.trigger() {
            Some(t) => State::Dormant { grammar: grammar.clone(), trigger: t.to_vec(), seen: Vec::new() },
            None => State::Active(Active::start(grammar.matcher())?),
        };
        Ok(Constraint { state, eog, n_committed: 0 })
    }

    /// Whether the grammar applies yet (a triggered one only after its trigger).
    pub fn active(&self) -> bool {
        matches!(self.state, State::Active(_))
    }

    /// Sets the logits of the tokens the grammar does not allow now to -inf (waiting for the
    /// mask if it is still being computed). A dormant grammar allows everything.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        let eog = self.eog.clone();
        let State::Active(a) = &mut self.state else { return Ok(()) };
        match a.wait()? {
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

    /// Commits a drawn token; the next mask is computed in the background. An
    /// end-of-generation token ends the generation and is not passed on. A dormant grammar
    /// watches for its trigger and wakes when the text holds it.
    pub fn commit(&mut self, id: u32) -> Result<(), ConstraintError> {
        if self.eog.binary_search(&id).is_ok() {
            return Ok(());
        }
        self.n_committed += 1;
        match &mut self.state {
            State::Active(a) => {
                if a.commits.send(id).is_err() {
                    // The worker ends only after reporting an error: that error is the answer.
                    return Err(a.failure());
                }
                a.outstanding += 1;
                a.current = None;
            }
            State::Dormant { grammar, trigger, seen } => {
                // `seen` holds only the bytes a trigger could still begin in: the last
                // `trigger.len() - 1` of the text before this token, and the token's.
                seen.extend_from_slice(grammar.token_bytes(id));
                if let Some(at) = seen.windows(trigger.len()).position(|w| w == trigger.as_slice()) {
                    let m = grammar.matcher_after(&seen[at..]).map_err(ConstraintError::AfterTrigger)?;
                    self.state = State::Active(Active::start(m)?);
                } else {
                    let keep = trigger.len() - 1;
                    seen.drain(..seen.len().saturating_sub(keep));
                }
            }
        }
        Ok(())
    }
}

impl Active {
    /// The worker for `m`; it computes the first mask at once.
    fn start(m: Matcher) -> Result<Active, ConstraintError> {
        let (commits, commit_rx) = channel();
        let (mask_tx, masks) = channel();
        std::thread::Builder::new()
            .name("minfer-grammar".into())
            .spawn(move || work(m, commit_rx, mask_tx))
            .map_err(|_| ConstraintError::WorkerGone)?;
        Ok(Active { commits, masks, outstanding: 1, current: None })
    }

    /// The mask for the tokens committed so far: the last reply the worker owes (earlier ones,
    /// for tokens committed without a mask read in between, are stale). An error in any reply
    /// is the answer: the grammar refused a token.
    fn wait(&mut self) -> Result<&Allowed, ConstraintError> {
        while self.current.is_none() {
            let got = self.masks.recv().map_err(|_| ConstraintError::WorkerGone)?;
            self.outstanding = self.outstanding.saturating_sub(1);
            match got {
                Err(e) => return Err(ConstraintError::Refused(e)),
                Ok(m) if self.outstanding == 0 => self.current = Some(m),
                Ok(_) => {}
            }
        }
        self.current.as_ref().ok_or(ConstraintError::WorkerGone)
    }

    /// Why the worker stopped: the error it reported.
    fn failure(&mut self) -> ConstraintError {
        while let Ok(r) = self.masks.recv() {
            if let Err(e) = r {
                return ConstraintError::Refused(e);
            }
        }
        ConstraintError::WorkerGone
    }
}
