//! The individual steps of the sampler chain, each over a candidate list, with the
//! semantics of llama.cpp's samplers (src/llama-sampler.cpp): same thresholds, same
//! comparisons (`>=` vs `>`), f32 arithmetic where llama.cpp uses float.
//!
//! Ties are broken by the lower token id wherever llama.cpp's order is unspecified
//! (its sorts are not stable), so kiln's results are deterministic.

use std::cmp::Ordering;

/// One token under consideration: its id, (adjusted) logit and, after a softmax, its
/// probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
}

/// Descending logit, then ascending id.
pub fn by_logit_desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// A candidate list and whether it is sorted by [`by_logit_desc`].
#[derive(Debug, Default)]
pub struct Candidates {
    pub data: Vec<Candidate>,
    pub sorted: bool,
}

impl Candidates {
    /// Refills from raw logits, reusing the allocation.
    pub fn fill(&mut self, logits: &[f32]) {
        self.data.clear();
        self.data.extend(logits.iter().enumerate().map(|(i, &l)| Candidate {
            id: i as u32,
            logit: l,
            p: 0.0,
        }));
        self.sorted = false;
    }

    /// Sorts the `k` best to the front (in order) and drops the rest.
    fn keep_top(&mut self, k: usize) {
        let k = k.min(self.data.len());
        if !self.sorted {
            if k > 0 && k < self.data.len() {
                self.data.select_nth_unstable_by(k - 1, by_logit_desc);
            }
            self.data[..k].sort_unstable_by(by_logit_desc);
        }
        self.data.truncate(k);
        self.sorted = true;
    }

    fn sort(&mut self) {
        let n = self.data.len();
        self.keep_top(n);
    }

    /// llama.cpp's softmax: p = exp(l - max) / sum, in f32.
    pub fn softmax(&mut self) {
        let max = if self.sorted {
            self.data[0].logit
        } else {
            self.data.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit))
        };
        let mut sum = 0.0f32;
        for c in &mut self.data {
            c.p = (c.logit - max).exp();
            sum += c.p;
        }
        for c in &mut self.data {
            c.p /= sum;
        }
    }

    /// Keeps the `k` highest logits; `k <= 0` disables.
    pub fn top_k(&mut self, k: i32) {
        if k > 0 && !self.data.is_empty() {
            self.keep_top(k as usize);
        }
    }

    /// Smallest prefix (by probability) whose cumulative probability reaches `p`.
    pub fn top_p(&mut self, p: f32) {
        if p >= 1.0 || self.data.is_empty() {
            return;
        }
        // llama.cpp takes probabilities before sorting; the sum order only moves ulps.
        self.softmax();
        self.sort();
        let mut cum = 0.0f32;
        let mut last = self.data.len();
        for (i, c) in self.data.iter().enumerate() {
            cum += c.p;
            if cum >= p {
                last = i + 1;
                break;
            }
        }
        self.data.truncate(last);
    }

    /// Keeps tokens whose probability is at least `p` times the best one's, compared on
    /// logits as llama.cpp does: `logit >= max_logit + ln(p)`.
    pub fn min_p(&mut self, p: f32) {
        if p <= 0.0 || self.data.is_empty() {
            return;
        }
        let max = self.data.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
        let min_logit = max + p.ln();
        // The best token always stays (llama.cpp's sorted path; also guards NaN).
        let best = self.data.iter().position(|c| c.logit == max).unwrap_or(0);
        let mut n = 0;
        for i in 0..self.data.len() {
            if i == best || self.data[i].logit >= min_logit {
                self.data[n] = self.data[i];
                n += 1;
            }
        }
        self.data.truncate(n);
    }

    /// Locally typical sampling (Meister et al.): keeps the tokens whose surprisal is
    /// closest to the entropy until their mass exceeds `p`. Leaves the list ordered by
    /// that distance, unsorted by logit, as llama.cpp does. `order` is scratch space.
    pub fn typical(&mut self, p: f32, order: &mut Vec<(f32, u32)>, tmp: &mut Vec<Candidate>) {
        if p >= 1.0 || self.data.is_empty() {
            return;
        }
        self.sort();
        self.softmax();
        let entropy: f32 = self.data.iter().map(|c| -c.p * c.p.ln()).sum();
        order.clear();
        order.extend(self.data.iter().enumerate().map(|(i, c)| ((-c.p.ln() - entropy).abs(), i as u32)));
        // Stable on the logit order for equal scores.
        order.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut cum = 0.0f32;
        let mut last = order.len();
        for (i, &(_, idx)) in order.iter().enumerate() {
            cum += self.data[idx as usize].p;
            if cum > p {
                last = i + 1;
                break;
            }
        }
        tmp.clear();
        tmp.extend(order[..last].iter().map(|&(_, idx)| self.data[idx as usize]));
        std::mem::swap(&mut self.data, tmp);
        self.sorted = false;
    }

    /// Divides logits by `t` (> 0).
    pub fn temperature(&mut self, t: f32) {
        for c in &mut self.data {
            c.logit /= t;
        }
    }

    /// The highest logit, ties to the lowest id.
    pub fn argmax(&self) -> Option<u32> {
        let mut best: Option<&Candidate> = None;
        for c in &self.data {
            match best {
                Some(b) if by_logit_desc(c, b) != Ordering::Less => {}
                _ => best = Some(c),
            }
        }
        best.map(|c| c.id)
    }

    /// The draw's softmax made probabilities: `exp(logit - max)` over their sum (in f64).
    pub fn normalize(&mut self) {
        let max = self.data.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
        let mut total = 0.0f64;
        for c in &mut self.data {
            c.p = (c.logit - max).exp();
            total += c.p as f64;
        }
        for c in &mut self.data {
            c.p = (c.p as f64 / total) as f32;
        }
    }

    /// llama.cpp's `dist` draw: softmax (summed in f64), then the first candidate whose
    /// running sum reaches `u * total`.
    pub fn draw(&mut self, u: f64) -> Option<u32> {
        let n = self.data.len();
        if n <= 1 {
            return self.data.first().map(|c| c.id);
        }
        let max = self.data.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
        let mut total = 0.0f64;
        for c in &mut self.data {
            c.p = (c.logit - max).exp();
            total += c.p as f64;
        }
        let target = total * u;
        let mut run = 0.0f64;
        for c in &self.data {
            run += c.p as f64;
            if run >= target && c.p > 0.0 {
                return Some(c.id);
            }
        }
        // Only reachable through rounding or NaN logits.
        self.argmax()
    }
}
