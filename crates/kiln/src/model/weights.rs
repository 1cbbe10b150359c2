//! The tensors of a model, looked up by their GGUF names and checked against the config:
//! the model-wide ones here, each layer's by its blocks (`block/`).

use std::sync::Arc;

use super::block::{LayerWeights, Norm};
use super::config::ModelConfig;
use crate::backend::Backend;
use crate::error::{KilnError, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::progress::{ProgressFn, Stage};
use crate::quant;

pub struct Weights<B: Backend> {
    pub token_embd: B::Weight,
    /// Encoders' inputs: learned absolute positions (`position_embd`), the row of token
    /// type 0 added to every token (`token_types`: llama.cpp embeds every token as
    /// type 0), and a norm of the sum (`token_embd_norm`).
    pub pos_embd: Option<B::Weight>,
    pub type_embd: Option<B::Weight>,
    pub embd_norm: Option<Norm<B::Weight>>,
    /// `None`: the last layer's norm is the final one (BERT).
    pub output_norm: Option<Norm<B::Weight>>,
    /// `None`: tied to `token_embd` (or an encoder, which has no logits).
    pub output: Option<B::Weight>,
    pub layers: Vec<LayerWeights<B>>,
    /// Divisors of theta per dimension pair: llama-3's `rope_freqs` for every context, or
    /// LongRoPE's (phi3) `rope_factors_long` past the original training context and
    /// `rope_factors_short` within it.
    pub rope_freqs: Option<Arc<Vec<f32>>>,
    pub rope_long: Option<Arc<Vec<f32>>>,
    pub rope_short: Option<Arc<Vec<f32>>>,
}

/// Looks tensors up in a file, checks their shapes and loads them on a backend.
pub struct Loader<'a, B: Backend> {
    pub g: &'a Arc<GgufFile>,
    pub cfg: &'a ModelConfig,
    backend: &'a B,
}

fn missing(name: &str) -> KilnError {
    KilnError::Tensor { name: name.into(), msg: "missing from the file".into() }
}

impl<B: Backend> Loader<'_, B> {
    /// An encoder's weights are marked as such (`Backend::encoder_weight`).
    fn mark(&self, w: B::Weight) -> B::Weight {
        if self.cfg.causal {
            w
        } else {
            self.backend.encoder_weight(w)
        }
    }

    /// Loads `name`, checking its shape is `[cols, rows]` (ggml order).
    pub fn get(&self, name: &str, cols: usize, rows: usize) -> Result<B::Weight> {
        self.opt(name, cols, rows)?.ok_or_else(|| missing(name))
    }

    pub fn opt(&self, name: &str, cols: usize, rows: usize) -> Result<Option<B::Weight>> {
        match self.info(name, cols, rows)? {
            Some(t) => self.backend.load_weight(self.g, t).map(|w| Some(self.mark(w))),
            None => Ok(None),
        }
    }

    /// The tensor `name`, checked to be `[cols, rows]`.
    pub fn info(&self, name: &str, cols: usize, rows: usize) -> Result<Option<&TensorInfo>> {
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

    /// The vector `name` of `n` values, read to the host (`None` where the file lacks it).
    pub fn host_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>> {
        let Some(t) = self.info(name, n, 1)? else { return Ok(None) };
        let mut v = vec![0.0; n];
        quant::dequantize_row(t.ty, self.g.tensor_data(t), &mut v)
            .map_err(|e| KilnError::Tensor { name: name.into(), msg: e.to_string() })?;
        Ok(Some(v))
    }

    /// Weights of one input (q/k/v; gate/up), loaded together: `N` `(name, cols, rows)`.
    pub fn group<const N: usize>(&self, specs: [(String, usize, usize); N]) -> Result<[B::Weight; N]> {
        let mut ts = Vec::with_capacity(N);
        for (name, cols, rows) in &specs {
            ts.push(self.info(name, *cols, *rows)?.ok_or_else(|| missing(name))?.clone());
        }
        self.load_together(&ts)
    }

    /// A fused tensor (`attn_qkv`, phi3's `ffn_up`) of `cols` columns split by rows into
    /// parts of `rows[i]` rows, loaded together as weights of one input. Its rows are
    /// contiguous, so each part is a view of the file: the same dots as separate tensors.
    pub fn split<const N: usize>(
        &self,
        name: &str,
        cols: usize,
        rows: [usize; N],
    ) -> Result<Option<[B::Weight; N]>> {
        let Some(t) = self.info(name, cols, rows.iter().sum())? else { return Ok(None) };
        let row_size = t.ty.row_size(cols)? as u64;
        let mut offset = t.offset;
        let parts: Vec<TensorInfo> = rows
            .iter()
            .map(|&r| {
                let part = TensorInfo {
                    name: t.name.clone(),
                    dims: vec![cols as u64, r as u64],
                    ty: t.ty,
                    offset,
                    size: row_size * r as u64,
                    part: t.part,
                };
                offset += part.size;
                part
            })
            .collect();
        self.load_together(&parts).map(Some)
    }

    /// The 3-D expert tensor `name`, checked to be `[cols, sum(parts), n_expert]`, as one
    /// stack per part (`Backend::load_experts`).
    pub fn experts(
        &self,
        name: &str,
        cols: usize,
        parts: &[usize],
        n_expert: usize,
    ) -> Result<Option<Vec<B::Experts>>> {
        let Some(t) = self.g.tensor(name) else { return Ok(None) };
        let want = [cols as u64, parts.iter().sum::<usize>() as u64, n_expert as u64];
        if t.dims != want {
            return Err(KilnError::Tensor {
                name: name.into(),
                msg: format!("shape {:?}, expected {want:?}", t.dims),
            });
        }
        self.backend.load_experts(self.g, t, n_expert, parts).map(Some)
    }

    /// The 3-D expert tensors `names` of one input, each checked to be `[cols, rows,
    /// n_expert]` (`Backend::load_experts_together`).
    pub fn experts_together(
        &self,
        names: &[&str],
        cols: usize,
        rows: usize,
        n_expert: usize,
    ) -> Result<Vec<B::Experts>> {
        let want = [cols as u64, rows as u64, n_expert as u64];
        let mut ts = Vec::with_capacity(names.len());
        for &name in names {
            let t = self.g.tensor(name).ok_or_else(|| missing(name))?;
            if t.dims != want {
                return Err(KilnError::Tensor {
                    name: name.into(),
                    msg: format!("shape {:?}, expected {want:?}", t.dims),
                });
            }
            ts.push(t);
        }
        self.backend.load_experts_together(self.g, &ts, n_expert)
    }

    /// `split` of a fused tensor the file must have.
    pub fn fused<const N: usize>(&self, name: &str, cols: usize, rows: [usize; N]) -> Result<[B::Weight; N]> {
        self.split(name, cols, rows)?.ok_or_else(|| missing(name))
    }

    /// A fused vector (`attn_qkv.bias`) split into parts of `lens[i]` values: views of
    /// the file, loaded as vectors of their own.
    pub fn split_vector<const N: usize>(
        &self,
        name: &str,
        lens: [usize; N],
    ) -> Result<Option<[B::Weight; N]>> {
        let Some(t) = self.info(name, lens.iter().sum(), 1)? else { return Ok(None) };
        let elem = match t.ty {
            quant::GgmlType::F32 => 4,
            quant::GgmlType::F16 => 2,
            _ => {
                return Err(KilnError::Tensor {
                    name: name.into(),
                    msg: "a fused bias must be F32 or F16".into(),
                })
            }
        };
        let mut offset = t.offset;
        let mut parts = Vec::with_capacity(N);
        for &n in &lens {
            let part = TensorInfo { dims: vec![n as u64], offset, size: (elem * n) as u64, ..t.clone() };
            offset += part.size;
            parts.push(self.backend.load_weight(self.g, &part)?);
        }
        Ok(Some(parts.try_into().map_err(|_| KilnError::Backend("split_vector: wrong count".into()))?))
    }

    /// Row `r` of the matrix `name` (`[cols, rows]`), as a vector.
    pub fn row(&self, name: &str, cols: usize, r: usize) -> Result<Option<B::Weight>> {
        let Some(t) = self.g.tensor(name) else { return Ok(None) };
        let (rows, c) = t.rows_cols();
        if c != cols || r >= rows || t.dims.len() > 2 {
            return Err(KilnError::Tensor {
                name: name.into(),
                msg: format!("shape {:?}, expected [{cols}, >{r}]", t.dims),
            });
        }
        let row_size = t.ty.row_size(cols)? as u64;
        let part = TensorInfo {
            dims: vec![cols as u64],
            offset: t.offset + row_size * r as u64,
            size: row_size,
            ..t.clone()
        };
        self.backend.load_weight(self.g, &part).map(Some)
    }

    fn load_together<const N: usize>(&self, ts: &[TensorInfo]) -> Result<[B::Weight; N]> {
        let refs: Vec<&TensorInfo> = ts.iter().collect();
        let ws: Vec<B::Weight> =
            self.backend.load_weights(self.g, &refs)?.into_iter().map(|w| self.mark(w)).collect();
        ws.try_into().map_err(|_| KilnError::Backend("load_weights returned a wrong count".into()))
    }
}

impl<B: Backend> Weights<B> {
    /// Loads every weight; `progress` hears the bytes of the layers loaded so far.
    pub fn load(
        g: &Arc<GgufFile>,
        cfg: &ModelConfig,
        backend: &B,
        progress: Option<(&ProgressFn, Stage, &str)>,
    ) -> Result<Self> {
        let l = Loader { g, cfg, backend };
        let d = cfg.n_embd;
        let total: u64 = g.tensors.iter().map(|t| t.size).sum();
        let mut done = 0;
        let layers = cfg
            .layers
            .iter()
            .enumerate()
            .map(|(il, layer)| {
                let w = LayerWeights::load(&l, il, layer)?;
                if let Some((f, stage, label)) = progress {
                    let prefix = format!("blk.{il}.");
                    done +=
                        g.tensors.iter().filter(|t| t.name.starts_with(&prefix)).map(|t| t.size).sum::<u64>();
                    f.report(stage, label, done.min(total), total);
                }
                Ok(w)
            })
            .collect::<Result<_>>()?;
        let n_rot = cfg.layers.iter().find_map(|l| l.mixer.attention()?.rope.as_ref()).map_or(0, |r| r.n_rot);
        let factors = |name: &str| -> Result<Option<Arc<Vec<f32>>>> {
            let Some(t) = g.tensor(name) else { return Ok(None) };
            if t.n_elements() as usize != n_rot / 2 || t.dims.len() != 1 {
                return Err(KilnError::Tensor {
                    name: t.name.clone(),
                    msg: format!("shape {:?}, expected [n_rot/2 = {}]", t.dims, n_rot / 2),
                });
            }
            let mut v = vec![0.0; n_rot / 2];
            quant::dequantize_row(t.ty, g.tensor_data(t), &mut v)?;
            Ok(Some(Arc::new(v)))
        };
        let e = &cfg.embd;
        let weights = Weights {
            token_embd: l.get("token_embd.weight", d, cfg.n_vocab)?,
            pos_embd: e.positions.then(|| l.get("position_embd.weight", d, cfg.n_ctx_train)).transpose()?,
            type_embd: if e.token_types { l.row("token_types.weight", d, 0)? } else { None },
            embd_norm: e.norm.then(|| Norm::load(&l, "token_embd_norm", d)).transpose()?,
            output_norm: cfg.output_norm.map(|name| Norm::load(&l, name, d)).transpose()?,
            output: l.opt("output.weight", d, cfg.n_vocab)?,
            layers,
            rope_freqs: factors("rope_freqs.weight")?,
            rope_long: factors("rope_factors_long.weight")?,
            rope_short: factors("rope_factors_short.weight")?,
        };
        if let Some((f, stage, label)) = progress {
            f.report(stage, label, total, total);
        }
        Ok(weights)
    }
}
