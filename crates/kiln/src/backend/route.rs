//! Mixture-of-experts routing with an expert-selection bias, on the host: the reference
//! arithmetic of `Backend::moe_route_biased` (ggml's `build_moe_ffn` with `exp_probs_b`).
//! The bias only picks the experts; their weights are the unbiased scores.

use super::{Gating, Routing};

/// Routes `rows` rows of router logits (`r.n_expert` wide): each row's top `r.k` experts
/// by `σ(logit) + bias[e]`, highest first (the lowest index on ties), to `ids` (as f32)
/// and their `σ(logit)` to `weights`, divided by their sum where `r.norm` (at least the
/// least normal f16, ggml's clamp), then times `r.scale` (unless 0 or 1). σ is ggml's
/// `1 / (1 + expf(-x))`; `ModelConfig::check` pairs a bias with sigmoid gating only.
pub fn route_biased(
    logits: &[f32],
    rows: usize,
    r: &Routing,
    bias: &[f32],
    ids: &mut [f32],
    weights: &mut [f32],
) {
    debug_assert_eq!(r.gating, Gating::Sigmoid);
    let n = r.n_expert;
    let mut probs = vec![0f32; n];
    let mut sel = vec![0f32; n];
    let mut order: Vec<u32> = Vec::with_capacity(n);
    for t in 0..rows {
        for (e, &x) in logits[t * n..(t + 1) * n].iter().enumerate() {
            probs[e] = 1.0 / (1.0 + (-x).exp());
            sel[e] = probs[e] + bias[e];
        }
        order.clear();
        order.extend(0..n as u32);
        // A stable sort: ties keep the lower index first.
        order.sort_by(|&a, &b| sel[b as usize].total_cmp(&sel[a as usize]));
        let (ids, w) = (&mut ids[t * r.k..(t + 1) * r.k], &mut weights[t * r.k..(t + 1) * r.k]);
        for j in 0..r.k {
            ids[j] = order[j] as f32;
            w[j] = probs[order[j] as usize];
        }
        if r.norm {
            let sum: f64 = w.iter().map(|&v| v as f64).sum();
            let sum = (sum as f32).max(6.1035156e-5);
            w.iter_mut().for_each(|v| *v /= sum);
        }
        if r.scale != 0.0 && r.scale != 1.0 {
            w.iter_mut().for_each(|v| *v *= r.scale);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bias_picks_the_experts_and_the_scores_weight_them() {
        let r = Routing { n_expert: 4, k: 2, gating: Gating::Sigmoid, norm: false, scale: 1.0 };
        let logits = [2.0, 1.0, 0.0, -1.0];
        let s = |x: f32| 1.0 / (1.0 + (-x).exp());
        // Unbiased: experts 0 and 1.
        let (mut ids, mut w) = ([0f32; 2], [0f32; 2]);
        route_biased(&logits, 1, &r, &[0.0; 4], &mut ids, &mut w);
        assert_eq!((ids, w), ([0.0, 1.0], [s(2.0), s(1.0)]));
        // A bias lifts expert 3 over 1 and a negative one drops expert 0; the weights stay
        // the sigmoid scores, normalized to sum to one.
        let r = Routing { norm: true, ..r };
        route_biased(&logits, 1, &r, &[-1.0, 0.0, 0.5, 0.9], &mut ids, &mut w);
        assert_eq!(ids, [3.0, 2.0]);
        let sum = s(-1.0) + s(0.0);
        assert!((w[0] - s(-1.0) / sum).abs() < 1e-6 && (w[1] - s(0.0) / sum).abs() < 1e-6, "{w:?}");
        // Ties go to the lower index.
        route_biased(&[0.0; 4], 1, &r, &[0.0; 4], &mut ids, &mut w);
        assert_eq!((ids, w), ([0.0, 1.0], [0.5, 0.5]));
    }
}
