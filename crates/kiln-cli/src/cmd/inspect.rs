//! `kiln inspect`: metadata, tensors, size, and whether kiln supports it all.

use kiln::gguf::{Array, GgufFile, Value};
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
            "metadata": md, "tensors": tensors,
        });
        println!("{out}");
        return Ok(());
    }
    println!("file:         {}", path.display());
    println!("size:         {} bytes", g.file_size());
    println!("gguf version: {}", g.version);
    println!("architecture: {arch}{}", if arch_ok { "" } else { " (unsupported)" });
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
    Ok(())
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
