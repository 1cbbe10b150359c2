//! Drafts from a second model: a smaller model of the same vocabulary, its own sequence
//! in its own KV pool following the session's conversation.

use super::Drafted;
use crate::error::{KilnError, Result};
use crate::model::{Entry, OutputKind, Runner, SeqId};
use crate::sample::Sampler;
use crate::tokenizer::Tokenizer;

/// Up to `max` tokens after `context` from the draft model: its sequence `seq` made to hold
/// `context` first (keeping the common prefix it holds, as a session does), then one token
/// at a time drawn from its distribution under `sampler`'s chain. Drafting stops before a
/// token whose probability under the draft (the softmax of its logits) is below `p_min` or
/// that the model's vocabulary (`n_vocab`) lacks, and after an end-of-generation token
/// (`is_eog`). Nothing is drafted when the context holds a token the draft does not know.
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
    let draft_vocab = runner.config().n_vocab;
    if max == 0 || context.is_empty() || context.iter().any(|&t| t as usize >= draft_vocab) {
        return Ok(Vec::new());
    }
    let n = context.len();
    let kept = runner.reuse_prefix(seq, &context[..n - 1], None);
    let entries: Vec<Entry> =
        (kept..n).map(|i| Entry { seq, token: context[i], output: i + 1 == n }).collect();
    let mut logits = Vec::new();
    for chunk in entries.chunks(runner.n_ubatch().max(1)) {
        let out = runner.decode(chunk, OutputKind::Logits)?;
        if !out.is_empty() {
            logits = out;
        }
    }
    let mut out = Vec::with_capacity(max);
    loop {
        let dist = sampler.distribution(&logits).to_vec();
        let certain = dist.len() == 1;
        let id = if certain { dist[0].id } else { sampler.draw_from(&dist) };
        if probability(&logits, id) < p_min || id as usize >= n_vocab {
            break;
        }
        out.push(Drafted { id, q: (!certain).then_some(dist) });
        if out.len() == max || is_eog(id) {
            break;
        }
        logits = runner.decode(&[Entry { seq, token: id, output: true }], OutputKind::Logits)?;
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
