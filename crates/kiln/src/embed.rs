//! Embeddings: the model's hidden states after the final norm, pooled over the tokens of
//! a text; and rerankers' scores. `kiln embed`, `kiln rerank` and the server's
//! `/v1/embeddings` and `/v1/rerank` all use this.
//!
//! Pooling follows llama.cpp's: `Mean` averages every token's row (BOS/`[CLS]` and
//! `[SEP]` included where the tokenizer adds them), `Cls` takes the first row, `Last` the
//! last one, `None` returns every row, and `Rank` runs the classification head (`cls`,
//! then tanh, then `cls.output`, each with its bias, where the file has them) on the first
//! row. Encoders (BERT and kin) attend over the whole input; decoders causally. Many
//! inputs go through the model together, as sequences of one batch.

use crate::engine::Engine;
use crate::error::{KilnError, Result};
use crate::gguf::GgufFile;
use crate::kv::BLOCK_SIZE;
use crate::model::{Entry, OutputKind, Runner};
use crate::quant;

/// How token rows become embeddings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's hidden state, one row per token.
    None,
    /// The mean of the rows.
    #[default]
    Mean,
    /// The last token's row.
    Last,
    /// The first token's row (BERT's `[CLS]`).
    Cls,
    /// The classification head's scores of the first token's row (rerankers).
    Rank,
}

impl Pooling {
    /// The name the CLI and server use.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Last => "last",
            Pooling::Cls => "cls",
            Pooling::Rank => "rank",
        }
    }

    /// The model's own pooling: the file's `pooling_type` where it says one (encoders,
    /// rerankers), else `Mean`.
    pub fn of(engine: &Engine) -> Pooling {
        engine.config().pooling.unwrap_or_default()
    }
}

impl std::str::FromStr for Pooling {
    type Err = KilnError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "last" => Ok(Pooling::Last),
            "cls" => Ok(Pooling::Cls),
            "rank" => Ok(Pooling::Rank),
            _ => Err(KilnError::invalid(format!(
                "unknown pooling {s:?} (expected mean, cls, last, rank or none)"
            ))),
        }
    }
}

/// Runs `ids` through the model in a fresh sequence and pools the hidden states: one row
/// for `Mean`, `Cls` and `Last`, `ids.len()` rows for `None`, each `n_embd` wide; for
/// `Rank` one row of the head's scores.
pub fn embed_tokens(engine: &Engine, ids: &[u32], pooling: Pooling) -> Result<Vec<Vec<f32>>> {
    let mut out = embed_batch(engine, &[ids], pooling)?;
    Ok(out.pop().expect("one input, one result"))
}

/// [`embed_tokens`] of many inputs, run together: as many whole inputs per forward as its
/// micro-batch holds. Fails, computing nothing, if an input is empty or longer than the
/// context; the error names the input.
pub fn embed_batch(engine: &Engine, inputs: &[&[u32]], pooling: Pooling) -> Result<Vec<Vec<Vec<f32>>>> {
    for (i, ids) in inputs.iter().enumerate() {
        check_input(engine, ids).map_err(|e| KilnError::invalid(format!("input {i}: {e}")))?;
    }
    let head = match pooling {
        Pooling::Rank => Some(engine.classifier()?),
        _ => None,
    };
    let runner = engine.runner();
    let mut out = Vec::with_capacity(inputs.len());
    let mut i = 0;
    while i < inputs.len() {
        let end = group_end(runner, inputs, i);
        let rows = hidden_rows(runner, &inputs[i..end], pooling)?;
        for (ids, rows) in inputs[i..end].iter().zip(rows) {
            let d = engine.config().n_embd;
            out.push(match pooling {
                Pooling::Rank => vec![head.as_ref().expect("loaded above").scores(&rows)],
                Pooling::Mean => pool(&rows, d, Pooling::Mean),
                _ => rows.chunks_exact(d).map(<[f32]>::to_vec).collect(),
            });
            debug_assert!(pooling != Pooling::None || out.last().map(Vec::len) == Some(ids.len()));
        }
        i = end;
    }
    Ok(out)
}

/// The end of the group of inputs from `start` that one forward embeds: as many whole
/// inputs as its micro-batch holds, each in a sequence of its own whose KV blocks the pool
/// can hold beside the others' (at least one input: one within the context always fits).
pub fn group_end(runner: &dyn Runner, inputs: &[impl AsRef<[u32]>], start: usize) -> usize {
    let blocks = |ids: &[u32]| ids.len().div_ceil(BLOCK_SIZE);
    let (n_ubatch, n_blocks) = (runner.n_ubatch(), runner.n_slots() / BLOCK_SIZE);
    let (mut n, mut b) = (inputs[start].as_ref().len(), blocks(inputs[start].as_ref()));
    let mut end = start + 1;
    while let Some(ids) = inputs.get(end).map(AsRef::as_ref) {
        if n + ids.len() > n_ubatch || b + blocks(ids) > n_blocks {
            break;
        }
        (n, b) = (n + ids.len(), b + blocks(ids));
        end += 1;
    }
    end
}

/// An input the model can embed: some tokens, within the context.
pub fn check_input(engine: &Engine, ids: &[u32]) -> Result<()> {
    if ids.is_empty() {
        return Err(KilnError::invalid("nothing to embed: the text has no tokens"));
    }
    if ids.len() > engine.n_ctx() {
        return Err(KilnError::invalid(format!(
            "the input has {} tokens, more than the context ({})",
            ids.len(),
            engine.n_ctx()
        )));
    }
    Ok(())
}

/// The hidden rows pooling needs of each input (all, or the first or last), each input
/// in a sequence of its own, all in one `decode`.
fn hidden_rows(runner: &dyn Runner, inputs: &[&[u32]], pooling: Pooling) -> Result<Vec<Vec<f32>>> {
    let seqs: Vec<_> = inputs.iter().map(|_| runner.new_seq()).collect();
    let mut entries = Vec::with_capacity(inputs.iter().map(|x| x.len()).sum());
    for (&seq, ids) in seqs.iter().zip(inputs) {
        let last = ids.len() - 1;
        entries.extend(ids.iter().enumerate().map(|(i, &token)| {
            let output = match pooling {
                Pooling::None | Pooling::Mean => true,
                Pooling::Cls | Pooling::Rank => i == 0,
                Pooling::Last => i == last,
            };
            Entry { seq, token, output }
        }));
    }
    let rows = runner.decode(&entries, OutputKind::Hidden);
    for seq in seqs {
        runner.free_seq(seq);
    }
    let rows = rows?;
    let d = runner.config().n_embd;
    let mut at = 0;
    Ok(inputs
        .iter()
        .map(|ids| {
            let n = match pooling {
                Pooling::None | Pooling::Mean => ids.len(),
                _ => 1,
            };
            at += n * d;
            rows[at - n * d..at].to_vec()
        })
        .collect())
}

/// Pools row-major `rows` (`[n, n_embd]`) as `pooling` says (`Rank`: the first row; the
/// head is [`Classifier::scores`]).
pub fn pool(rows: &[f32], n_embd: usize, pooling: Pooling) -> Vec<Vec<f32>> {
    let n = rows.len() / n_embd.max(1);
    match pooling {
        Pooling::None => rows.chunks_exact(n_embd).map(<[f32]>::to_vec).collect(),
        Pooling::Last => rows.chunks_exact(n_embd).last().map(<[f32]>::to_vec).into_iter().collect(),
        Pooling::Cls | Pooling::Rank => {
            rows.chunks_exact(n_embd).next().map(<[f32]>::to_vec).into_iter().collect()
        }
        Pooling::Mean => {
            let mut sum = vec![0f64; n_embd];
            for r in rows.chunks_exact(n_embd) {
                sum.iter_mut().zip(r).for_each(|(s, &x)| *s += x as f64);
            }
            vec![sum.iter().map(|&s| (s / n.max(1) as f64) as f32).collect()]
        }
    }
}

/// Scales `v` to unit Euclidean length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

/// A reranker's classification head (llama.cpp's `rank` pooling): `cls` (`[n_embd,
/// n_embd]`) and its bias, tanh, then `cls.output` (`[n_embd, n_cls_out]`) and its bias;
/// either matrix may be absent. Computed on the host from the file, each dot as the CPU
/// matmul does it (the activation quantized to the weight's dot type first).
pub struct Classifier {
    cls: Option<Linear>,
    out: Option<Linear>,
}

struct Linear {
    ty: quant::GgmlType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    bias: Option<Vec<f32>>,
}

impl Linear {
    fn load(g: &GgufFile, name: &str, cols: usize) -> Result<Option<Linear>> {
        let Some(t) = g.tensor(&format!("{name}.weight")) else { return Ok(None) };
        let (rows, c) = t.rows_cols();
        if c != cols || t.dims.len() > 2 || !t.ty.is_supported() {
            return Err(KilnError::Tensor {
                name: t.name.clone(),
                msg: format!("shape {:?} type {}", t.dims, t.ty.name()),
            });
        }
        let bias = match g.tensor(&format!("{name}.bias")) {
            Some(b) if b.n_elements() as usize == rows => {
                let mut v = vec![0f32; rows];
                quant::dequantize_row(b.ty, g.tensor_data(b), &mut v)?;
                Some(v)
            }
            Some(b) => {
                return Err(KilnError::Tensor {
                    name: b.name.clone(),
                    msg: format!("{} values, expected {rows}", b.n_elements()),
                })
            }
            None => None,
        };
        Ok(Some(Linear { ty: t.ty, rows, cols, data: g.tensor_data(t).to_vec(), bias }))
    }

    fn apply(&self, x: &[f32]) -> Result<Vec<f32>> {
        let vdt = self.ty.vec_dot_type();
        let act: Vec<u8> = if vdt == quant::GgmlType::F32 {
            bytemuck::cast_slice(x).to_vec()
        } else {
            let mut a = vec![0u8; vdt.row_size(self.cols)?];
            quant::quantize_activation(vdt, x, &mut a)?;
            a
        };
        let dot = quant::vec_dot_fn(self.ty);
        let rs = self.ty.row_size(self.cols)?;
        Ok((0..self.rows)
            .map(|r| {
                let y = dot(&self.data[r * rs..(r + 1) * rs], &act, self.cols);
                y + self.bias.as_ref().map_or(0.0, |b| b[r])
            })
            .collect())
    }
}

impl Classifier {
    /// The head of `g` (a model of width `n_embd`); an error naming why where the model
    /// has none (`pooling_type` is not rank, or no `cls` tensors).
    pub fn load(g: &GgufFile, n_embd: usize, pooling: Option<Pooling>) -> Result<Classifier> {
        let cls = Linear::load(g, "cls", n_embd)?;
        let out = Linear::load(g, "cls.output", cls.as_ref().map_or(n_embd, |c| c.rows))?;
        if pooling != Some(Pooling::Rank) || (cls.is_none() && out.is_none()) {
            return Err(KilnError::invalid(
                "this model has no classification head (its pooling_type is not rank): it cannot rerank",
            ));
        }
        Ok(Classifier { cls, out })
    }

    /// The head's scores of a pooled row.
    pub fn scores(&self, row: &[f32]) -> Vec<f32> {
        let mut x = row.to_vec();
        if let Some(cls) = &self.cls {
            x = cls.apply(&x).expect("shapes checked at load");
            x.iter_mut().for_each(|v| *v = v.tanh());
        }
        if let Some(out) = &self.out {
            x = out.apply(&x).expect("shapes checked at load");
        }
        x
    }
}

/// `(index, score)` of each score, best first (ties in input order), the first `top_n`
/// of them where given.
pub fn rank(scores: impl IntoIterator<Item = f32>, top_n: Option<usize>) -> Vec<(usize, f32)> {
    let mut v: Vec<(usize, f32)> = scores.into_iter().enumerate().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(top_n.unwrap_or(usize::MAX));
    v
}

/// The tokens of a reranker's input: `[CLS] query [SEP] document [SEP]` (the tokenizer's
/// own special tokens; BERT's pair encoding, as `llama-embedding` builds it), or the
/// file's `rerank` template where it has one.
pub fn rerank_input(engine: &Engine, query: &str, document: &str) -> Result<Vec<u32>> {
    let tok = engine.tokenizer();
    if let Some(tpl) = engine.gguf().get_str("tokenizer.chat_template.rerank")? {
        let text = tpl.replace("{query}", query).replace("{document}", document);
        return tok.encode(&text, true, true);
    }
    let mut ids = tok.encode(query, true, true)?;
    let doc = tok.encode(document, false, true)?;
    let sep =
        tok.sep().or(tok.eos()).ok_or_else(|| KilnError::invalid("the vocabulary has no separator token"))?;
    if ids.last() != Some(&sep) {
        ids.push(sep);
    }
    ids.extend(doc);
    ids.push(sep);
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_of_rows() {
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(pool(&rows, 2, Pooling::Mean), vec![vec![3.0, 4.0]]);
        assert_eq!(pool(&rows, 2, Pooling::Last), vec![vec![5.0, 6.0]]);
        assert_eq!(pool(&rows, 2, Pooling::Cls), vec![vec![1.0, 2.0]]);
        assert_eq!(pool(&rows, 2, Pooling::None).len(), 3);
        let mut v = [3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        assert!("max".parse::<Pooling>().is_err());
        for p in [Pooling::None, Pooling::Mean, Pooling::Last, Pooling::Cls, Pooling::Rank] {
            assert_eq!(p.as_str().parse::<Pooling>().unwrap(), p);
        }
    }
}
