//! Each step of the sampler chain on fixed logits, against hand-computed references.

use kiln::sample::{Sampler, SamplerParams};

/// Every filter off, temperature 1: the draw sees the adjusted logits as they are.
fn plain() -> SamplerParams {
    SamplerParams::default().with_top_k(0).with_top_p(1.0).with_min_p(0.0).with_temp(1.0).with_seed(1)
}

/// The ids left after the filters of one `sample` call, ascending.
fn kept(params: SamplerParams, logits: &[f32]) -> Vec<u32> {
    let mut s = Sampler::new(params, logits.len()).unwrap();
    s.sample(logits);
    let mut ids: Vec<u32> = s.candidates().iter().map(|c| c.id).collect();
    ids.sort();
    ids
}

/// ln of probabilities, so the softmax gives them back.
fn lnp(ps: &[f32]) -> Vec<f32> {
    ps.iter().map(|p| p.ln()).collect()
}

#[test]
fn sample_top_k_keeps_k_best_ties_to_lowest_id() {
    let logits = [0.1, 2.0, 1.0, 3.0, 2.0];
    assert_eq!(kept(plain().with_top_k(3), &logits), vec![1, 3, 4]);
    assert_eq!(kept(plain().with_top_k(2), &logits), vec![1, 3]);
    assert_eq!(kept(plain().with_top_k(1), &logits), vec![3]);
    assert_eq!(kept(plain().with_top_k(0), &logits), vec![0, 1, 2, 3, 4]);
    assert_eq!(kept(plain().with_top_k(-1), &logits), vec![0, 1, 2, 3, 4]);
    assert_eq!(kept(plain().with_top_k(99), &logits), vec![0, 1, 2, 3, 4]);
}

#[test]
fn sample_top_p_smallest_prefix_reaching_p() {
    let logits = lnp(&[0.5, 0.2, 0.2, 0.1]);
    assert_eq!(kept(plain().with_top_p(0.4), &logits), vec![0]);
    assert_eq!(kept(plain().with_top_p(0.6), &logits), vec![0, 1]);
    assert_eq!(kept(plain().with_top_p(0.75), &logits), vec![0, 1, 2]);
    assert_eq!(kept(plain().with_top_p(0.95), &logits), vec![0, 1, 2, 3]);
    assert_eq!(kept(plain().with_top_p(1.0), &logits), vec![0, 1, 2, 3]);
}

#[test]
fn sample_min_p_relative_to_best() {
    let logits = lnp(&[0.5, 0.2, 0.2, 0.1]);
    // keep p >= min_p * 0.5
    assert_eq!(kept(plain().with_min_p(0.3), &logits), vec![0, 1, 2]);
    assert_eq!(kept(plain().with_min_p(0.1), &logits), vec![0, 1, 2, 3]);
    assert_eq!(kept(plain().with_min_p(0.5), &logits), vec![0]);
    assert_eq!(kept(plain().with_min_p(1.0), &logits), vec![0]);
}

#[test]
fn sample_typical_keeps_surprisal_closest_to_entropy() {
    // H = 1.2206; |-ln p - H|: id0 0.5275, id1/id2 0.3888, id3 1.0820.
    let logits = lnp(&[0.5, 0.2, 0.2, 0.1]);
    assert_eq!(kept(plain().with_typical_p(0.3), &logits), vec![1, 2]);
    assert_eq!(kept(plain().with_typical_p(0.5), &logits), vec![0, 1, 2]);
    assert_eq!(kept(plain().with_typical_p(0.95), &logits), vec![0, 1, 2, 3]);
    // Typical can drop the argmax, so greedy decoding sees it: ties then go to id 1.
    let mut s = Sampler::new(SamplerParams::greedy().with_typical_p(0.3), 4).unwrap();
    assert_eq!(s.sample(&logits), 1);
}

#[test]
fn sample_chain_order_top_k_before_top_p_before_min_p() {
    // After top-k 3 the renormalised probs are 0.5/0.9, 0.2/0.9, 0.2/0.9: top-p 0.6 then
    // needs two tokens (0.556 < 0.6), where over the full list one (0.5) would not do either.
    let logits = lnp(&[0.5, 0.2, 0.2, 0.1]);
    assert_eq!(kept(plain().with_top_k(3).with_top_p(0.6), &logits), vec![0, 1]);
    assert_eq!(kept(plain().with_top_k(3).with_top_p(0.5), &logits), vec![0]);
    // min-p after top-p: top-p 0.95 keeps all 4, min-p 0.3 then drops id 3.
    assert_eq!(kept(plain().with_top_p(0.95).with_min_p(0.3), &logits), vec![0, 1, 2]);
}

#[test]
fn sample_temperature_scales_logits() {
    let logits = [1.0, 2.0, -3.0];
    let mut s = Sampler::new(plain().with_temp(0.5), 3).unwrap();
    s.sample(&logits);
    let got: Vec<f32> = s.candidates().iter().map(|c| c.logit).collect();
    assert_eq!(got, vec![2.0, 4.0, -6.0]);
    // Probabilities of the draw: softmax of the scaled logits.
    let z: f32 = got.iter().map(|l| (l - 4.0).exp()).sum();
    for c in s.candidates() {
        assert!(
            ((c.logit - 4.0).exp() / z - c.p / s.candidates().iter().map(|c| c.p).sum::<f32>()).abs() < 1e-6
        );
    }
}

#[test]
fn sample_greedy_argmax_ties_to_lowest_id() {
    let mut s = Sampler::new(SamplerParams::greedy(), 5).unwrap();
    assert_eq!(s.sample(&[0.0, 5.0, 1.0, 5.0, 4.9]), 1);
    assert_eq!(s.sample(&[7.0, 5.0, 1.0, 5.0, 7.0]), 0);
    // Negative temperature is greedy too.
    let mut s = Sampler::new(SamplerParams::default().with_temp(-1.0), 3).unwrap();
    assert_eq!(s.sample(&[0.0, -1.0, 0.5]), 2);
}

#[test]
fn sample_repeat_frequency_presence_penalties() {
    let logits = [2.0, -1.0, 0.5, 1.0];
    let p = plain().with_repeat_penalty(2.0).with_frequency_penalty(0.5).with_presence_penalty(0.25);
    let mut s = Sampler::new(p, 4).unwrap();
    for t in [0, 1, 0] {
        s.accept(t);
    }
    s.sample(&logits);
    let got: Vec<f32> = s.candidates().iter().map(|c| c.logit).collect();
    // id0: 2/2 - 2*0.5 - 0.25; id1: -1*2 - 1*0.5 - 0.25; others untouched.
    assert_eq!(got, vec![-0.25, -2.75, 0.5, 1.0]);

    // Repeat penalty alone.
    let mut s = Sampler::new(plain().with_repeat_penalty(1.5), 4).unwrap();
    s.accept(0);
    s.accept(1);
    s.sample(&logits);
    let got: Vec<f32> = s.candidates().iter().map(|c| c.logit).collect();
    assert_eq!(got, vec![2.0 / 1.5, -1.5, 0.5, 1.0]);
}

#[test]
fn sample_penalty_window_is_last_n() {
    let logits = [1.0, 1.0, 1.0, 1.0];
    let p = plain().with_presence_penalty(1.0).with_repeat_last_n(2);
    let mut s = Sampler::new(p, 4).unwrap();
    for t in [0, 1, 2] {
        s.accept(t);
    }
    s.sample(&logits);
    let got: Vec<f32> = s.candidates().iter().map(|c| c.logit).collect();
    assert_eq!(got, vec![1.0, 0.0, 0.0, 1.0]);
    // repeat_last_n 0 disables penalties; -1 remembers everything.
    let mut s = Sampler::new(plain().with_presence_penalty(1.0).with_repeat_last_n(0), 4).unwrap();
    s.accept(0);
    s.sample(&logits);
    assert_eq!(s.candidates()[0].logit, 1.0);
    let mut s = Sampler::new(plain().with_frequency_penalty(1.0).with_repeat_last_n(-1), 4).unwrap();
    for _ in 0..100 {
        s.accept(3);
    }
    s.sample(&logits);
    assert_eq!(s.candidates()[3].logit, -99.0);
    // reset forgets the window.
    s.reset();
    s.sample(&logits);
    assert_eq!(s.candidates()[3].logit, 1.0);
}

#[test]
fn sample_penalties_apply_after_logit_bias() {
    // llama.cpp: bias first, then the repeat penalty divides the biased logit.
    let p = plain().with_repeat_penalty(2.0).with_bias(0, 2.0);
    let mut s = Sampler::new(p, 2).unwrap();
    s.accept(0);
    s.sample(&[1.0, 0.0]);
    assert_eq!(s.candidates()[0].logit, 1.5);
}

#[test]
fn sample_logit_bias() {
    let logits = [3.0, 1.0, 2.0];
    let mut s = Sampler::new(SamplerParams::greedy().with_bias(0, f32::NEG_INFINITY), 3).unwrap();
    assert_eq!(s.sample(&logits), 2);
    let mut s = Sampler::new(SamplerParams::greedy().with_bias(1, 1.5).with_bias(1, 1.0), 3).unwrap();
    assert_eq!(s.sample(&logits), 1); // 1 + 2.5 > 3
                                      // A banned token is never drawn.
    let mut s = Sampler::new(plain().with_bias(0, f32::NEG_INFINITY).with_seed(3), 3).unwrap();
    for _ in 0..2000 {
        assert_ne!(s.sample(&logits), 0);
    }
}

#[test]
fn sample_validate_rejects_impossible_settings() {
    let ok = SamplerParams::default();
    assert!(ok.validate(10).is_ok());
    assert!(SamplerParams::greedy().with_temp(-2.0).validate(10).is_ok());
    let bad = [
        ok.clone().with_top_p(0.0),
        ok.clone().with_top_p(1.5),
        ok.clone().with_top_p(f32::NAN),
        ok.clone().with_min_p(-0.1),
        ok.clone().with_min_p(1.1),
        ok.clone().with_typical_p(0.0),
        ok.clone().with_temp(f32::NAN),
        ok.clone().with_repeat_penalty(0.0),
        ok.clone().with_repeat_penalty(-1.0),
        ok.clone().with_repeat_last_n(-2),
        ok.clone().with_presence_penalty(f32::INFINITY),
        ok.clone().with_frequency_penalty(f32::NAN),
        ok.clone().with_bias(10, 1.0),
        ok.clone().with_bias(1, f32::NAN),
    ];
    for p in bad {
        let e = p.validate(10).expect_err(&format!("{p:?} should be rejected"));
        assert!(e.to_string().starts_with("sampler: "), "{e}");
        assert!(Sampler::new(p, 10).is_err());
    }
    assert!(ok.validate(0).is_err());
}

#[test]
fn sample_odd_inputs_do_not_panic() {
    let mut s = Sampler::new(SamplerParams::default().with_seed(1), 4).unwrap();
    assert_eq!(s.sample(&[]), 0);
    s.accept(99); // out of range: ignored
    let id = s.sample(&[f32::NEG_INFINITY; 4]);
    assert!(id < 4);
    let id = s.sample(&[f32::NAN, 1.0, 0.0, 0.0]);
    assert!(id < 4);
    // More logits than the vocabulary: the extra ones are ignored.
    let mut g = Sampler::new(SamplerParams::greedy(), 2).unwrap();
    assert_eq!(g.sample(&[0.0, 1.0, 5.0]), 1);
}

/// The greedy pick by a plain loop: the first of the highest by `total_cmp`.
fn argmax_by_loop(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, l) in logits.iter().enumerate() {
        if l.total_cmp(&logits[best]).is_gt() {
            best = i;
        }
    }
    best as u32
}

#[test]
fn argmax_ties_to_the_lowest_id_nans_by_total_cmp() {
    let rows: [&[f32]; 8] = [
        &[1.0, 3.0, 2.0, 3.0],
        &[-0.0, 0.0, -1.0, 0.0],
        &[f32::NEG_INFINITY, -5.0, f32::NEG_INFINITY, -7.0],
        &[f32::NAN, 1.0, f32::INFINITY, 2.0],
        &[-f32::NAN, -1.0, -2.0, -1.0],
        &[0.5, f32::INFINITY, 1.0, f32::INFINITY],
        &[-3.0, -2.0, -1.0, -1.5],
        &[f32::NEG_INFINITY; 4],
    ];
    let got: Vec<u32> = rows.iter().map(|r| kiln::sample::argmax(r)).collect();
    assert_eq!(got, [1, 1, 1, 0, 1, 1, 2, 0]);
    assert_eq!(kiln::sample::argmax(&[]), 0);
}

/// Plain greedy settings take `argmax` of the raw logits; the same settings with a bias of
/// zero (no longer plain) run the chain's candidates; both pick the plain loop's token, on
/// vocabulary-sized rows with frequent ties, infinities and NaNs.
#[test]
fn plain_greedy_picks_what_the_chain_picks() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let plain = SamplerParams::greedy();
    let chain = SamplerParams::greedy().with_bias(0, 0.0);
    assert!(plain.is_plain_greedy() && !chain.is_plain_greedy());
    for round in 0..120 {
        let n = if round % 3 == 0 { 151_936 } else { 1 + (next() % 300) as usize };
        // Few distinct values, so ties are common.
        let mut logits: Vec<f32> = (0..n).map(|_| (next() % 7) as f32 - 3.0).collect();
        let special = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, -0.0, 3.0];
        for _ in 0..round % 4 {
            let i = (next() % n as u64) as usize;
            logits[i] = special[(next() % special.len() as u64) as usize];
        }
        let want = argmax_by_loop(&logits);
        assert_eq!(kiln::sample::argmax(&logits), want);
        let mut a = Sampler::new(plain.clone(), n).unwrap();
        let mut b = Sampler::new(chain.clone(), n).unwrap();
        assert_eq!(a.sample(&logits), want, "round {round}");
        assert_eq!(b.sample(&logits), want, "round {round}");
    }
    let mut penalized = SamplerParams::greedy();
    penalized.repeat_penalty = 1.1;
    assert!(!penalized.is_plain_greedy());
    assert!(!SamplerParams::greedy().with_typical_p(0.9).is_plain_greedy());
}
