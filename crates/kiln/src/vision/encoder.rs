//! The vision encoder: a ViT (patch embedding, learned position embeddings, pre-norm blocks
//! of LayerNorm, bidirectional multi-head attention and a GELU MLP, a final LayerNorm) and
//! the projector of its family, as llama.cpp's `clip_graph_siglip` builds them, written once
//! against the `Backend` trait: it runs on the engine's device (the CPU, or the GPU's WGSL
//! kernels). Matrices go through the backend's matmul (ggml's activation rounding and dot
//! order on the CPU); LayerNorm with bias, GELU, RMSNorm, the bias and residual adds are the
//! backend ops the text encoders (bert) use, and the attention is `Backend::attention_whole`.
//! The patch embedding's im2col and the projectors' reshuffles (pixel shuffle, average
//! pooling: `vision::ops`) are done on the host: the patches' pixel rows go to the device,
//! the last hidden states come back, and the reshuffled rows go to the projector's matmul.

use std::sync::{Arc, Mutex};

use super::config::{ClipConfig, Projector};
use super::ops;
use super::preprocess::Tile;
use crate::backend::{Backend, LayerNorm};
use crate::error::{KilnError, Result};
use crate::gguf::{GgufFile, GgufWriter, TensorInfo};
use crate::quant::{self, GgmlType};

/// A LayerNorm's weight and optional bias.
struct Norm<W> {
    w: W,
    b: Option<W>,
}

/// A matrix and its optional bias.
struct Linear<W> {
    w: W,
    b: Option<W>,
}

struct Block<W> {
    ln1: Norm<W>,
    /// q, k and v, loaded together (one kernel on the GPU).
    qkv: [Linear<W>; 3],
    o: Linear<W>,
    ln2: Norm<W>,
    up: Linear<W>,
    down: Linear<W>,
}

enum Head<W> {
    /// Pixel shuffle, then `fc` (no bias).
    Idefics3 { fc: W },
    /// Average pooling, RMS norm with `norm`, then `proj` (transposed at load).
    Gemma3 { norm: W, proj: W },
}

/// An mmproj file's vision encoder and projector, ready to encode preprocessed tiles on the
/// backend it was loaded on.
pub struct VisionEncoder {
    cfg: ClipConfig,
    enc: Box<dyn EncodeTile>,
}

/// The encoder on one backend, behind a trait object: the engine picks the backend at run time.
trait EncodeTile: Send + Sync {
    fn encode(&self, cfg: &ClipConfig, tile: &Tile) -> Result<Vec<f32>>;
    fn backend_name(&self) -> String;
}

/// The weights on backend `B`, and the activations of the last tile (kept for the next).
struct Encoder<B: Backend> {
    be: Arc<B>,
    patch: B::Weight,
    patch_bias: Option<B::Weight>,
    /// The position embeddings, one row per patch.
    pos: B::Buf,
    blocks: Vec<Block<B::Weight>>,
    post_ln: Option<Norm<B::Weight>>,
    head: Head<B::Weight>,
    scratch: Mutex<Option<Scratch<B>>>,
}

/// One tile's activations on the device.
struct Scratch<B: Backend> {
    cols: B::Buf,
    x: B::Buf,
    h: B::Buf,
    q: B::Buf,
    k: B::Buf,
    v: B::Buf,
    att: B::Buf,
    up: B::Buf,
    kv: (B::Kv, B::Kv),
    out: B::Buf,
}

fn tensor<'a>(g: &'a GgufFile, name: &str) -> Result<&'a TensorInfo> {
    g.tensor(name)
        .ok_or_else(|| KilnError::Tensor { name: name.into(), msg: "missing from the mmproj file".into() })
}

fn shape_err(t: &TensorInfo, want: &str) -> KilnError {
    KilnError::Tensor { name: t.name.clone(), msg: format!("shape {:?}, expected {want}", t.dims) }
}

impl VisionEncoder {
    /// Reads an mmproj file's encoder onto `be`, which runs every tile's encoding.
    pub fn load<B: Backend>(g: Arc<GgufFile>, be: Arc<B>) -> Result<Self> {
        let cfg = ClipConfig::from_gguf(&g)?;
        be.check_head_dim(cfg.head_dim)?;
        let enc = Encoder::load(&g, &cfg, be)?;
        Ok(VisionEncoder { cfg, enc: Box::new(enc) })
    }

    pub fn config(&self) -> &ClipConfig {
        &self.cfg
    }

    /// The device the encoder runs on (`Backend::name`).
    pub fn backend_name(&self) -> String {
        self.enc.backend_name()
    }

    /// Encodes a blank tile: every pipeline and buffer an image needs is made now instead of
    /// in the first request (the GPU's kernels are compiled on first use).
    pub fn warm_up(&self) -> Result<()> {
        let size = self.cfg.image_size;
        let tile = Tile { width: size, height: size, data: vec![0.0; size * size * 3] };
        self.encode(&tile).map(drop)
    }

    /// The projected embeddings of one preprocessed tile: `n_tokens_per_image` rows of
    /// `n_embd_out`, row-major.
    pub fn encode(&self, tile: &Tile) -> Result<Vec<f32>> {
        let size = self.cfg.image_size;
        if tile.width != size || tile.height != size || tile.data.len() != size * size * 3 {
            return Err(KilnError::invalid(format!(
                "a {}x{} tile for an encoder of {size}x{size} images",
                tile.width, tile.height
            )));
        }
        self.enc.encode(&self.cfg, tile)
    }
}

impl<B: Backend> Encoder<B> {
    fn load(g: &Arc<GgufFile>, cfg: &ClipConfig, be: Arc<B>) -> Result<Self> {
        let (d, ff, ps) = (cfg.n_embd, cfg.n_ff, cfg.patch_size);
        let checked = |name: &str, rows: usize, cols: usize| -> Result<&TensorInfo> {
            let t = tensor(g, name)?;
            if t.rows_cols() != (rows, cols) {
                return Err(shape_err(t, &format!("[{cols}, {rows}]")));
            }
            Ok(t)
        };
        // The encoder's matrices are marked as such (`Backend::encoder_weight`).
        let matrix = |name: &str, rows: usize, cols: usize| {
            be.load_weight(g, checked(name, rows, cols)?).map(|w| be.encoder_weight(w))
        };
        let vector = |name: &str, n: usize| -> Result<B::Weight> {
            let t = tensor(g, name)?;
            if t.n_elements() != n as u64 {
                return Err(shape_err(t, &format!("{n} values")));
            }
            let mut t = t.clone();
            t.dims = vec![n as u64];
            be.load_weight(g, &t)
        };
        let opt_vector = |name: &str, n: usize| g.tensor(name).map(|_| vector(name, n)).transpose();
        let linear = |name: &str, rows: usize, cols: usize| -> Result<Linear<B::Weight>> {
            Ok(Linear {
                w: matrix(&format!("{name}.weight"), rows, cols)?,
                b: opt_vector(&format!("{name}.bias"), rows)?,
            })
        };
        let norm = |name: &str| -> Result<Norm<B::Weight>> {
            Ok(Norm { w: vector(&format!("{name}.weight"), d)?, b: opt_vector(&format!("{name}.bias"), d)? })
        };
        let n_pos = cfg.n_patches_side().pow(2);
        let patch_t = tensor(g, "v.patch_embd.weight")?;
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
        let patch = be.encoder_weight(match patch_t.ty {
            GgmlType::F16 => be.load_weight(g, &patch_t)?,
            ty => {
                let mut vals = vec![0f32; 3 * ps * ps * d];
                quant::dequantize_row(ty, g.tensor_data(&patch_t), &mut vals)?;
                let as_ty = if ty == GgmlType::BF16 { GgmlType::F32 } else { GgmlType::F16 };
                typed_weight(&*be, &patch_t.name, as_ty, d, 3 * ps * ps, &vals)?
            }
        });
        let patch_bias = opt_vector("v.patch_embd.bias", d)?;
        let pos_t = tensor(g, "v.position_embd.weight")?;
        if pos_t.n_elements() != (d * n_pos) as u64 {
            return Err(shape_err(pos_t, &format!("{} values", d * n_pos)));
        }
        let mut pos_v = vec![0f32; d * n_pos];
        quant::dequantize_row(pos_t.ty, g.tensor_data(pos_t), &mut pos_v)?;
        let mut pos = be.alloc(d * n_pos)?;
        be.write_rows(&mut pos, &pos_v);
        let mut blocks = Vec::with_capacity(cfg.n_layer);
        for il in 0..cfg.n_layer {
            let n = |s: &str| format!("v.blk.{il}.{s}");
            // Some converters wrote ffn_up and ffn_down under each other's names (llama.cpp
            // swaps them back the same way: by the shapes).
            let swapped = g.tensor(&n("ffn_down.weight")).is_some_and(|t| t.rows_cols().1 == d && ff != d);
            let (up, down) = if swapped { ("ffn_down", "ffn_up") } else { ("ffn_up", "ffn_down") };
            let names = ["attn_q", "attn_k", "attn_v"];
            let ts = names.map(|s| checked(&n(&format!("{s}.weight")), d, d));
            let [tq, tk, tv] = ts;
            let ts = [tq?, tk?, tv?];
            let [wq, wk, wv]: [B::Weight; 3] = be
                .load_weights(g, &ts)?
                .into_iter()
                .map(|w| be.encoder_weight(w))
                .collect::<Vec<_>>()
                .try_into()
                .map_err(|_| KilnError::Backend("load_weights returned another count".into()))?;
            let bias = |s: &str| opt_vector(&n(&format!("{s}.bias")), d);
            let qkv = [
                Linear { w: wq, b: bias(names[0])? },
                Linear { w: wk, b: bias(names[1])? },
                Linear { w: wv, b: bias(names[2])? },
            ];
            blocks.push(Block {
                ln1: norm(&n("ln1"))?,
                qkv,
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
                let t = checked("mm.input_projection.weight", d, cfg.n_embd_out)?;
                Head::Gemma3 {
                    norm: vector("mm.soft_emb_norm.weight", d)?,
                    proj: be.encoder_weight(transposed(&*be, g, t)?),
                }
            }
        };
        Ok(Encoder { be, patch, patch_bias, pos, blocks, post_ln, head, scratch: Mutex::new(None) })
    }

    fn scratch(&self, cfg: &ClipConfig) -> Result<Scratch<B>> {
        let be = &*self.be;
        let n = cfg.n_patches_side().pow(2);
        let (d, k) = (cfg.n_embd, 3 * cfg.patch_size * cfg.patch_size);
        Ok(Scratch {
            cols: be.alloc(n * k)?,
            x: be.alloc(n * d)?,
            h: be.alloc(n * d)?,
            q: be.alloc(n * d)?,
            k: be.alloc(n * d)?,
            v: be.alloc(n * d)?,
            att: be.alloc(n * d)?,
            up: be.alloc(n * cfg.n_ff)?,
            kv: (be.alloc_kv(n * d)?, be.alloc_kv(n * d)?),
            out: be.alloc(cfg.n_tokens_per_image() * cfg.n_embd_out)?,
        })
    }

    fn linear(&self, l: &Linear<B::Weight>, x: &B::Buf, rows: usize, out: &mut B::Buf) {
        self.be.matmul(&l.w, x, rows, out);
        if let Some(b) = &l.b {
            self.be.add_bias(out, b, rows);
        }
    }

    fn layer_norm(&self, norm: &Norm<B::Weight>, eps: f32, x: &B::Buf, rows: usize, out: &mut B::Buf) {
        self.be.layer_norm(x, LayerNorm { eps, w: &norm.w, b: norm.b.as_ref() }, rows, out);
    }
}

impl<B: Backend> EncodeTile for Encoder<B> {
    fn backend_name(&self) -> String {
        self.be.name()
    }

    fn encode(&self, cfg: &ClipConfig, tile: &Tile) -> Result<Vec<f32>> {
        let size = cfg.image_size;
        let (d, ps, side) = (cfg.n_embd, cfg.patch_size, cfg.n_patches_side());
        let n = side * side;
        let be = &*self.be;
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            *guard = Some(self.scratch(cfg)?);
        }
        let s = guard.as_mut().expect("made above");

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
        be.write_rows(&mut s.cols, &cols);
        be.matmul(&self.patch, &s.cols, n, &mut s.x);
        if let Some(b) = &self.patch_bias {
            be.add_bias(&mut s.x, b, n);
        }
        be.add(&mut s.x, &self.pos, 1.0, n * d);

        let scale = 1.0 / (cfg.head_dim as f32).sqrt();
        let heads = (cfg.n_head, cfg.head_dim);
        for b in &self.blocks {
            self.layer_norm(&b.ln1, cfg.eps, &s.x, n, &mut s.h);
            let ws = b.qkv.each_ref().map(|l| &l.w);
            let biases = b.qkv.each_ref().map(|l| l.b.as_ref());
            be.matmul_many(&ws, &biases, &s.h, n, &mut [&mut s.q, &mut s.k, &mut s.v]);
            be.attention_whole(&s.q, &s.k, &s.v, (&mut s.kv.0, &mut s.kv.1), n, heads, scale, &mut s.att);
            self.linear(&b.o, &s.att, n, &mut s.h);
            be.add(&mut s.x, &s.h, 1.0, n * d);
            self.layer_norm(&b.ln2, cfg.eps, &s.x, n, &mut s.h);
            self.linear(&b.up, &s.h, n, &mut s.up);
            be.gelu(&mut s.up, n * cfg.n_ff);
            self.linear(&b.down, &s.up, n, &mut s.h);
            be.add(&mut s.x, &s.h, 1.0, n * d);
        }
        if let Some(ln) = &self.post_ln {
            self.layer_norm(ln, cfg.eps, &s.x, n, &mut s.h);
            std::mem::swap(&mut s.x, &mut s.h);
        }

        let mut x = vec![0f32; n * d];
        be.read(&s.x, &mut x);
        let m = cfg.n_merge;
        let n_out = cfg.n_tokens_per_image();
        match &self.head {
            Head::Idefics3 { fc } => {
                be.write_rows(&mut s.h, &ops::pixel_shuffle(&x, side, d, m));
                be.matmul(fc, &s.h, n_out, &mut s.out);
            }
            Head::Gemma3 { norm, proj } => {
                be.write_rows(&mut s.h, &ops::avg_pool(&x, side, d, m));
                be.rms_norm(&s.h, norm, cfg.eps, n_out, d, &mut s.att);
                be.matmul(proj, &s.att, n_out, &mut s.out);
            }
        }
        let mut out = vec![0f32; n_out * cfg.n_embd_out];
        be.read(&s.out, &mut out);
        Ok(out)
    }
}

/// `t` (`[n_out, n_in]` in ggml order, multiplied transposed by llama.cpp) as a weight of
/// `n_out` rows of `n_in`, in its own type's values (F16/F32 copy exactly), loaded from an
/// in-memory GGUF.
fn transposed<B: Backend>(be: &B, g: &GgufFile, t: &TensorInfo) -> Result<B::Weight> {
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
fn typed_weight<B: Backend>(
    be: &B,
    name: &str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    vals: &[f32],
) -> Result<B::Weight> {
    let mut data = vec![0u8; ty.row_size(cols)? * rows];
    quant::quantize_row(ty, vals, &mut data)?;
    let mut w = GgufWriter::new();
    w.add_tensor(name.to_string(), ty, &[cols as u64, rows as u64], data)?;
    let file = Arc::new(GgufFile::from_bytes(w.to_bytes())?);
    be.load_weight(&file, &file.tensors[0])
}
