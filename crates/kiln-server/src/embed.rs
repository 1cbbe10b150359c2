//! Sentence embeddings from per-token hidden states: mean pooling, then L2 normalization
//! (what `/v1/embeddings` returns; llama.cpp's `--pooling mean` with normalization).

/// `hidden` holds one row of `n_embd` per token.
pub fn mean_pool_l2(hidden: &[f32], n_embd: usize) -> Vec<f32> {
    let n_tok = hidden.len() / n_embd.max(1);
    let mut sum = vec![0.0f64; n_embd];
    for row in hidden.chunks_exact(n_embd) {
        for (s, &h) in sum.iter_mut().zip(row) {
            *s += h as f64;
        }
    }
    let inv = 1.0 / n_tok.max(1) as f64;
    let norm = sum.iter().map(|s| (s * inv) * (s * inv)).sum::<f64>().sqrt();
    let scale = if norm > 0.0 { inv / norm } else { 0.0 };
    sum.iter().map(|s| (s * scale) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_then_unit_length() {
        let h = [1.0, 0.0, 3.0, 4.0]; // two tokens of width 2: mean (2, 2)
        let e = mean_pool_l2(&h, 2);
        let r = std::f32::consts::FRAC_1_SQRT_2;
        assert!((e[0] - r).abs() < 1e-6 && (e[1] - r).abs() < 1e-6);
        assert_eq!(mean_pool_l2(&[0.0, 0.0], 2), vec![0.0, 0.0]);
    }
}
