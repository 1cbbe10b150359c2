//! The tensors of a model, looked up by their GGUF names and checked against the config.

use std::sync::Arc;

use super::config::ModelConfig;
use crate::backend::Backend;
use crate::error::{KilnError, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant;

pub struct LayerWeights<W> {
    pub attn_norm: W,
    pub wq: W,
    pub wk: W,
    pub wv: W,
    pub bq: Option<W>,
    pub bk: Option<W>,
    pub bv: Option<W>,
    pub wo: W,
    /// Per-head RMSNorm of q and k (qwen3, gemma3).
    pub q_norm: Option<W>,
    pub k_norm: Option<W>,
    pub attn_post_norm: Option<W>,
    pub ffn_norm: W,
    pub ffn_gate: W,
    pub ffn_up: W,
    pub ffn_down: W,
    pub ffn_post_norm: Option<W>,
}

pub struct Weights<W> {
    pub token_embd: W,
    pub output_norm: W,
    /// `None`: tied to `token_embd`.
    pub output: Option<W>,
    pub layers: Vec<LayerWeights<W>>,
    /// llama-3 `rope_freqs` (divisors of theta per dimension pair).
    pub rope_freqs: Option<Vec<f32>>,
}

struct Loader<'a, B: Backend> {
    g: &'a Arc<GgufFile>,
    backend: &'a B,
}

impl<B: Backend> Loader<'_, B> {
    /// Loads `name`, checking its shape is `[cols, rows]` (ggml order).
    fn get(&self, name: &str, cols: usize, rows: usize) -> Result<B::Weight> {
        self.opt(name, cols, rows)?
            .ok_or_else(|| KilnError::Tensor { name: name.into(), msg: "missing from the file".into() })
    }

    fn opt(&self, name: &str, cols: usize, rows: usize) -> Result<Option<B::Weight>> {
        match self.info(name, cols, rows)? {
            Some(t) => self.backend.load_weight(self.g, t).map(Some),
            None => Ok(None),
        }
    }

    /// The tensor `name`, checked to be `[cols, rows]`.
    fn info(&self, name: &str, cols: usize, rows: usize) -> Result<Option<&TensorInfo>> {
        let Some(t) = self.g.tensor(name) else { return Ok(None) };
        let (r, c) = t.rows_cols();
        if (r, c) != (rows, cols) || t.dims.len() > 2 {
            return Err(KilnError::Tensor {
                name: name.into(),
                msg: format!("shape {:?}, expected [{cols}, {rows}]", t.dims),
            });
        }
        Ok(Some(t))
    }

    /// Weights of one input (q/k/v; gate/up), loaded together: `N` `(name, cols, rows)`.
    fn group<const N: usize>(&self, specs: [(String, usize, usize); N]) -> Result<[B::Weight; N]> {
        let mut ts = Vec::with_capacity(N);
        for (name, cols, rows) in &specs {
            let t = self.info(name, *cols, *rows)?;
            ts.push(t.ok_or_else(|| KilnError::Tensor {
                name: name.clone(),
                msg: "missing from the file".into(),
            })?);
        }
        let ws = self.backend.load_weights(self.g, &ts)?;
        ws.try_into().map_err(|_| KilnError::Backend("load_weights returned a wrong count".into()))
    }
}

impl<W> Weights<W> {
    pub fn load<B: Backend<Weight = W>>(g: &Arc<GgufFile>, cfg: &ModelConfig, backend: &B) -> Result<Self> {
        let l = Loader { g, backend };
        let (d, q, kv, ff, hd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff, cfg.head_dim);
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            let [wq, wk, wv] = l.group([
                (n("attn_q.weight"), d, q),
                (n("attn_k.weight"), d, kv),
                (n("attn_v.weight"), d, kv),
            ])?;
            let [ffn_gate, ffn_up] = l.group([(n("ffn_gate.weight"), d, ff), (n("ffn_up.weight"), d, ff)])?;
            layers.push(LayerWeights {
                attn_norm: l.get(&n("attn_norm.weight"), d, 1)?,
                wq,
                wk,
                wv,
                bq: l.opt(&n("attn_q.bias"), q, 1)?,
                bk: l.opt(&n("attn_k.bias"), kv, 1)?,
                bv: l.opt(&n("attn_v.bias"), kv, 1)?,
                wo: l.get(&n("attn_output.weight"), q, d)?,
                q_norm: l.opt(&n("attn_q_norm.weight"), hd, 1)?,
                k_norm: l.opt(&n("attn_k_norm.weight"), hd, 1)?,
                attn_post_norm: l.opt(&n("post_attention_norm.weight"), d, 1)?,
                ffn_norm: l.get(&n("ffn_norm.weight"), d, 1)?,
                ffn_gate,
                ffn_up,
                ffn_down: l.get(&n("ffn_down.weight"), ff, d)?,
                ffn_post_norm: l.opt(&n("post_ffw_norm.weight"), d, 1)?,
            });
        }
        if cfg.post_norms && layers.iter().any(|l| l.attn_post_norm.is_none() || l.ffn_post_norm.is_none()) {
            return Err(KilnError::Tensor { name: "blk.*.post_*_norm.weight".into(), msg: "missing".into() });
        }
        let rope_freqs = match g.tensor("rope_freqs.weight") {
            None => None,
            Some(t) => {
                if t.n_elements() as usize != cfg.n_rot / 2 {
                    return Err(KilnError::Tensor {
                        name: t.name.clone(),
                        msg: format!("{} values, expected n_rot/2 = {}", t.n_elements(), cfg.n_rot / 2),
                    });
                }
                let mut v = vec![0.0; cfg.n_rot / 2];
                quant::dequantize_row(t.ty, g.tensor_data(t), &mut v)?;
                Some(v)
            }
        };
        Ok(Weights {
            token_embd: l.get("token_embd.weight", d, cfg.n_vocab)?,
            output_norm: l.get("output_norm.weight", d, 1)?,
            output: l.opt("output.weight", d, cfg.n_vocab)?,
            layers,
            rope_freqs,
        })
    }
}
