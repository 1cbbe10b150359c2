//! Speculative decoding: greedy output identical with and without speculation (a draft
//! model, prompt lookup), rollback of rejected drafts leaving the KV pool and the prefix
//! cache consistent and exact, and clear errors for drafts that cannot work.

mod support;

use std::ops::ControlFlow;

use kiln::model::{Entry, OutputKind};
use kiln::sample::SamplerParams;
use kiln::spec::SpecOptions;
use kiln::{Engine, EngineOptions, GenerateOptions, Message, SessionOptions};
use support::*;

/// Code-editing requests: the reply repeats much of the prompt, as lookup wants.
const PROMPTS: [&str; 2] = [
    "Add a docstring to this function:\n\ndef area(w, h):\n    return w * h\n",
    "Rename the variable x to count in this code:\n\nx = 0\nfor item in items:\n    if item:\n        x += 1\nprint(x)\n",
];

fn load(name: &str, spec: SpecOptions) -> Engine {
    let opts = EngineOptions::default().with_n_ctx(1024).with_threads(2).with_spec(spec);
    Engine::load(model(name).to_str().unwrap(), opts).unwrap()
}

fn draft_model(name: &str) -> SpecOptions {
    let mut o = SpecOptions::default();
    o.draft_model = Some(model(name).to_str().unwrap().to_string());
    o
}

fn lookup(n: usize) -> SpecOptions {
    let mut o = SpecOptions::default();
    o.lookup_ngram = Some(n);
    o
}

/// Greedy replies to [`PROMPTS`] (ids), with the drafted and accepted counts.
fn replies(e: &Engine, n: usize) -> Vec<(Vec<u32>, usize, usize)> {
    PROMPTS
        .iter()
        .map(|p| {
            let mut s = e.session(SessionOptions::default()).unwrap();
            s.append_chat(&[Message::user(*p)]).unwrap();
            let opts = GenerateOptions::default().with_sampler(SamplerParams::greedy()).with_max_tokens(n);
            let sum = s.generate(&opts, |_| ControlFlow::Continue(())).unwrap();
            e.runner().check_kv().unwrap();
            if let Some(d) = e.draft_runner() {
                d.check_kv().unwrap();
            }
            (sum.ids, sum.timings.draft_tokens, sum.timings.accepted_tokens)
        })
        .collect()
}

fn same_greedy(target: &str, spec: SpecOptions, n: usize) {
    let plain = replies(&load(target, SpecOptions::default()), n);
    let what = format!("{spec:?}");
    let fast = replies(&load(target, spec), n);
    let (mut drafted, mut accepted) = (0, 0);
    for ((want, ..), (got, d, a)) in plain.iter().zip(&fast) {
        assert_eq!(got, want, "{target} with {what}: greedy ids differ from decoding without speculation");
        (drafted, accepted) = (drafted + d, accepted + a);
    }
    eprintln!("{target} with {what}: {accepted} of {drafted} drafted tokens accepted");
    assert!(accepted > 0, "speculation never took a drafted token: the test checks nothing");
}

#[test]
fn smollm2_drafting_for_itself_gives_the_same_greedy_ids() {
    let mut spec = draft_model(SMOLLM2.name);
    spec.draft_p_min = 0.0;
    same_greedy(SMOLLM2.name, spec, 96);
}

#[test]
fn smollm2_lookup_gives_the_same_greedy_ids() {
    same_greedy(SMOLLM2.name, lookup(3), 96);
}

#[test]
fn qwen05_drafting_for_qwen15_gives_the_same_greedy_ids() {
    if !QWEN15.enabled() {
        return;
    }
    same_greedy(QWEN15.name, draft_model(QWEN05.name), 64);
}

struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Random drafts of 1 to 16 tokens, each accepted up to a random point and the rest rolled
/// back (as a verify step does, re-evaluating what a dropped shared block held), beside
/// another sequence sharing the first blocks and the prefix cache: after every step the
/// pool's reference counts and free list agree with the tables and the cache, and at the
/// end the sequence's logits are those of its tokens evaluated afresh.
#[test]
fn rollback_keeps_the_kv_pool_and_prefix_cache_consistent() {
    let opts = EngineOptions::default().with_n_ctx(512).with_n_seq(3).with_threads(2);
    let e = Engine::load(model(SMOLLM2.name).to_str().unwrap(), opts).unwrap();
    let r = e.runner();
    let mut rng = Lcg(7);
    let mut conv: Vec<u32> = (0..40).map(|_| 100 + rng.below(20000) as u32).collect();
    let decode = |seq, toks: &[u32]| {
        let entries: Vec<Entry> = toks.iter().map(|&token| Entry { seq, token, output: false }).collect();
        r.decode(&entries, OutputKind::Logits).unwrap();
    };
    let other = r.new_seq();
    decode(other, &conv);
    let seq = r.new_seq();
    let kept = r.reuse_prefix(seq, &conv, None);
    assert_eq!(kept, 32, "one whole block shared with the other sequence");
    decode(seq, &conv[kept..]);
    for step in 0..60 {
        let n_draft = 1 + rng.below(16) as usize;
        let draft: Vec<u32> = (0..n_draft).map(|_| 100 + rng.below(20000) as u32).collect();
        let entries: Vec<Entry> = draft.iter().map(|&token| Entry { seq, token, output: true }).collect();
        r.decode(&entries, OutputKind::Argmax).unwrap();
        let accepted = rng.below(n_draft as u64 + 1) as usize;
        let keep = conv.len() + accepted;
        r.truncate_seq(seq, keep);
        conv.extend_from_slice(&draft[..accepted]);
        let have = r.seq_len(seq);
        assert!(have <= keep);
        decode(seq, &conv[have..]);
        assert_eq!(r.seq_tokens(seq), conv, "step {step}");
        r.check_kv().unwrap_or_else(|m| panic!("step {step}: {m}"));
        if step % 10 == 9 {
            // A third sequence takes the cached blocks of the conversation so far.
            let third = r.new_seq();
            r.reuse_prefix(third, &conv, None);
            r.check_kv().unwrap_or_else(|m| panic!("step {step}, after a reuse: {m}"));
            r.free_seq(third);
        }
    }
    let last = *conv.last().unwrap();
    r.truncate_seq(seq, conv.len() - 1);
    decode(seq, &conv[r.seq_len(seq)..conv.len() - 1]);
    let mine = r.decode(&[Entry { seq, token: last, output: true }], OutputKind::Logits).unwrap();
    let fresh_opts = EngineOptions::default().with_n_ctx(512).with_threads(2).with_prefix_cache_tokens(0);
    let fresh = Engine::load(model(SMOLLM2.name).to_str().unwrap(), fresh_opts).unwrap();
    let f = fresh.runner();
    let fs = f.new_seq();
    let entries: Vec<Entry> = conv
        .iter()
        .enumerate()
        .map(|(i, &token)| Entry { seq: fs, token, output: i + 1 == conv.len() })
        .collect();
    let mut want = Vec::new();
    for chunk in entries.chunks(f.n_ubatch()) {
        let out = f.decode(chunk, OutputKind::Logits).unwrap();
        if !out.is_empty() {
            want = out;
        }
    }
    assert_eq!(mine, want, "logits after {} tokens of drafts and rollbacks", conv.len());
}

/// A draft model of another vocabulary, prompt lookup beside a draft model, and a draft
/// longer than the context: errors at load that say so.
#[test]
fn drafts_that_cannot_work_are_refused() {
    let path = model(SMOLLM2.name);
    let err = |spec: SpecOptions, n_ctx: usize| {
        let opts = EngineOptions::default().with_n_ctx(n_ctx).with_threads(2).with_spec(spec);
        Engine::load(path.to_str().unwrap(), opts).err().expect("an error").to_string()
    };
    let e = err(draft_model(GEMMA3.name), 256);
    assert!(e.contains("vocabulary does not match"), "{e}");
    let mut both = draft_model(SMOLLM2.name);
    both.lookup_ngram = Some(2);
    assert!(err(both, 256).contains("cannot both draft"));
    let mut long = lookup(2);
    long.draft_max = 64;
    let e = err(long, 64);
    assert!(e.contains("does not fit in the context"), "{e}");
    // A recurrent model (LFM2's convolution state) cannot roll back a rejected draft.
    let lfm2 = std::env::temp_dir().join(format!("kiln-spec-lfm2-{}.gguf", std::process::id()));
    kiln::model::synth::preset("lfm2-tiny").unwrap().build().unwrap().write_file(&lfm2).unwrap();
    let opts = EngineOptions::default().with_n_ctx(128).with_threads(2).with_spec(lookup(2));
    let e = Engine::load(lfm2.to_str().unwrap(), opts).err().expect("an error").to_string();
    std::fs::remove_file(&lfm2).ok();
    assert!(e.contains("recurrent state"), "{e}");
}

/// Sampled speculation keeps the model's distribution: a tiny synthetic model drafted for
/// by a flatter copy of itself (so drafts are often rejected), top-k 4 at temperature 1.
/// The first two sampled tokens (the second decided by verifying a one-token draft) follow
/// the model's own joint distribution, computed from its logits: a chi-square bound at the
/// 0.1% level over many seeds.
#[test]
fn sampled_speculation_has_the_models_distribution() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    // The same weights but the output's gain: the draft ranks tokens as the model does, with
    // flatter probabilities.
    let write = |gain: f32| {
        let p = dir.join(format!("spec_synth_{gain}.gguf"));
        let spec = kiln::model::synth::SynthSpec { output_gain: gain, ..Default::default() };
        spec.build().unwrap().write_file(&p).unwrap();
        p.to_str().unwrap().to_string()
    };
    let (target, draft) = (write(3.0), write(1.0));
    let params = SamplerParams::default().with_top_k(4).with_top_p(1.0).with_min_p(0.0).with_temp(1.0);
    let prompt: Vec<u32> = b"The cat sat".iter().map(|&b| b as u32).collect();
    let opts = || EngineOptions::default().with_n_ctx(64).with_threads(1);

    // The model's joint distribution of the first two tokens.
    let plain = Engine::load(&target, opts()).unwrap();
    let n_vocab = plain.config().n_vocab;
    let dist = |ctx: &[u32]| -> Vec<(u32, f64)> {
        let mut s = plain.session(SessionOptions::default()).unwrap();
        s.append_tokens(ctx).unwrap();
        let mut sampler = kiln::sample::Sampler::new(params.clone(), n_vocab).unwrap();
        sampler.distribution(s.logits().unwrap()).iter().map(|c| (c.id, c.p as f64)).collect()
    };
    let mut want = std::collections::HashMap::new();
    for (t1, p1) in dist(&prompt) {
        let ctx: Vec<u32> = prompt.iter().copied().chain([t1]).collect();
        for (t2, p2) in dist(&ctx) {
            want.insert((t1, t2), p1 * p2);
        }
    }

    let mut spec = draft_model(SMOLLM2.name);
    spec.draft_model = Some(draft);
    spec.draft_p_min = 0.0;
    let e = Engine::load(&target, opts().with_spec(spec)).unwrap();
    let n = 3000;
    let mut counts = std::collections::HashMap::new();
    let (mut drafted, mut accepted) = (0, 0);
    let mut s = e.session(SessionOptions::default()).unwrap();
    for seed in 0..n {
        s.reset();
        s.append_tokens(&prompt).unwrap();
        // Three tokens: after the first, a draft of one fits the budget.
        let g = GenerateOptions::default()
            .with_sampler(params.clone().with_seed(seed))
            .with_max_tokens(3)
            .with_ignore_eos(true);
        let sum = s.generate(&g, |_| ControlFlow::Continue(())).unwrap();
        (drafted, accepted) = (drafted + sum.timings.draft_tokens, accepted + sum.timings.accepted_tokens);
        *counts.entry((sum.ids[0], sum.ids[1])).or_insert(0u64) += 1;
    }
    assert!(accepted > 0 && accepted < drafted, "{accepted} of {drafted} drafted tokens accepted");
    let unexpected: u64 = counts.iter().filter(|(k, _)| !want.contains_key(k)).map(|(_, &c)| c).sum();
    assert_eq!(unexpected, 0, "pairs the model's top-k cannot give");
    // Cells expected fewer than 5 times are pooled.
    let (mut chi2, mut cells, mut pool_e, mut pool_o) = (0.0, 0, 0.0, 0.0);
    for (k, &p) in &want {
        let (e, o) = (p * n as f64, *counts.get(k).unwrap_or(&0) as f64);
        if e < 5.0 {
            (pool_e, pool_o) = (pool_e + e, pool_o + o);
        } else {
            chi2 += (o - e).powi(2) / e;
            cells += 1;
        }
    }
    if pool_e > 0.0 {
        chi2 += (pool_o - pool_e).powi(2) / pool_e;
        cells += 1;
    }
    // The 99.9% quantile of chi-square with `cells - 1` (at most 16) degrees of freedom.
    const Q999: [f64; 17] = [
        0.0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59, 31.26, 32.91, 34.53,
        36.12, 37.70, 39.25,
    ];
    let df = cells - 1;
    eprintln!("{accepted} of {drafted} drafted tokens accepted; chi2 {chi2:.2} over {df} degrees of freedom");
    assert!(chi2 < Q999[df], "chi2 {chi2} over {df} degrees of freedom: counts {counts:?}, want {want:?}");
}

/// A draft model's output projection on the CPU is its matrix requantized to Q4_1
/// (`Backend::draft_output`): the draft's logits equal, bit for bit, those of the same model
/// whose file holds that Q4_1 matrix, tied output or not; the model loaded as a target keeps
/// its own matrix.
#[test]
fn a_drafts_output_projection_is_requantized_to_q4_1() {
    use kiln::backend::cpu::CpuBackend;
    use kiln::gguf::GgufFile;
    use kiln::model::{Model, ModelRunner, Runner};
    use kiln::quant::{self, GgmlType};
    use std::sync::Arc;
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let open = |w: kiln::gguf::GgufWriter, name: &str| {
        let p = dir.join(name);
        w.write_file(&p).unwrap();
        Arc::new(GgufFile::open(&p).unwrap())
    };
    let logits = |m: Model<CpuBackend>| {
        let r = ModelRunner::new(m, 2, 32).unwrap();
        let seq = r.new_seq();
        let mut out = Vec::new();
        // A prompt of several tokens, then two one-token steps.
        for toks in [&[40u32, 41, 42, 43, 44][..], &[45], &[46]] {
            let entries: Vec<Entry> = toks.iter().map(|&token| Entry { seq, token, output: true }).collect();
            out.extend(r.decode(&entries, OutputKind::Logits).unwrap());
        }
        out
    };
    for tied in [false, true] {
        let spec = kiln::model::synth::SynthSpec {
            embd_type: GgmlType::Q8_0,
            tied_output: tied,
            ..Default::default()
        };
        let a = open(spec.build().unwrap(), &format!("draft_out_{tied}_a.gguf"));
        // The same model with the output matrix stored as Q4_1 (made from the Q8_0 rows).
        let t = a.tensor(if tied { "token_embd.weight" } else { "output.weight" }).unwrap();
        let (rows, cols) = t.rows_cols();
        let (src, (q8, q4)) = (
            a.tensor_data(t),
            (GgmlType::Q8_0.row_size(cols).unwrap(), GgmlType::Q4_1.row_size(cols).unwrap()),
        );
        let mut data = vec![0u8; rows * q4];
        let mut f = vec![0f32; cols];
        for r in 0..rows {
            quant::dequantize_row(GgmlType::Q8_0, &src[r * q8..(r + 1) * q8], &mut f).unwrap();
            quant::quantize_row(GgmlType::Q4_1, &f, &mut data[r * q4..(r + 1) * q4]).unwrap();
        }
        let mut w = spec.build().unwrap();
        w.remove_tensor("output.weight");
        w.add_tensor("output.weight", GgmlType::Q4_1, &[cols as u64, rows as u64], data).unwrap();
        let b = open(w, &format!("draft_out_{tied}_b.gguf"));
        let draft = logits(Model::load(&a, CpuBackend::new(2)).unwrap().into_draft(&a).unwrap());
        let want = logits(Model::load(&b, CpuBackend::new(2)).unwrap());
        let target = logits(Model::load(&a, CpuBackend::new(2)).unwrap());
        assert!(
            draft.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
            "tied {tied}: draft logits"
        );
        assert!(
            draft.iter().zip(&target).any(|(x, y)| x != y),
            "tied {tied}: the draft kept the Q8_0 matrix"
        );
    }
}
