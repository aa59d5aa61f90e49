//! The CPU worker pool.
//!
//! Work is split by ownership: a caller hands the pool `n` independent items (matmul output
//! rows, attention heads) and every item is computed whole by one worker with the same code,
//! whatever the number of threads. No value is ever reduced across workers, so results are
//! bit-identical for any thread count.

use std::ops::Range;

/// A fixed-size pool of worker threads (rayon underneath).
pub struct Pool {
    inner: rayon::ThreadPool,
    n_threads: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot start {n_threads} worker threads: {reason}")]
pub struct PoolError {
    pub n_threads: usize,
    pub reason: String,
}

impl Pool {
    /// A pool of `n_threads` workers (at least 1).
    pub fn new(n_threads: usize) -> Result<Pool, PoolError> {
        let n_threads = n_threads.max(1);
        let inner = rayon::ThreadPoolBuilder::new()
            .num_threads(n_threads)
            .thread_name(|i| format!("minfer-worker-{i}"))
            .build()
            .map_err(|e| PoolError { n_threads, reason: e.to_string() })?;
        Ok(Pool { inner, n_threads })
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f` on one of the pool's workers and returns its result. Parallel calls made inside
    /// `f` ([`Pool::for_each_range`], [`Pool::for_each_item_mut`]) then start from a worker:
    /// the other workers pick the pieces up while still spinning, instead of each call waking
    /// the pool from outside and sleeping until it is done. Wrap a whole forward pass in it.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.inner.install(f)
    }

    /// Calls `f` on contiguous chunks that together cover `0..n` exactly once, each chunk at
    /// least `min_chunk` long (except a short last one). The chunking may depend on the thread
    /// count, so `f` must compute every item of its range independently of the range's bounds.
    pub fn for_each_range(&self, n: usize, min_chunk: usize, f: impl Fn(Range<usize>) + Sync) {
        if n == 0 {
            return;
        }
        let min_chunk = min_chunk.max(1);
        // A few chunks per thread, so a slow worker does not hold the others back.
        let target = (self.n_threads * 4).max(1);
        let chunk = n.div_ceil(target).max(min_chunk);
        let n_chunks = n.div_ceil(chunk);
        if n_chunks == 1 || self.n_threads == 1 {
            f(0..n);
            return;
        }
        self.inner.scope(|s| {
            for c in 0..n_chunks {
                let f = &f;
                s.spawn(move |_| f(c * chunk..((c + 1) * chunk).min(n)));
            }
        });
    }

    /// [`Pool::for_each_item_mut`] with scratch state: `init()` makes one `S` per run of
    /// consecutive items a worker takes, and `f` gets it `&mut` for each of them (the unpacked
    /// weight tiles of a matrix product reuse their buffers this way).
    pub fn for_each_item_mut_with<T: Send, S>(
        &self,
        out: &mut [T],
        item_len: usize,
        init: impl Fn() -> S + Sync,
        f: impl Fn(&mut S, usize, &mut [T]) + Sync,
    ) {
        use rayon::prelude::*;
        if item_len == 0 {
            return;
        }
        if self.n_threads == 1 {
            let mut scratch = init();
            out.chunks_mut(item_len).enumerate().for_each(|(i, c)| f(&mut scratch, i, c));
            return;
        }
        self.inner.install(|| {
            out.par_chunks_mut(item_len).enumerate().for_each_init(&init, |scratch, (i, c)| f(scratch, i, c))
        });
    }

    /// Splits `out` into consecutive pieces of `item_len` values (one per item) and calls
    /// `f(item_index, piece)` for each, in parallel.
    pub fn for_each_item_mut<T: Send>(&self, out: &mut [T], item_len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
        use rayon::prelude::*;
        if item_len == 0 {
            return;
        }
        if self.n_threads == 1 {
            out.chunks_mut(item_len).enumerate().for_each(|(i, c)| f(i, c));
            return;
        }
        self.inner.install(|| out.par_chunks_mut(item_len).enumerate().for_each(|(i, c)| f(i, c)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn ranges_cover_each_item_once() {
        for threads in 1..4 {
            let pool = Pool::new(threads).unwrap();
            for n in [0, 1, 7, 100, 1031] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.for_each_range(n, 3, |r| r.for_each(|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                }));
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n {n} threads {threads}");
            }
        }
    }

    #[test]
    fn items_get_their_own_piece() {
        let pool = Pool::new(3).unwrap();
        let mut out = vec![0usize; 40];
        pool.for_each_item_mut(&mut out, 4, |i, piece| piece.iter_mut().for_each(|x| *x = i));
        assert_eq!(out, (0..40).map(|j| j / 4).collect::<Vec<_>>());
    }
}
