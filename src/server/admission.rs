//! Admission: at most `slots + queue` requests are inside the server (generating or waiting
//! for a slot). The check is the first thing a generation request does after authentication,
//! before its body is parsed or tokenized, so a full server refuses work cheaply.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::error::ApiError;

#[derive(Debug)]
pub struct Admission {
    inside: AtomicUsize,
    slots: usize,
    queue: usize,
}

/// A place inside the server; given back when dropped (when the request's generation ends,
/// or when the request fails before reaching a slot).
#[derive(Debug)]
pub struct Ticket {
    adm: Arc<Admission>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.adm.inside.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    pub fn new(slots: usize, queue: usize) -> Arc<Admission> {
        Arc::new(Admission { inside: AtomicUsize::new(0), slots, queue })
    }

    /// A ticket, or `QueueFull` when every slot is busy and the queue is full.
    pub fn try_admit(self: &Arc<Self>) -> Result<Ticket, ApiError> {
        let cap = self.slots.saturating_add(self.queue);
        self.inside
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < cap).then_some(n + 1))
            .map_err(|n| ApiError::QueueFull { slots: self.slots, queued: n.saturating_sub(self.slots), queue: self.queue })?;
        Ok(Ticket { adm: self.clone() })
    }

    /// Requests inside (generating or queued).
    pub fn inside(&self) -> usize {
        self.inside.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_slots_plus_queue_and_frees_on_drop() {
        let a = Admission::new(2, 1);
        let t: Vec<Ticket> = (0..3).map(|_| a.try_admit().unwrap()).collect();
        assert_eq!(a.try_admit().unwrap_err(), ApiError::QueueFull { slots: 2, queued: 1, queue: 1 });
        drop(t);
        assert_eq!(a.inside(), 0);
        assert!(a.try_admit().is_ok());
    }
}
