//! The seeded draw: reproducible, and distributed as the filtered softmax says.

use kiln::sample::{Sampler, SamplerParams, StopMatcher};

/// llama.cpp's default chain recomputed independently in f64: top-k 40, top-p 0.95,
/// min-p 0.05, temperature 0.8.
fn reference(logits: &[f32]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    idx.truncate(40);
    let soft = |ids: &[usize], t: f64| -> Vec<f64> {
        let m = logits[ids[0]] as f64;
        let e: Vec<f64> = ids.iter().map(|&i| ((logits[i] as f64 - m) / t).exp()).collect();
        let z: f64 = e.iter().sum();
        e.into_iter().map(|x| x / z).collect()
    };
    let p = soft(&idx, 1.0);
    let mut cum = 0.0;
    let mut keep = idx.len();
    for (i, q) in p.iter().enumerate() {
        cum += q;
        if cum >= 0.95 {
            keep = i + 1;
            break;
        }
    }
    idx.truncate(keep);
    let min_logit = logits[idx[0]] as f64 + (0.05f64).ln();
    idx.retain(|&i| logits[i] as f64 >= min_logit);
    let p = soft(&idx, 0.8);
    let mut full = vec![0.0; logits.len()];
    for (k, &i) in idx.iter().enumerate() {
        full[i] = p[k];
    }
    full
}

#[test]
fn sample_draw_follows_filtered_distribution() {
    // 64 tokens: a few likely ones, a long tail that top-p/min-p must cut.
    let logits: Vec<f32> =
        (0..64).map(|i| 4.0 - 0.15 * i as f32 + if i % 7 == 0 { 0.4 } else { 0.0 }).collect();
    let want = reference(&logits);
    let support = want.iter().filter(|&&p| p > 0.0).count();
    assert!(support > 5 && support < 40, "the filters should bite: {support}");

    let n = 200_000usize;
    let mut s = Sampler::new(SamplerParams::default().with_seed(12345), logits.len()).unwrap();
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[s.sample(&logits) as usize] += 1;
    }
    let mut chi2 = 0.0;
    for (i, &c) in counts.iter().enumerate() {
        if want[i] == 0.0 {
            assert_eq!(c, 0, "token {i} was filtered out but drawn");
            continue;
        }
        let e = want[i] * n as f64;
        chi2 += (c as f64 - e).powi(2) / e;
        // Also a direct bound: within 5 standard deviations.
        let sd = (n as f64 * want[i] * (1.0 - want[i])).sqrt();
        assert!((c as f64 - e).abs() < 5.0 * sd + 1.0, "token {i}: {c} vs {e:.0}");
    }
    // 99.9% quantile of chi-square with df = support - 1 (Wilson-Hilferty).
    let df = (support - 1) as f64;
    let z = 3.09;
    let q = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
    eprintln!("draw: support {support}, chi2 {chi2:.1} (99.9% bound {q:.1})");
    assert!(chi2 < q, "chi2 {chi2:.1} >= {q:.1} (df {df})");
}

#[test]
fn sample_seed_reproducible_and_reset_restarts() {
    let logits: Vec<f32> = (0..32).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let run = |seed| {
        let mut s = Sampler::new(SamplerParams::default().with_seed(seed).with_top_k(0), 32).unwrap();
        (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));

    let mut s = Sampler::new(SamplerParams::default().with_seed(7).with_top_k(0), 32).unwrap();
    let a: Vec<u32> = (0..50).map(|_| s.sample(&logits)).collect();
    s.reset();
    let b: Vec<u32> = (0..50).map(|_| s.sample(&logits)).collect();
    assert_eq!(a, b);
    assert_eq!(s.seed(), 7);
    // No seed: a random one, reported.
    let r = Sampler::new(SamplerParams::default(), 32).unwrap();
    let _ = r.seed();
}

#[test]
fn sample_large_vocab_default_chain() {
    // A realistic vocabulary size exercises the partial sort.
    let n = 151_936;
    let logits: Vec<f32> = (0..n).map(|i| ((i as u64 * 2_654_435_761) % 1000) as f32 / 100.0).collect();
    let mut s = Sampler::new(SamplerParams::default().with_seed(1), n).unwrap();
    let max = logits.iter().cloned().fold(f32::MIN, f32::max);
    for _ in 0..20 {
        let id = s.sample(&logits) as usize;
        assert!(logits[id] >= max + 0.05f32.ln(), "min-p bound");
        assert!(s.candidates().len() <= 40);
    }
    let mut g = Sampler::new(SamplerParams::greedy(), n).unwrap();
    let id = g.sample(&logits) as usize;
    assert_eq!(logits[id], max);
    assert!(logits[..id].iter().all(|&l| l < max), "ties to the lowest id");
}

#[test]
fn sample_stop_matcher() {
    let mut m = StopMatcher::new(vec!["<|end|>".into(), "\n\n".into()]);
    assert_eq!(m.push("Hello"), ("Hello".into(), false));
    assert_eq!(m.push(" wor<|"), (" wor".into(), false));
    assert_eq!(m.push("en"), (String::new(), false));
    assert_eq!(m.push("d|> tail"), (String::new(), true));
    assert!(m.matched());
    assert_eq!(m.push("more"), (String::new(), true));
    assert_eq!(m.finish(), "");

    // Held text that turns out not to be a stop is released.
    let mut m = StopMatcher::new(vec!["<|end|>".into()]);
    assert_eq!(m.push("a<|e"), ("a".into(), false));
    assert_eq!(m.push("x"), ("<|ex".into(), false));
    assert_eq!(m.push("<"), (String::new(), false));
    assert_eq!(m.finish(), "<");

    // Earliest match wins; text before it is emitted.
    let mut m = StopMatcher::new(vec!["cd".into(), "b".into()]);
    assert_eq!(m.push("abcd"), ("a".into(), true));

    // Multi-byte stop strings and pieces split inside a character.
    let mut m = StopMatcher::new(vec!["日本".into()]);
    assert_eq!(m.push("x日"), ("x".into(), false));
    assert_eq!(m.push("本語"), (String::new(), true));

    // No stops: everything passes; empty stop strings are ignored.
    let mut m = StopMatcher::new(vec![String::new()]);
    assert_eq!(m.push("abc"), ("abc".into(), false));
    m.reset();
    assert!(!m.matched());
}
