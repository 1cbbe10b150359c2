//! Prometheus metrics (text exposition format 0.0.4), kept with atomics and two small
//! histograms; the scheduler writes them, `/metrics` reads them.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }

    pub fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(&mut self.counts) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.count);
    }
}

const TTFT_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const BATCH_BOUNDS: &[f64] =
    &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0];

pub struct Metrics {
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    /// f32 bits of the KV usage after the last step (read without locking the runner).
    pub kv_usage: AtomicU32,
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens whose KV came from a cached prefix instead of a forward.
    pub prompt_tokens_cached: AtomicU64,
    pub generation_tokens: AtomicU64,
    /// Speculative decoding: tokens drafted and verified, and how many of them the model
    /// accepted.
    pub draft_tokens: AtomicU64,
    pub accepted_tokens: AtomicU64,
    /// Per scheduler step: count, entries, and nanoseconds spent building the batch,
    /// drafting (speculative decoding), in the forward, and sampling and streaming (where the
    /// time of a step goes).
    steps: AtomicU64,
    step_entries: AtomicU64,
    step_ns: [AtomicU64; 4],
    requests: Mutex<BTreeMap<u16, u64>>,
    ttft: Mutex<Histogram>,
    batch: Mutex<Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            running: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            kv_usage: AtomicU32::new(0),
            prompt_tokens: AtomicU64::new(0),
            prompt_tokens_cached: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            draft_tokens: AtomicU64::new(0),
            accepted_tokens: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            step_entries: AtomicU64::new(0),
            step_ns: Default::default(),
            requests: Mutex::new(BTreeMap::new()),
            ttft: Mutex::new(Histogram::new(TTFT_BOUNDS)),
            batch: Mutex::new(Histogram::new(BATCH_BOUNDS)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    /// One finished `/v1` request by HTTP status (499: the client went away first).
    pub fn request_done(&self, status: u16) {
        *lock(&self.requests).entry(status).or_insert(0) += 1;
    }

    pub fn observe_ttft(&self, seconds: f64) {
        lock(&self.ttft).observe(seconds);
    }

    /// Sequences that took part in one batched forward.
    pub fn observe_batch(&self, n: usize) {
        lock(&self.batch).observe(n as f64);
    }

    /// One scheduler step of `entries` tokens and the time of its phases.
    pub fn observe_step(&self, entries: usize, [schedule, draft, forward, sample]: [Duration; 4]) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_entries.fetch_add(entries as u64, Ordering::Relaxed);
        for (c, d) in self.step_ns.iter().zip([schedule, draft, forward, sample]) {
            c.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        }
    }

    pub fn render(&self) -> String {
        let mut o = String::new();
        let g = |o: &mut String, name: &str, help: &str, v: String| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        g(
            &mut o,
            "kiln_requests_running",
            "Requests being decoded.",
            self.running.load(Ordering::Relaxed).to_string(),
        );
        g(
            &mut o,
            "kiln_requests_waiting",
            "Requests queued for a slot.",
            self.waiting.load(Ordering::Relaxed).to_string(),
        );
        let kv = f32::from_bits(self.kv_usage.load(Ordering::Relaxed));
        g(&mut o, "kiln_kv_cache_usage_ratio", "Fraction of KV cache blocks in use.", kv.to_string());
        let _ = writeln!(o, "# HELP kiln_requests_total Finished /v1 requests by HTTP status.");
        let _ = writeln!(o, "# TYPE kiln_requests_total counter");
        for (s, n) in lock(&self.requests).iter() {
            let _ = writeln!(o, "kiln_requests_total{{status=\"{s}\"}} {n}");
        }
        let c = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        c(
            &mut o,
            "kiln_prompt_tokens_total",
            "Prompt tokens admitted.",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        c(
            &mut o,
            "kiln_prompt_tokens_cached_total",
            "Prompt tokens reused from a cached prefix.",
            self.prompt_tokens_cached.load(Ordering::Relaxed),
        );
        c(
            &mut o,
            "kiln_generation_tokens_total",
            "Tokens sampled.",
            self.generation_tokens.load(Ordering::Relaxed),
        );
        c(
            &mut o,
            "kiln_draft_tokens_total",
            "Speculative decoding: drafted tokens verified.",
            self.draft_tokens.load(Ordering::Relaxed),
        );
        c(
            &mut o,
            "kiln_draft_tokens_accepted_total",
            "Speculative decoding: drafted tokens the model accepted.",
            self.accepted_tokens.load(Ordering::Relaxed),
        );
        c(&mut o, "kiln_steps_total", "Batched forward steps.", self.steps.load(Ordering::Relaxed));
        c(
            &mut o,
            "kiln_step_tokens_total",
            "Tokens (decode and prompt) in batched forward steps.",
            self.step_entries.load(Ordering::Relaxed),
        );
        let _ = writeln!(o, "# HELP kiln_step_seconds_total Scheduler step time by phase.");
        let _ = writeln!(o, "# TYPE kiln_step_seconds_total counter");
        for (phase, ns) in ["schedule", "draft", "forward", "sample"].iter().zip(&self.step_ns) {
            let secs = ns.load(Ordering::Relaxed) as f64 * 1e-9;
            let _ = writeln!(o, "kiln_step_seconds_total{{phase=\"{phase}\"}} {secs}");
        }
        lock(&self.ttft).write(
            &mut o,
            "kiln_time_to_first_token_seconds",
            "Time from arrival to first token.",
        );
        lock(&self.batch).write(&mut o, "kiln_batch_size", "Sequences per batched forward step.");
        o
    }
}
