//! Server counters, exported at `GET /metrics` in the Prometheus text format.
//!
//! Requests are counted by their HTTP status when the response (or, for a stream, its
//! header) is sent; tokens and seconds are counted by the inference thread as each forward
//! pass completes, so they include work for clients that went away.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    by_status: Mutex<BTreeMap<u16, u64>>,
    prompt_tokens: AtomicU64,
    /// Prompt tokens found in a slot's KV (prompt caching) and not evaluated.
    cached_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    /// Nanoseconds of prefill and decode forward passes.
    prompt_nanos: AtomicU64,
    gen_nanos: AtomicU64,
    /// Speculative decoding: tokens the draft model proposed, and those accepted.
    draft_tokens: AtomicU64,
    draft_accepted: AtomicU64,
    /// Drafting rounds (each proposes some tokens).
    drafts: AtomicU64,
    /// Requests admitted and waiting for a slot.
    queued: AtomicUsize,
    busy_slots: AtomicUsize,
    /// Generations stopped because their client went away.
    cancelled: AtomicU64,
    /// Panics caught inside inference.
    panics: AtomicU64,
    timeouts: AtomicU64,
    n_slots: AtomicUsize,
    /// Forward passes with a slot's tokens (llama-server's `n_decode_total`), and the most
    /// tokens one of them held.
    passes: AtomicU64,
    max_pass_tokens: AtomicU64,
    /// Connections open now, and those refused by `--max-connections`.
    connections: AtomicUsize,
    connections_refused: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Metrics {
    pub fn request(&self, status: u16) {
        let mut m = self.by_status.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(status).or_default() += 1;
    }

    fn pass(&self, tokens: usize) {
        add(&self.passes, 1);
        self.max_pass_tokens.fetch_max(tokens as u64, Ordering::Relaxed);
    }

    pub fn prompt(&self, tokens: usize, secs: f64) {
        self.pass(tokens);
        add(&self.prompt_tokens, tokens as u64);
        add(&self.prompt_nanos, (secs * 1e9) as u64);
    }

    pub fn cached(&self, tokens: usize) {
        add(&self.cached_tokens, tokens as u64);
    }

    pub fn drafted(&self, proposed: usize, accepted: usize) {
        add(&self.draft_tokens, proposed as u64);
        add(&self.drafts, u64::from(proposed > 0));
        add(&self.draft_accepted, accepted as u64);
    }

    pub fn generated(&self, tokens: usize, secs: f64) {
        self.pass(tokens);
        add(&self.generated_tokens, tokens as u64);
        add(&self.gen_nanos, (secs * 1e9) as u64);
    }

    pub fn queued_add(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
    }

    pub fn queued_sub(&self) {
        self.queued.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Slots generating now.
    pub fn busy_slots(&self) -> usize {
        self.busy_slots.load(Ordering::Relaxed)
    }

    pub fn set_busy(&self, n: usize) {
        self.busy_slots.store(n, Ordering::Relaxed);
    }

    pub fn set_slots(&self, n: usize) {
        self.n_slots.store(n, Ordering::Relaxed);
    }

    pub fn cancelled(&self) {
        add(&self.cancelled, 1);
    }

    pub fn panicked(&self) {
        add(&self.panics, 1);
    }

    pub fn timed_out(&self) {
        add(&self.timeouts, 1);
    }

    pub fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_closed(&self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn connection_refused(&self) {
        add(&self.connections_refused, 1);
    }

    /// The Prometheus text exposition; `inside` is the admission's count of requests
    /// generating or queued ([`super::admission::Admission::inside`]).
    pub fn render(&self, inside: usize) -> String {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let secs = |c: &AtomicU64| load(c) as f64 / 1e9;
        let rate = |n: &AtomicU64, t: &AtomicU64| if load(t) > 0 { load(n) as f64 / secs(t) } else { 0.0 };
        let mut s = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, String)]| {
            let _ = writeln!(s, "# HELP minfer_{name} {help}\n# TYPE minfer_{name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(s, "minfer_{name}{labels} {value}");
            }
        };
        let one = |v: String| vec![(String::new(), v)];
        let by_status: Vec<(String, String)> = self
            .by_status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(code, n)| (format!("{{status=\"{code}\"}}"), n.to_string()))
            .collect();
        metric("requests_total", "counter", "HTTP requests answered, by status.", &by_status);
        metric("prompt_tokens_total", "counter", "Prompt tokens evaluated.", &one(load(&self.prompt_tokens).to_string()));
        metric("prompt_cached_tokens_total", "counter", "Prompt tokens taken from a slot's KV (prompt caching), not evaluated.", &one(load(&self.cached_tokens).to_string()));
        metric("generated_tokens_total", "counter", "Tokens generated.", &one(load(&self.generated_tokens).to_string()));
        metric("draft_tokens_total", "counter", "Tokens proposed by the draft model (speculative decoding).", &one(load(&self.draft_tokens).to_string()));
        metric("draft_accepted_total", "counter", "Draft tokens the model accepted.", &one(load(&self.draft_accepted).to_string()));
        metric("prompt_seconds_total", "counter", "Time spent evaluating prompts.", &one(format!("{:.6}", secs(&self.prompt_nanos))));
        metric("generation_seconds_total", "counter", "Time spent generating tokens.", &one(format!("{:.6}", secs(&self.gen_nanos))));
        metric(
            "prompt_tokens_per_second",
            "gauge",
            "Prompt tokens per second of prefill time, since start.",
            &one(format!("{:.3}", rate(&self.prompt_tokens, &self.prompt_nanos))),
        );
        metric(
            "generated_tokens_per_second",
            "gauge",
            "Generated tokens per second of decode time, since start.",
            &one(format!("{:.3}", rate(&self.generated_tokens, &self.gen_nanos))),
        );
        metric("queue_depth", "gauge", "Requests waiting for a slot.", &one(self.queued().to_string()));
        metric("slots_busy", "gauge", "Slots generating.", &one(self.busy_slots.load(Ordering::Relaxed).to_string()));
        metric("slots_total", "gauge", "Slots.", &one(self.n_slots.load(Ordering::Relaxed).to_string()));
        metric("cancelled_total", "counter", "Generations stopped because the client went away.", &one(load(&self.cancelled).to_string()));
        metric("timeouts_total", "counter", "Requests stopped by --timeout.", &one(load(&self.timeouts).to_string()));
        metric("panics_total", "counter", "Panics caught inside inference.", &one(load(&self.panics).to_string()));
        metric("connections_open", "gauge", "HTTP connections open.", &one(self.connections.load(Ordering::Relaxed).to_string()));
        metric("connections_refused_total", "counter", "Connections refused by --max-connections.", &one(load(&self.connections_refused).to_string()));
        metric("requests_inside", "gauge", "Generation requests admitted (generating or queued).", &one(inside.to_string()));
        // The same figures under llama-server's names, for dashboards made for it.
        let busy = self.busy_slots.load(Ordering::Relaxed);
        let llama: [(&str, &str, &str, String); 15] = [
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", load(&self.prompt_tokens).to_string()),
            ("prompt_tokens_cached_total", "counter", "Number of prompt tokens taken from the cache.", load(&self.cached_tokens).to_string()),
            ("prompt_seconds_total", "counter", "Prompt process time", format!("{:.6}", secs(&self.prompt_nanos))),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed.", load(&self.generated_tokens).to_string()),
            ("tokens_predicted_seconds_total", "counter", "Predict process time", format!("{:.6}", secs(&self.gen_nanos))),
            ("n_decode_total", "counter", "Total number of forward passes.", load(&self.passes).to_string()),
            ("n_tokens_max", "counter", "Largest observed n_tokens.", load(&self.max_pass_tokens).to_string()),
            ("spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", load(&self.draft_tokens).to_string()),
            ("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", load(&self.draft_accepted).to_string()),
            ("spec_decode_num_drafts_total", "counter", "Drafting rounds.", load(&self.drafts).to_string()),
            ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", format!("{:.3}", rate(&self.prompt_tokens, &self.prompt_nanos))),
            ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.", format!("{:.3}", rate(&self.generated_tokens, &self.gen_nanos))),
            ("requests_processing", "gauge", "Number of requests processing.", busy.to_string()),
            ("requests_deferred", "gauge", "Number of requests deferred.", self.queued().to_string()),
            ("n_busy_slots_per_decode", "gauge", "Busy slots per forward pass.", busy.to_string()),
        ];
        for (name, kind, help, value) in llama {
            let _ = writeln!(s, "# HELP llamacpp:{name} {help}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_rates() {
        let m = Metrics::default();
        m.request(200);
        m.request(200);
        m.request(503);
        m.generated(10, 0.5);
        let text = m.render(0);
        assert!(text.contains("minfer_requests_total{status=\"200\"} 2\n"), "{text}");
        assert!(text.contains("minfer_requests_total{status=\"503\"} 1\n"));
        assert!(text.contains("minfer_generated_tokens_total 10\n"));
        assert!(text.contains("minfer_generated_tokens_per_second 20.000\n"));
        assert!(text.contains("# TYPE minfer_queue_depth gauge\n"));
    }
}
