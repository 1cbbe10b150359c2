//! Synthetic models whose layers are not llama's: BERT-family encoders (with a WordPiece
//! vocabulary, and optionally a reranker's classification head) and LFM2's hybrid of
//! short convolutions and attention (with experts past the leading dense layers:
//! lfm2moe).

use super::{Rng, SynthSpec};
use crate::error::Result;
use crate::gguf::{Array, GgufWriter, Value};
use crate::quant::GgmlType;

/// Which tensors a synthetic model's layers have.
#[derive(Clone, Debug, PartialEq)]
pub enum Layout {
    /// llama's (and its variants': biases, q/k norms, post-norms).
    Decoder,
    /// A BERT-family encoder.
    Encoder(EncoderSpec),
    /// LFM2: a short convolution of `l_cache` taps in every layer but `attn_layers`.
    Lfm2 { l_cache: usize, attn_layers: Vec<usize> },
}

/// What sets a BERT-family encoder apart.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderSpec {
    /// Learned absolute positions (`position_embd`: bert).
    pub positions: bool,
    pub ffn: EncoderFfn,
    /// One `attn_qkv` instead of `attn_q/k/v` (nomic-bert).
    pub fused_qkv: bool,
    /// Biases on every projection (bert, jina-bert-v2; nomic-bert has none).
    pub biases: bool,
    /// llama.cpp's `pooling_type` (1 mean, 2 cls, 4 rank).
    pub pooling: u32,
    /// A reranker's head: `cls` (`[n_embd, n_embd]`) and `cls.output` (`[n_embd, 1]`).
    pub classifier: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderFfn {
    /// `down · gelu(up · x)` (bert).
    Gelu,
    /// SiLU-gated with `ffn_gate` (nomic-bert).
    SwiGlu,
    /// GELU-gated, the gate fused into `ffn_up` as its first half (jina-bert-v2).
    Geglu,
}

/// WordPiece's special tokens where BERT's vocabulary has them.
const UNK: u32 = 100;
const CLS: u32 = 101;
const SEP: u32 = 102;
const MASK: u32 = 103;

impl SynthSpec {
    /// An encoder's vocabulary, metadata and tensors.
    pub(super) fn encoder(&self, w: &mut GgufWriter, rng: &mut Rng, e: &EncoderSpec) -> Result<()> {
        let a = |k: &str| format!("{}.{k}", self.arch);
        w.set(a("attention.layer_norm_epsilon"), Value::F32(1e-12));
        w.set(a("attention.causal"), Value::Bool(false));
        w.set(a("pooling_type"), Value::U32(e.pooling));
        self.wordpiece(w);
        let head_dim = self.head_dim.unwrap_or(self.n_embd / self.n_head);
        let (d, q, kv, ff) = (self.n_embd, self.n_head * head_dim, self.n_head_kv * head_dim, self.n_ff);
        let ty = self.matrix_type;
        self.matrix(w, rng, "token_embd.weight", d, self.n_vocab, self.embd_type, 1.0)?;
        self.matrix(w, rng, "token_types.weight", d, 2, GgmlType::F32, 1.0)?;
        if e.positions {
            self.matrix(w, rng, "position_embd.weight", d, self.n_ctx_train, self.embd_type, 1.0)?;
        }
        self.layer_norm(w, rng, "token_embd_norm", d)?;
        let bias = |w: &mut GgufWriter, rng: &mut Rng, name: &str, n: usize| -> Result<()> {
            if e.biases {
                self.vector(w, rng, name, n, 0.0, 0.2)?;
            }
            Ok(())
        };
        for il in 0..self.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            if e.fused_qkv {
                self.matrix(w, rng, &n("attn_qkv.weight"), d, q + 2 * kv, ty, 1.0)?;
                bias(w, rng, &n("attn_qkv.bias"), q + 2 * kv)?;
            } else {
                for (t, rows) in [("q", q), ("k", kv), ("v", kv)] {
                    self.matrix(w, rng, &n(&format!("attn_{t}.weight")), d, rows, ty, 1.0)?;
                    bias(w, rng, &n(&format!("attn_{t}.bias")), rows)?;
                }
            }
            self.matrix(w, rng, &n("attn_output.weight"), q, d, ty, 1.0)?;
            bias(w, rng, &n("attn_output.bias"), d)?;
            self.layer_norm(w, rng, &n("attn_output_norm"), d)?;
            let up = if e.ffn == EncoderFfn::Geglu { 2 * ff } else { ff };
            self.matrix(w, rng, &n("ffn_up.weight"), d, up, ty, 1.0)?;
            bias(w, rng, &n("ffn_up.bias"), up)?;
            if e.ffn == EncoderFfn::SwiGlu {
                self.matrix(w, rng, &n("ffn_gate.weight"), d, ff, ty, 1.0)?;
            }
            self.matrix(w, rng, &n("ffn_down.weight"), ff, d, ty, 1.0)?;
            bias(w, rng, &n("ffn_down.bias"), d)?;
            self.layer_norm(w, rng, &n("layer_output_norm"), d)?;
        }
        if e.classifier {
            self.matrix(w, rng, "cls.weight", d, d, ty, 1.0)?;
            self.vector(w, rng, "cls.bias", d, 0.0, 0.2)?;
            self.matrix(w, rng, "cls.output.weight", d, 1, ty, 1.0)?;
            self.vector(w, rng, "cls.output.bias", 1, 0.0, 0.2)?;
        }
        Ok(())
    }

    /// LFM2's metadata and tensors (the vocabulary is the byte-level one).
    pub(super) fn lfm2(
        &self,
        w: &mut GgufWriter,
        rng: &mut Rng,
        l_cache: usize,
        attn: &[usize],
    ) -> Result<()> {
        let a = |k: &str| format!("{}.{k}", self.arch);
        w.set(a("shortconv.l_cache"), Value::U32(l_cache as u32));
        let kv_heads: Vec<u32> =
            (0..self.n_layer).map(|il| if attn.contains(&il) { self.n_head_kv as u32 } else { 0 }).collect();
        w.set(a("attention.head_count_kv"), Value::Array(Array::U32(kv_heads)));
        let head_dim = self.head_dim.unwrap_or(self.n_embd / self.n_head);
        let (d, q, kv, ff) = (self.n_embd, self.n_head * head_dim, self.n_head_kv * head_dim, self.n_ff);
        let ty = self.matrix_type;
        self.embeddings(w, rng, "token_embd_norm")?;
        for il in 0..self.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            self.vector(w, rng, &n("attn_norm.weight"), d, 1.0, 0.1)?;
            if attn.contains(&il) {
                self.matrix(w, rng, &n("attn_q.weight"), d, q, ty, 1.0)?;
                self.matrix(w, rng, &n("attn_k.weight"), d, kv, ty, 1.0)?;
                self.matrix(w, rng, &n("attn_v.weight"), d, kv, ty, 1.0)?;
                self.vector(w, rng, &n("attn_q_norm.weight"), head_dim, 1.0, 0.1)?;
                self.vector(w, rng, &n("attn_k_norm.weight"), head_dim, 1.0, 0.1)?;
                self.matrix(w, rng, &n("attn_output.weight"), q, d, ty, 1.0)?;
            } else {
                self.matrix(w, rng, &n("shortconv.conv.weight"), l_cache, d, GgmlType::F32, 1.0)?;
                self.matrix(w, rng, &n("shortconv.in_proj.weight"), d, 3 * d, ty, 1.0)?;
                self.matrix(w, rng, &n("shortconv.out_proj.weight"), d, d, ty, 1.0)?;
            }
            self.vector(w, rng, &n("ffn_norm.weight"), d, 1.0, 0.1)?;
            match &self.experts {
                Some(x) if il >= x.leading_dense => self.experts(w, rng, il, x)?,
                _ => {
                    self.matrix(w, rng, &n("ffn_gate.weight"), d, ff, ty, 1.0)?;
                    self.matrix(w, rng, &n("ffn_up.weight"), d, ff, ty, 1.0)?;
                    self.matrix(w, rng, &n("ffn_down.weight"), ff, d, ty, 1.0)?;
                }
            }
        }
        Ok(())
    }

    /// A LayerNorm's weight (about 1) and bias (about 0).
    fn layer_norm(&self, w: &mut GgufWriter, rng: &mut Rng, name: &str, n: usize) -> Result<()> {
        self.vector(w, rng, &format!("{name}.weight"), n, 1.0, 0.1)?;
        self.vector(w, rng, &format!("{name}.bias"), n, 0.0, 0.1)
    }

    /// A WordPiece vocabulary as llama.cpp's converter writes BERT's: `[PAD]`, unused
    /// tokens, `[UNK]` 100, `[CLS]` 101, `[SEP]` 102, `[MASK]` 103; then each printable
    /// ASCII character (lowercase: the tokenizer lowercases) as a word start (`▁c`) and as
    /// a continuation (`c`), some whole words, and fillers up to `n_vocab`.
    fn wordpiece(&self, w: &mut GgufWriter) {
        let mut tokens: Vec<String> =
            (0..UNK).map(|i| if i == 0 { "[PAD]".into() } else { format!("[unused{i}]") }).collect();
        tokens.extend(["[UNK]", "[CLS]", "[SEP]", "[MASK]"].map(String::from));
        let chars = (b'!'..=b'~').filter(|c| !c.is_ascii_uppercase()).map(char::from);
        for c in chars.clone() {
            tokens.push(format!("\u{2581}{c}"));
        }
        tokens.extend(chars.map(String::from));
        let words = [
            "the",
            "quick",
            "brown",
            "fox",
            "jumps",
            "over",
            "lazy",
            "dog",
            "what",
            "is",
            "search",
            "query",
            "document",
            "kiln",
            "model",
            "embedding",
            "rank",
            "text",
            "and",
            "of",
            "in",
            "to",
        ];
        tokens.extend(words.iter().map(|t| format!("\u{2581}{t}")));
        tokens.extend(["ing", "ed", "ly", "er"].map(String::from));
        while tokens.len() < self.n_vocab {
            tokens.push(format!("[filler{}]", tokens.len()));
        }
        tokens.truncate(self.n_vocab);
        let types: Vec<i32> = (0..tokens.len() as u32)
            .map(|i| if (UNK..=MASK).contains(&i) || i == 0 { 3 } else { 1 })
            .collect();
        w.set("tokenizer.ggml.model", Value::String("bert".into()));
        w.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
        w.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
        w.set("tokenizer.ggml.token_type_count", Value::U32(2));
        w.set("tokenizer.ggml.bos_token_id", Value::U32(CLS));
        w.set("tokenizer.ggml.eos_token_id", Value::U32(SEP));
        w.set("tokenizer.ggml.seperator_token_id", Value::U32(SEP));
        w.set("tokenizer.ggml.unknown_token_id", Value::U32(UNK));
        w.set("tokenizer.ggml.padding_token_id", Value::U32(0));
    }
}
