//! The vision encoder: a ViT (patch embedding, learned position embeddings, pre-norm blocks
//! of LayerNorm, bidirectional multi-head attention and a GELU MLP, a final LayerNorm) and
//! the projector of its family, as llama.cpp's `clip_graph_siglip` builds them. Matrices go
//! through the CPU backend's matmul (ggml's activation rounding and dot order); GELU and
//! RMSNorm are the CPU backend's; LayerNorm, attention and the projectors' reshuffles are
//! the encoder's own (`vision::ops`).

use std::sync::Arc;

use super::config::{ClipConfig, Projector};
use super::ops;
use super::preprocess::Tile;
use crate::backend::cpu::{self, CpuBackend, CpuWeight};
use crate::backend::Backend;
use crate::error::{KilnError, Result};
use crate::gguf::{GgufFile, GgufWriter, TensorInfo};
use crate::quant::{self, GgmlType};

/// A LayerNorm's (or RMSNorm's) weight and optional bias.
struct Norm {
    w: Vec<f32>,
    b: Option<Vec<f32>>,
}

/// A matrix and its optional bias.
struct Linear {
    w: CpuWeight,
    b: Option<Vec<f32>>,
}

struct Block {
    ln1: Norm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln2: Norm,
    up: Linear,
    down: Linear,
}

enum Head {
    /// Pixel shuffle, then `fc` (no bias).
    Idefics3 { fc: CpuWeight },
    /// Average pooling, RMS norm with `norm`, then `proj` (transposed at load).
    Gemma3 { norm: Vec<f32>, proj: CpuWeight },
}

/// An mmproj file's vision encoder and projector, ready to encode preprocessed tiles.
pub struct VisionEncoder {
    cfg: ClipConfig,
    be: Arc<CpuBackend>,
    patch: CpuWeight,
    patch_bias: Option<Vec<f32>>,
    pos: Vec<f32>,
    blocks: Vec<Block>,
    post_ln: Option<Norm>,
    head: Head,
}

fn tensor<'a>(g: &'a GgufFile, name: &str) -> Result<&'a TensorInfo> {
    g.tensor(name)
        .ok_or_else(|| KilnError::Tensor { name: name.into(), msg: "missing from the mmproj file".into() })
}

fn shape_err(t: &TensorInfo, want: &str) -> KilnError {
    KilnError::Tensor { name: t.name.clone(), msg: format!("shape {:?}, expected {want}", t.dims) }
}

/// A vector of `n` values (any float type), dequantized.
fn vector(g: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>> {
    let t = tensor(g, name)?;
    if t.n_elements() != n as u64 {
        return Err(shape_err(t, &format!("{n} values")));
    }
    let mut out = vec![0f32; n];
    quant::dequantize_row(t.ty, g.tensor_data(t), &mut out)?;
    Ok(out)
}

fn opt_vector(g: &GgufFile, name: &str, n: usize) -> Result<Option<Vec<f32>>> {
    g.tensor(name).map(|_| vector(g, name, n)).transpose()
}

impl VisionEncoder {
    /// Reads an mmproj file's encoder; matmuls run on `be`.
    pub fn load(g: Arc<GgufFile>, be: Arc<CpuBackend>) -> Result<Self> {
        let cfg = ClipConfig::from_gguf(&g)?;
        let (d, ff, ps) = (cfg.n_embd, cfg.n_ff, cfg.patch_size);
        let matrix = |name: &str, rows: usize, cols: usize| -> Result<CpuWeight> {
            let t = tensor(&g, name)?;
            if t.rows_cols() != (rows, cols) {
                return Err(shape_err(t, &format!("[{cols}, {rows}]")));
            }
            be.load_weight(&g, t)
        };
        let linear = |name: &str, rows: usize, cols: usize| -> Result<Linear> {
            Ok(Linear {
                w: matrix(&format!("{name}.weight"), rows, cols)?,
                b: opt_vector(&g, &format!("{name}.bias"), rows)?,
            })
        };
        let norm = |name: &str| -> Result<Norm> {
            Ok(Norm {
                w: vector(&g, &format!("{name}.weight"), d)?,
                b: opt_vector(&g, &format!("{name}.bias"), d)?,
            })
        };
        let n_pos = cfg.n_patches_side().pow(2);
        let patch_t = tensor(&g, "v.patch_embd.weight")?;
        if patch_t.dims != [ps as u64, ps as u64, 3, d as u64] {
            return Err(shape_err(patch_t, &format!("[{ps}, {ps}, 3, {d}]")));
        }
        // The kernel as a matrix: a row of 3·ps·ps values (channel, row, column) per output.
        let mut patch_t = patch_t.clone();
        patch_t.dims = vec![(3 * ps * ps) as u64, d as u64];
        // llama.cpp's patch embedding is `ggml_conv_2d`: im2col to F16 (F32 for a BF16
        // kernel), then a matmul of those pixel rows by the kernel converted to their type.
        // An F32 kernel is rounded to F16 here, once, a BF16 one widened; the pixels are
        // rounded by the F16 matmul.
        let patch = match patch_t.ty {
            GgmlType::F16 => be.load_weight(&g, &patch_t)?,
            ty => {
                let mut vals = vec![0f32; 3 * ps * ps * d];
                quant::dequantize_row(ty, g.tensor_data(&patch_t), &mut vals)?;
                let as_ty = if ty == GgmlType::BF16 { GgmlType::F32 } else { GgmlType::F16 };
                typed_weight(&be, &patch_t.name, as_ty, d, 3 * ps * ps, &vals)?
            }
        };
        let patch_bias = opt_vector(&g, "v.patch_embd.bias", d)?;
        let pos = vector(&g, "v.position_embd.weight", d * n_pos)?;
        let mut blocks = Vec::with_capacity(cfg.n_layer);
        for il in 0..cfg.n_layer {
            let n = |s: &str| format!("v.blk.{il}.{s}");
            // Some converters wrote ffn_up and ffn_down under each other's names (llama.cpp
            // swaps them back the same way: by the shapes).
            let swapped = g.tensor(&n("ffn_down.weight")).is_some_and(|t| t.rows_cols().1 == d && ff != d);
            let (up, down) = if swapped { ("ffn_down", "ffn_up") } else { ("ffn_up", "ffn_down") };
            blocks.push(Block {
                ln1: norm(&n("ln1"))?,
                q: linear(&n("attn_q"), d, d)?,
                k: linear(&n("attn_k"), d, d)?,
                v: linear(&n("attn_v"), d, d)?,
                o: linear(&n("attn_out"), d, d)?,
                ln2: norm(&n("ln2"))?,
                up: linear(&n(up), ff, d)?,
                down: linear(&n(down), d, ff)?,
            });
        }
        let post_ln = if g.tensor("v.post_ln.weight").is_some() { Some(norm("v.post_ln")?) } else { None };
        let m2 = cfg.n_merge * cfg.n_merge;
        let head = match cfg.projector {
            Projector::Idefics3 => {
                Head::Idefics3 { fc: matrix("mm.model.fc.weight", cfg.n_embd_out, d * m2)? }
            }
            Projector::Gemma3 => {
                let t = tensor(&g, "mm.input_projection.weight")?;
                if t.rows_cols() != (d, cfg.n_embd_out) {
                    return Err(shape_err(t, &format!("[{}, {d}]", cfg.n_embd_out)));
                }
                Head::Gemma3 {
                    norm: vector(&g, "mm.soft_emb_norm.weight", d)?,
                    proj: transposed(&be, &g, t)?,
                }
            }
        };
        Ok(VisionEncoder { cfg, be, patch, patch_bias, pos, blocks, post_ln, head })
    }

    pub fn config(&self) -> &ClipConfig {
        &self.cfg
    }

    /// The projected embeddings of one preprocessed tile: `n_tokens_per_image` rows of
    /// `n_embd_out`, row-major.
    pub fn encode(&self, tile: &Tile) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let size = cfg.image_size;
        if tile.width != size || tile.height != size || tile.data.len() != size * size * 3 {
            return Err(KilnError::invalid(format!(
                "a {}x{} tile for an encoder of {size}x{size} images",
                tile.width, tile.height
            )));
        }
        let (d, ps, side) = (cfg.n_embd, cfg.patch_size, cfg.n_patches_side());
        let n = side * side;
        let be = &*self.be;

        // Patch embedding: each patch's pixels in the kernel's order (channel, row, column).
        let k = 3 * ps * ps;
        let mut cols = vec![0f32; n * k];
        for (p, col) in cols.chunks_exact_mut(k).enumerate() {
            let (py, px) = (p / side, p % side);
            for c in 0..3 {
                for ky in 0..ps {
                    for kx in 0..ps {
                        let (y, x) = (py * ps + ky, px * ps + kx);
                        col[(c * ps + ky) * ps + kx] = tile.data[(y * size + x) * 3 + c];
                    }
                }
            }
        }
        let mut x = vec![0f32; n * d];
        be.matmul(&self.patch, &cols, n, &mut x);
        if let Some(b) = &self.patch_bias {
            ops::add_rows(&mut x, b);
        }
        x.iter_mut().zip(&self.pos).for_each(|(x, p)| *x += p);

        let mut h = vec![0f32; n * d];
        let (mut q, mut kk, mut v) = (vec![0f32; n * d], vec![0f32; n * d], vec![0f32; n * d]);
        let mut att = vec![0f32; n * d];
        let mut up = vec![0f32; n * cfg.n_ff];
        let scale = 1.0 / (cfg.head_dim as f32).sqrt();
        for b in &self.blocks {
            cpu::layer_norm(&x, &b.ln1.w, b.ln1.b.as_deref(), cfg.eps, d, &mut h);
            self.linear(&b.q, &h, n, &mut q);
            self.linear(&b.k, &h, n, &mut kk);
            self.linear(&b.v, &h, n, &mut v);
            ops::attention(&q, &kk, &v, &mut att, n, cfg.n_head, cfg.head_dim, scale, self.be.n_threads());
            self.linear(&b.o, &att, n, &mut h);
            x.iter_mut().zip(&h).for_each(|(x, h)| *x += h);
            cpu::layer_norm(&x, &b.ln2.w, b.ln2.b.as_deref(), cfg.eps, d, &mut h);
            self.linear(&b.up, &h, n, &mut up);
            cpu::gelu(&mut up);
            self.linear(&b.down, &up, n, &mut h);
            x.iter_mut().zip(&h).for_each(|(x, h)| *x += h);
        }
        if let Some(ln) = &self.post_ln {
            cpu::layer_norm(&x, &ln.w, ln.b.as_deref(), cfg.eps, d, &mut h);
            std::mem::swap(&mut x, &mut h);
        }

        let m = cfg.n_merge;
        let n_out = cfg.n_tokens_per_image();
        let mut out = vec![0f32; n_out * cfg.n_embd_out];
        match &self.head {
            Head::Idefics3 { fc } => {
                let shuffled = ops::pixel_shuffle(&x, side, d, m);
                be.matmul(fc, &shuffled, n_out, &mut out);
            }
            Head::Gemma3 { norm, proj } => {
                let pooled = ops::avg_pool(&x, side, d, m);
                let mut normed = vec![0f32; pooled.len()];
                cpu::rms_norm(&pooled, norm, cfg.eps, d, &mut normed);
                be.matmul(proj, &normed, n_out, &mut out);
            }
        }
        Ok(out)
    }

    // The backend's buffers are `Vec<f32>` on the CPU.
    #[allow(clippy::ptr_arg)]
    fn linear(&self, l: &Linear, x: &Vec<f32>, rows: usize, out: &mut Vec<f32>) {
        self.be.matmul(&l.w, x, rows, out);
        if let Some(b) = &l.b {
            ops::add_rows(&mut out[..rows * l.w.rows], b);
        }
    }
}

/// `t` (`[n_out, n_in]` in ggml order, multiplied transposed by llama.cpp) as a weight of
/// `n_out` rows of `n_in`, in its own type's values (F16/F32 copy exactly), loaded from an
/// in-memory GGUF.
fn transposed(be: &CpuBackend, g: &GgufFile, t: &TensorInfo) -> Result<CpuWeight> {
    let (rows, cols) = t.rows_cols(); // rows = n_in (d), cols = n_out
    let ty = match t.ty {
        GgmlType::F32 => GgmlType::F32,
        _ => GgmlType::F16,
    };
    let mut src = vec![0f32; rows * cols];
    quant::dequantize_row(t.ty, g.tensor_data(t), &mut src)?;
    let mut dst = vec![0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            dst[c * rows + r] = src[r * cols + c];
        }
    }
    typed_weight(be, &t.name, ty, cols, rows, &dst)
}

/// `vals` (`rows` rows of `cols`) as a weight of type `ty`, loaded from an in-memory GGUF.
fn typed_weight(
    be: &CpuBackend,
    name: &str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    vals: &[f32],
) -> Result<CpuWeight> {
    let mut data = vec![0u8; ty.row_size(cols)? * rows];
    quant::quantize_row(ty, vals, &mut data)?;
    let mut w = GgufWriter::new();
    w.add_tensor(name.to_string(), ty, &[cols as u64, rows as u64], data)?;
    let file = Arc::new(GgufFile::from_bytes(w.to_bytes())?);
    be.load_weight(&file, &file.tensors[0])
}
