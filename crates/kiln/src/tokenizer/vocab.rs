//! The vocabulary as llama.cpp loads it from GGUF metadata: token texts, scores, types,
//! special ids, add_bos/add_eos defaults, the end-of-generation set and the attribute
//! fix-ups llama.cpp applies by token text.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::pretok::{self, PreInfo};
use crate::error::{KilnError, Result};
use crate::gguf::{Array, GgufFile};

/// Token attributes (llama.cpp's `llama_token_attr` bits).
pub(crate) mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

/// A small, fast hash for token texts and id pairs (no DoS concern: keys come from the model).
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap_or([0; 8])));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.add(x);
    }
    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.add(x as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // The product's high bits are the well-mixed ones; hash tables index by the low bits.
        self.0.rotate_left(26)
    }
}

pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// SentencePiece BPE (`llama`).
    Spm,
    /// Byte-level BPE (`gpt2`) or SentencePiece-style BPE (`gemma4`).
    Bpe,
    /// WordPiece (`bert`).
    Wpm,
}

pub(crate) struct Vocab {
    pub kind: Kind,
    pub texts: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u16>,
    pub ids: FxMap<Box<[u8]>, u32>,
    pub max_token_len: usize,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub lowercase: bool,
    pub strip_accents: bool,
    /// End-of-generation ids, sorted.
    pub eog: Vec<u32>,
    /// CONTROL / USER_DEFINED / UNKNOWN tokens, longest text first: the order in which
    /// their texts are cut out of the input.
    pub special: Vec<u32>,
    /// Byte-level BPE only: the pre-tokenizer.
    pub pre: Option<PreInfo>,
}

const KEY: &str = "tokenizer.ggml.";

impl Vocab {
    pub fn id(&self, text: &[u8]) -> Option<u32> {
        self.ids.get(text).copied()
    }

    pub fn load(g: &GgufFile) -> Result<Vocab> {
        let model = g
            .get_str("tokenizer.ggml.model")?
            .ok_or_else(|| KilnError::Metadata("tokenizer.ggml.model is missing".into()))?;
        let pre_name = g.get_str("tokenizer.ggml.pre")?.unwrap_or("").to_string();
        // Defaults per vocabulary type, then per pre-tokenizer, as llama.cpp sets them.
        let (kind, mut bos, mut eos, mut unk, mut sep) = match model {
            "llama" => (Kind::Spm, Some(1), Some(2), Some(0), None),
            "bert" => (Kind::Wpm, Some(101), None, Some(100), Some(102)),
            "gpt2" => (Kind::Bpe, Some(11), Some(11), None, None),
            "gemma4" => (Kind::Bpe, None, None, None, None),
            other => return Err(KilnError::unsupported("tokenizer model (tokenizer.ggml.model)", other)),
        };
        let mut add_bos = matches!(kind, Kind::Spm | Kind::Wpm);
        let mut add_space_prefix = kind == Kind::Spm;
        let pre = if kind == Kind::Bpe {
            let name = if model == "gemma4" { "gemma4" } else { pre_name.as_str() };
            let info = pretok::lookup(name).ok_or_else(|| {
                KilnError::unsupported("pre-tokenizer (tokenizer.ggml.pre)", name.to_string())
            })?;
            add_bos = info.add_bos;
            if info.no_bos {
                bos = None;
            }
            Some(info)
        } else {
            None
        };
        if let Some(v) = g.get_bool("tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = v;
        }

        let tokens = match g.get_array("tokenizer.ggml.tokens")? {
            Some(Array::String(v)) => v,
            Some(a) => {
                return Err(KilnError::Metadata(format!(
                    "tokenizer.ggml.tokens should be an array of strings, found {}",
                    a.elem_name()
                )))
            }
            None => return Err(KilnError::Metadata("tokenizer.ggml.tokens is missing".into())),
        };
        let n = tokens.len();
        let scores = read_scores(g, n)?;
        let types = read_types(g, n)?;

        let mut texts = Vec::with_capacity(n);
        let mut ids: FxMap<Box<[u8]>, u32> = FxMap::default();
        ids.reserve(n);
        let mut max_token_len = 0;
        for (i, t) in tokens.iter().enumerate() {
            let text = if t.is_empty() { format!("[EMPTY_{i}]") } else { t.clone() };
            ids.insert(text.as_bytes().into(), i as u32);
            max_token_len = max_token_len.max(text.len());
            texts.push(text);
        }
        let mut attrs: Vec<u16> = match &types {
            Some(t) => t[..n].iter().map(|&ty| type_to_attr(ty)).collect(),
            None => vec![attr::NORMAL; n],
        };

        // Special ids: a default outside the vocabulary is dropped; a key outside it is ignored.
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let special_key = |name: &str, cur: Option<u32>| -> Result<Option<u32>> {
            Ok(match g.get_u64(&format!("{KEY}{name}"))? {
                Some(v) if (v as usize) < n => Some(v as u32),
                _ => cur,
            })
        };
        bos = special_key("bos_token_id", in_range(bos))?;
        eos = special_key("eos_token_id", in_range(eos))?;
        unk = special_key("unknown_token_id", in_range(unk))?;
        sep = special_key("seperator_token_id", in_range(sep))?;
        let mut eot = special_key("eot_token_id", None)?;
        let mut eom = special_key("eom_token_id", None)?;
        let mut fim_pre = special_key("fim_pre_token_id", None)?;
        let mut fim_suf = special_key("fim_suf_token_id", None)?;
        let mut fim_mid = special_key("fim_mid_token_id", None)?;
        let mut fim_pad = special_key("fim_pad_token_id", None)?;
        let mut fim_rep = special_key("fim_rep_token_id", None)?;
        let mut fim_sep = special_key("fim_sep_token_id", None)?;
        fim_pre = special_key("prefix_token_id", fim_pre)?;
        fim_suf = special_key("suffix_token_id", fim_suf)?;
        fim_mid = special_key("middle_token_id", fim_mid)?;

        let mut add_eos = false;
        if let Some(v) = g.get_bool("tokenizer.ggml.add_bos_token")? {
            add_bos = v;
        }
        if let Some(v) = g.get_bool("tokenizer.ggml.add_eos_token")? {
            add_eos = v;
        }
        if model == "gemma4" || matches!(pre_name.as_str(), "gemma4" | "granite-embed-multi-311m") {
            add_bos = true;
        }
        let lowercase = g.get_bool("tokenizer.ggml.normalizer.lowercase")?.unwrap_or(true);
        let strip_accents = g.get_bool("tokenizer.ggml.normalizer.strip_accents")?.unwrap_or(lowercase);

        // Special tokens found by their text, forced to CONTROL (llama.cpp does the same).
        let find = |slot: &mut Option<u32>, names: &[&str], attrs: &mut [u16]| {
            if slot.is_none() {
                if let Some(id) = (0..n).find(|&i| names.contains(&texts[i].as_str())) {
                    *slot = Some(id as u32);
                    attrs[id] |= attr::CONTROL;
                }
            }
        };
        find(&mut eot, EOT_NAMES, &mut attrs);
        find(&mut eom, &["<|eom_id|>"], &mut attrs);
        find(&mut fim_pre, FIM_PRE_NAMES, &mut attrs);
        find(&mut fim_suf, FIM_SUF_NAMES, &mut attrs);
        find(&mut fim_mid, FIM_MID_NAMES, &mut attrs);
        find(&mut fim_pad, FIM_PAD_NAMES, &mut attrs);
        find(&mut fim_rep, FIM_REP_NAMES, &mut attrs);
        find(&mut fim_sep, &["<|file_sep|>"], &mut attrs);
        let _ = (fim_pre, fim_suf, fim_mid);

        for (a, t) in attrs.iter_mut().zip(&texts) {
            if *a & attr::CONTROL != 0 && t.contains("unused") {
                *a |= attr::UNUSED;
            }
        }

        let mut eog: Vec<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for (i, t) in texts.iter().enumerate() {
            if EOG_NAMES.contains(&t.as_str()) {
                eog.push(i as u32);
                attrs[i] |= attr::CONTROL;
            }
        }
        // gpt-oss: always render these.
        for (i, t) in texts.iter().enumerate() {
            if matches!(t.as_str(), "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>") {
                attrs[i] = attr::USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();
        let has = |eog: &[u32], name: &str| eog.iter().copied().find(|&i| texts[i as usize] == name);
        // o200k_harmony / solar-open: "<|end|>" is not end-of-generation there.
        let end = has(&eog, "<|end|>");
        let call = has(&eog, "<|call|>").or(has(&eog, "<|calls|>"));
        if let (Some(end), Some(_)) = (end, call) {
            if has(&eog, "<|return|>").is_some() || has(&eog, "<|flush|>").is_some() {
                eog.retain(|&i| i != end);
                attrs[end as usize] = attr::USER_DEFINED;
            }
        }
        // gemma4 / plamo: "</s>" is an ordinary token.
        if let Some(s) = has(&eog, "</s>") {
            if has(&eog, "<|tool_response>").is_some() || has(&eog, "<|plamo:eos|>").is_some() {
                eog.retain(|&i| i != s);
                attrs[s as usize] = attr::NORMAL;
            }
        }

        let mut special: Vec<u32> = (0..n as u32)
            .filter(|&i| attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        special.sort_by_key(|&i| std::cmp::Reverse(texts[i as usize].len()));

        // Strip attributes llama.cpp sets by model name.
        let general_name = g.get_str("general.name")?.unwrap_or("").to_lowercase();
        let arch = g.architecture().unwrap_or("");
        let set = |attrs: &mut Vec<u16>, text: &str, bit: u16, on: bool| {
            if let Some(&i) = ids.get(text.as_bytes()) {
                let a = &mut attrs[i as usize];
                *a = if on { *a | bit } else { *a & !bit };
            }
        };
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"].iter().any(|s| pre_name.contains(s))
            || ["nomic-bert-moe", "jina-bert-v3"].iter().any(|s| arch.contains(s))
        {
            set(&mut attrs, "<mask>", attr::LSTRIP, true);
        } else if general_name.contains("phi-3") || general_name.contains("phi3") {
            for &i in &special {
                attrs[i as usize] |= attr::RSTRIP;
            }
            set(&mut attrs, "</s>", attr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(&mut attrs, t, attr::RSTRIP, false);
            }
        } else if general_name.contains("modern-bert") {
            set(&mut attrs, "[MASK]", attr::LSTRIP, true);
        }

        Ok(Vocab {
            kind,
            texts,
            scores,
            attrs,
            ids,
            max_token_len,
            bos,
            eos,
            unk,
            sep,
            add_bos,
            add_eos,
            add_space_prefix,
            lowercase,
            strip_accents,
            eog,
            special,
            pre,
        })
    }
}

fn type_to_attr(ty: i32) -> u16 {
    match ty {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => 0,
    }
}

fn read_scores(g: &GgufFile, n: usize) -> Result<Vec<f32>> {
    let key = "tokenizer.ggml.scores";
    let v: Vec<f32> = match g.get_array(key)? {
        None => return Ok(vec![0.0; n]),
        Some(Array::F32(v)) => v.clone(),
        Some(Array::I32(v)) => v.iter().map(|&x| x as f32).collect(),
        Some(a) => {
            return Err(KilnError::Metadata(format!("{key} should be f32 or i32, found {}", a.elem_name())))
        }
    };
    if v.len() < n {
        return Err(KilnError::Metadata(format!("{key} has {} entries for {n} tokens", v.len())));
    }
    Ok(v[..n].to_vec())
}

fn read_types(g: &GgufFile, n: usize) -> Result<Option<Vec<i32>>> {
    let key = "tokenizer.ggml.token_type";
    match g.get_array(key)? {
        None => Ok(None),
        Some(Array::I32(v)) if v.len() >= n => Ok(Some(v.clone())),
        Some(Array::I32(v)) => {
            Err(KilnError::Metadata(format!("{key} has {} entries for {n} tokens", v.len())))
        }
        Some(a) => Err(KilnError::Metadata(format!("{key} should be i32, found {}", a.elem_name()))),
    }
}

const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE_NAMES: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_NAMES: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_NAMES: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
/// Texts llama.cpp treats as end-of-generation wherever they appear in a vocabulary.
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
