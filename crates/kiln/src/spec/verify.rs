//! Which drafted tokens the model accepts, and the token after them.

use super::Drafted;
use crate::sample::{Candidate, Sampler};

/// The outcome of verifying a draft: the accepted drafted tokens count, and the token that
/// follows them (a correction, or after a fully accepted draft the model's next token).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub accepted: usize,
    pub next: u32,
}

/// Greedy: `ids[j]` is the model's argmax after the draft's first `j` tokens; drafted
/// tokens are accepted while they equal it.
pub fn greedy(draft: &[u32], ids: &[u32]) -> Verdict {
    let accepted = draft.iter().zip(ids).take_while(|(d, i)| d == i).count();
    Verdict { accepted, next: ids[accepted] }
}

/// Decides a draft from the model's outputs for the verified token and the draft after it
/// (`draft.len() + 1` rows): argmax ids (`ids`: a plain greedy sampler without logprobs,
/// whose rows the device reduced to their argmax), else logits of `n_vocab`. The decided
/// tokens are accepted into `sampler`.
pub fn decide(sampler: &mut Sampler, draft: &[Drafted], out: &[f32], ids: bool, n_vocab: usize) -> Verdict {
    if !ids {
        return sampled(sampler, draft, out, n_vocab);
    }
    let ids: Vec<u32> = out.iter().map(|&x| x as u32).collect();
    let draft_ids: Vec<u32> = draft.iter().map(|d| d.id).collect();
    let v = greedy(&draft_ids, &ids);
    for &t in &draft_ids[..v.accepted] {
        sampler.accept(t);
    }
    sampler.accept(v.next);
    v
}

/// Speculative sampling: `rows[j]` are the model's logits after the draft's first `j`
/// tokens (`draft.len() + 1` rows of `n_vocab`). Drafted token `x` drawn from `q` is
/// accepted with probability `min(1, p(x) / q(x))`, `p` the model's distribution through
/// `sampler`'s chain; the first rejected one is replaced by a draw from `max(0, p - q)`
/// normalized (from `p` where that is empty). Tokens are accepted into `sampler` as they
/// are decided (its penalties see them).
pub fn sampled(sampler: &mut Sampler, draft: &[Drafted], rows: &[f32], n_vocab: usize) -> Verdict {
    for (j, d) in draft.iter().enumerate() {
        let row = &rows[j * n_vocab..(j + 1) * n_vocab];
        let p: Vec<Candidate> = sampler.distribution(row).to_vec();
        let p_of = |id: u32| p.iter().find(|c| c.id == id).map_or(0.0, |c| c.p);
        let q_of = |id: u32| match &d.q {
            Some(q) => q.iter().find(|c| c.id == id).map_or(0.0, |c| c.p),
            None => f32::from(id == d.id),
        };
        let (px, qx) = (p_of(d.id), q_of(d.id));
        let u = sampler.uniform();
        if qx > 0.0 && u < (px as f64 / qx as f64).min(1.0) {
            sampler.accept(d.id);
            continue;
        }
        let residual: Vec<Candidate> = p
            .iter()
            .map(|c| Candidate { p: (c.p - q_of(c.id)).max(0.0), ..*c })
            .filter(|c| c.p > 0.0)
            .collect();
        let next = if residual.is_empty() { sampler.draw_from(&p) } else { sampler.draw_from(&residual) };
        sampler.accept(next);
        return Verdict { accepted: j, next };
    }
    let k = draft.len();
    let next = sampler.sample(&rows[k * n_vocab..(k + 1) * n_vocab]);
    sampler.accept(next);
    Verdict { accepted: k, next }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::SamplerParams;

    #[test]
    fn greedy_accepts_the_matching_prefix() {
        assert_eq!(greedy(&[5, 6, 7], &[5, 6, 9, 1]), Verdict { accepted: 2, next: 9 });
        assert_eq!(greedy(&[5, 6], &[5, 6, 8]), Verdict { accepted: 2, next: 8 });
        assert_eq!(greedy(&[4], &[5, 6]), Verdict { accepted: 0, next: 5 });
        assert_eq!(greedy(&[], &[3]), Verdict { accepted: 0, next: 3 });
    }

    /// Many verifications of a one-token draft from a distribution `q` unlike the model's:
    /// the first token emitted is distributed as the model's `p`, whatever `q` (a
    /// chi-square bound at the 0.1% level), with `q` a distribution and with `q` certain.
    #[test]
    fn sampled_output_follows_the_model() {
        let n_vocab = 6;
        let logits = [1.0f32, 0.5, 2.0, -1.0, 0.0, 1.5];
        // The model's distribution under temperature 1 with no filters.
        let params = SamplerParams::default().with_top_k(0).with_top_p(1.0).with_min_p(0.0).with_temp(1.0);
        let mut sampler = Sampler::new(params.clone().with_seed(11), n_vocab).unwrap();
        let p: Vec<f64> = {
            let mut s = Sampler::new(params, n_vocab).unwrap();
            let mut v = vec![0.0; n_vocab];
            for c in s.distribution(&logits) {
                v[c.id as usize] = c.p as f64;
            }
            v
        };
        let q = vec![
            Candidate { id: 3, logit: 0.0, p: 0.5 },
            Candidate { id: 0, logit: 0.0, p: 0.3 },
            Candidate { id: 2, logit: 0.0, p: 0.2 },
        ];
        let rows: Vec<f32> = logits.iter().chain(&logits).copied().collect();
        let mut qs = Sampler::new(SamplerParams::default().with_seed(5), n_vocab).unwrap();
        for certain in [false, true] {
            let n = 40_000;
            let mut counts = vec![0u64; n_vocab];
            let mut accepted = 0;
            for _ in 0..n {
                let x = if certain { 3 } else { qs.draw_from(&q) };
                let draft = [Drafted { id: x, q: (!certain).then(|| q.clone()) }];
                let v = sampled(&mut sampler, &draft, &rows, n_vocab);
                let first = if v.accepted == 1 { x } else { v.next };
                accepted += v.accepted;
                counts[first as usize] += 1;
            }
            let chi2: f64 = (0..n_vocab)
                .map(|i| {
                    let e = p[i] * n as f64;
                    (counts[i] as f64 - e).powi(2) / e
                })
                .sum();
            // 5 degrees of freedom: P(chi2 > 20.5) = 0.001.
            assert!(chi2 < 20.5, "certain {certain}: chi2 {chi2}, counts {counts:?}, p {p:?}");
            assert!(accepted > 0 && accepted < n, "some drafts accepted, some not");
        }
    }
}
