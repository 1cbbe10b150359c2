//! `kiln inspect`: metadata, tensors, size, parameters (and the experts of a mixture, with
//! the parameters a token uses), and whether kiln supports it all.

use kiln::gguf::{Array, GgufFile, Value};
use kiln::model::ModelConfig;
use serde_json::{json, Map};

#[derive(clap::Args)]
pub struct Args {
    /// A .gguf path, a catalog name or a Hub name (hf://...).
    #[arg(value_name = "MODEL", conflicts_with_all = ["model", "hf_repo"])]
    model_pos: Option<String>,
    #[arg(short = 'm', long)]
    model: Option<String>,
    #[arg(help = super::common::HF_REPO_HELP, long = "hf-repo", value_name = "REPO[:QUANT]", conflicts_with = "model")]
    hf_repo: Option<String>,
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> kiln::Result<()> {
    let spec = a.model_pos.or(a.model).unwrap_or_else(|| kiln::hub::DEFAULT_MODEL.to_string());
    let spec = super::common::model_name(&spec, a.hf_repo.as_deref());
    let path = super::common::resolve(&spec)?;
    let g = GgufFile::open(&path)?;
    let arch = g.architecture().unwrap_or("").to_string();
    let arch_ok = kiln::model::is_supported_architecture(&arch);
    let all_types_ok = g.tensors.iter().all(|t| t.ty.is_supported());
    let cfg = ModelConfig::from_gguf(&g).ok();
    let params = Params::count(&g, cfg.as_ref());
    // A token's K and V bytes in every layer, with both caches of each type.
    let kv: Option<Vec<(&str, usize)>> = cfg.as_ref().map(|cfg| {
        kiln::kv::CACHE_TYPES
            .iter()
            .filter(|(_, t)| kiln::kv::KvTypes { k: *t, v: *t }.check(cfg.head_dim).is_ok())
            .map(|&(name, t)| {
                (name, kiln::kv::KvTypes { k: t, v: t }.bytes_per_token(cfg.n_layer, cfg.kv_dim()))
            })
            .collect()
    });
    if a.json {
        let mut md = Map::new();
        for (k, v) in &g.metadata {
            md.insert(k.clone(), value_json(v));
        }
        let tensors: Vec<_> = g
            .tensors
            .iter()
            .map(|t| {
                json!({"name": t.name, "type": t.ty.name(), "shape": t.dims,
                       "offset": g.tensor_start(t).1, "supported": t.ty.is_supported()})
            })
            .collect();
        let out = json!({
            "file": path.display().to_string(), "size": g.file_size(), "gguf_version": g.version,
            "architecture": arch, "supported": arch_ok && all_types_ok,
            "parameters": params.total, "active_parameters": params.active, "experts": params.experts_json(),
            "metadata": md, "tensors": tensors,
            "kv_bytes_per_token": kv.as_ref().map(|kv| kv.iter().map(|&(n, b)| (n.to_string(), json!(b))).collect::<Map<_, _>>()),
        });
        println!("{out}");
        return Ok(());
    }
    println!("file:         {}", path.display());
    println!("size:         {} bytes", g.file_size());
    println!("gguf version: {}", g.version);
    println!("architecture: {arch}{}", if arch_ok { "" } else { " (unsupported)" });
    println!("parameters:   {}", billions(params.total));
    if let Some(x) = &params.experts {
        let shared = match x.shared {
            Some((n_ff, gated)) => {
                format!(", a shared expert ({n_ff} wide{})", if gated { ", gated" } else { "" })
            }
            None => String::new(),
        };
        println!("experts:      {} per layer, {} used per token{shared}", x.count, x.used);
        println!("active:       {} parameters per token", billions(params.active));
    }
    println!("metadata ({} keys):", g.metadata.len());
    for (k, v) in &g.metadata {
        println!("  {k} = {}", value_text(v));
    }
    println!("tensors ({}):", g.tensors.len());
    for t in &g.tensors {
        let flag = if t.ty.is_supported() { "" } else { "  (unsupported type)" };
        println!("  {:<40} {:<7} {:?} @ {}{flag}", t.name, t.ty.name(), t.dims, g.tensor_start(t).1);
    }
    println!("supported:    {}", arch_ok && all_types_ok);
    if let Some(kv) = kv {
        let list: Vec<String> = kv.iter().map(|(n, b)| format!("{n} {b}")).collect();
        println!("KV cache:     bytes per token: {}", list.join(", "));
    }
    Ok(())
}

/// The experts of a mixture (its first mixture-of-experts layer).
struct Experts {
    count: usize,
    used: usize,
    /// A shared expert's width and whether it has its own gate.
    shared: Option<(usize, bool)>,
}

/// A model's parameter count, and the part of it one token uses (routed experts count `k`
/// of `n_expert`; everything else, embeddings included, in full).
struct Params {
    total: u64,
    active: u64,
    experts: Option<Experts>,
}

impl Params {
    fn count(g: &GgufFile, cfg: Option<&ModelConfig>) -> Params {
        let n = |t: &kiln::gguf::TensorInfo| t.dims.iter().product::<u64>();
        let share = |name: &str| cfg.map_or(1.0, |c| c.active_share(name));
        let moe = cfg.and_then(|c| c.layers.iter().find_map(|l| l.ffn.moe()));
        Params {
            total: g.tensors.iter().map(n).sum(),
            active: g.tensors.iter().map(|t| (n(t) as f64 * share(&t.name)).round() as u64).sum(),
            experts: moe.map(|m| Experts {
                count: m.routing.n_expert,
                used: m.routing.k,
                shared: m.shared.map(|s| (s.n_ff, s.gated)),
            }),
        }
    }

    fn experts_json(&self) -> serde_json::Value {
        match &self.experts {
            Some(x) => json!({"count": x.count, "used": x.used,
                "shared": x.shared.map(|(n_ff, gated)| json!({"n_ff": n_ff, "gated": gated}))}),
            None => json!(null),
        }
    }
}

/// `n` as billions or millions.
fn billions(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2} B", n as f64 / 1e9)
    } else {
        format!("{:.1} M", n as f64 / 1e6)
    }
}

/// Arrays longer than this are shown as their length (the vocabulary, merges, ...).
const MAX_ARRAY_SHOWN: usize = 16;

fn value_json(v: &Value) -> serde_json::Value {
    match v {
        Value::Array(a) => array_json(a),
        Value::String(s) => json!(s),
        Value::Bool(b) => json!(b),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        _ => v.as_i64().map(|x| json!(x)).or_else(|| v.as_u64().map(|x| json!(x))).unwrap_or(json!(null)),
    }
}

fn array_json(a: &Array) -> serde_json::Value {
    if a.len() > MAX_ARRAY_SHOWN {
        return json!(format!("<array[{}] of {}>", a.elem_name(), a.len()));
    }
    match a {
        Array::String(v) => json!(v),
        Array::F32(v) => json!(v),
        Array::F64(v) => json!(v),
        Array::Array(v) => v.iter().map(array_json).collect(),
        _ => json!(a.to_i64_vec().unwrap_or_default()),
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) if s.len() > 80 => {
            format!(
                "{:?}… ({} bytes)",
                &s[..(0..=80).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)],
                s.len()
            )
        }
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) if a.len() > MAX_ARRAY_SHOWN => format!("[{}; {}]", a.elem_name(), a.len()),
        _ => value_json(v).to_string(),
    }
}
