//! Drafts from a second model: a smaller model of the same vocabulary, its own sequence
//! in its own KV pool following the session's conversation.

use super::Drafted;
use crate::error::{KilnError, Result};
use crate::model::{Entry, OutputKind, Runner, SeqId};
use crate::sample::Sampler;
use crate::tokenizer::Tokenizer;

/// One sequence's drafting request to [`draft_batch`]: up to `max` tokens after `context`
/// from the draft model's sequence `seq`, drawn under `sampler`'s chain.
pub struct Request<'a> {
    pub seq: SeqId,
    pub context: &'a [u32],
    pub max: usize,
    pub sampler: &'a mut Sampler,
}

/// Up to `max` tokens after `context` from the draft model: [`draft_batch`] for one
/// sequence.
#[allow(clippy::too_many_arguments)]
pub fn draft(
    runner: &dyn Runner,
    seq: SeqId,
    context: &[u32],
    max: usize,
    sampler: &mut Sampler,
    p_min: f32,
    n_vocab: usize,
    is_eog: impl Fn(u32) -> bool,
) -> Result<Vec<Drafted>> {
    let mut req = [Request { seq, context, max, sampler }];
    Ok(draft_batch(runner, &mut req, p_min, n_vocab, is_eog)?.pop().unwrap_or_default())
}

/// Drafts for several sequences at once, each step one batched forward of the draft model
/// over every sequence still drafting (batch invariance: a sequence drafts the same tokens
/// alone or beside others). Each request's sequence is made to hold its `context` first
/// (keeping the common prefix it holds, as a session does; all catching up in one forward),
/// then tokens are drawn one at a time from its distribution under the request's sampler.
/// A request's drafting stops before a token whose probability under the draft (the
/// softmax of its logits) is below `p_min` or that the model's vocabulary (`n_vocab`)
/// lacks, and after an end-of-generation token (`is_eog`). Nothing is drafted for a context
/// holding a token the draft does not know. The drafts come back in the requests' order.
pub fn draft_batch(
    runner: &dyn Runner,
    reqs: &mut [Request],
    p_min: f32,
    n_vocab: usize,
    is_eog: impl Fn(u32) -> bool,
) -> Result<Vec<Vec<Drafted>>> {
    let draft_vocab = runner.config().n_vocab;
    let mut out = vec![Vec::new(); reqs.len()];
    // The requests drafting; `logits` holds their rows, in this order.
    let mut live: Vec<usize> = (0..reqs.len())
        .filter(|&i| {
            let r = &reqs[i];
            r.max > 0 && !r.context.is_empty() && r.context.iter().all(|&t| (t as usize) < draft_vocab)
        })
        .collect();
    let mut entries = Vec::new();
    for &i in &live {
        let (seq, context) = (reqs[i].seq, reqs[i].context);
        let n = context.len();
        let kept = runner.reuse_prefix(seq, &context[..n - 1], None);
        entries.extend((kept..n).map(|j| Entry { seq, token: context[j], output: j + 1 == n }));
    }
    let mut logits = Vec::with_capacity(live.len() * draft_vocab);
    for chunk in entries.chunks(runner.n_ubatch().max(1)) {
        logits.extend(runner.decode(chunk, OutputKind::Logits)?);
    }
    while !live.is_empty() {
        let mut next = Vec::with_capacity(live.len());
        entries.clear();
        for (k, &i) in live.iter().enumerate() {
            let row = &logits[k * draft_vocab..(k + 1) * draft_vocab];
            let r = &mut reqs[i];
            let dist = r.sampler.distribution(row).to_vec();
            let certain = dist.len() == 1;
            let id = if certain { dist[0].id } else { r.sampler.draw_from(&dist) };
            if probability(row, id) < p_min || id as usize >= n_vocab {
                continue;
            }
            out[i].push(Drafted { id, q: (!certain).then_some(dist) });
            if out[i].len() < r.max && !is_eog(id) {
                entries.push(Entry { seq: r.seq, token: id, output: true });
                next.push(i);
            }
        }
        if entries.is_empty() {
            break;
        }
        logits = runner.decode(&entries, OutputKind::Logits)?;
        live = next;
    }
    Ok(out)
}

/// The softmax of `logits` at `id`.
fn probability(logits: &[f32], id: u32) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    (((logits[id as usize] - max) as f64).exp() / sum) as f32
}

/// Checks that a draft model's tokenizer can stand in for the model's: the same kind of
/// vocabulary, the same BOS and EOS where they are added, vocabulary sizes within 128, and
/// the same text for every token id both have (llama.cpp's check, from id 5 on).
pub fn check_compatible(model: &Tokenizer, draft: &Tokenizer) -> Result<()> {
    let bad = |m: String| {
        Err(KilnError::invalid(format!("the draft model's vocabulary does not match the model's: {m}")))
    };
    if model.kind_name() != draft.kind_name() {
        return bad(format!("{} vocabulary, the model's is {}", draft.kind_name(), model.kind_name()));
    }
    if model.add_bos() != draft.add_bos() || (model.add_bos() && model.bos() != draft.bos()) {
        return bad(format!("BOS {:?}, the model's is {:?}", draft.bos(), model.bos()));
    }
    if model.add_eos() != draft.add_eos() || (model.add_eos() && model.eos() != draft.eos()) {
        return bad(format!("EOS {:?}, the model's is {:?}", draft.eos(), model.eos()));
    }
    let (nm, nd) = (model.n_vocab(), draft.n_vocab());
    if nm.abs_diff(nd) > 128 {
        return bad(format!("{nd} tokens, the model has {nm}"));
    }
    if let Some(id) = (5..nm.min(nd) as u32).find(|&id| model.token_text(id) != draft.token_text(id)) {
        return bad(format!(
            "token {id} is {:?}, the model's is {:?}",
            draft.token_text(id),
            model.token_text(id)
        ));
    }
    Ok(())
}
