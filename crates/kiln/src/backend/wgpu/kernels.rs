//! WGSL sources assembled per kernel and weight type, compiled once into pipelines.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ::wgpu;

use super::context::Context;
use crate::quant::GgmlType;

const COMMON: &str = include_str!("shaders/common.wgsl");
const REDUCE_TREE: &str = include_str!("shaders/reduce_tree.wgsl");
const REDUCE_SUBGROUP: &str = include_str!("shaders/reduce_subgroup.wgsl");
const DEQUANT: &str = include_str!("shaders/dequant.wgsl");

/// A compute kernel: its source file and entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// A workgroup per weight row (hardware GPUs).
    Matmul(GgmlType),
    /// An invocation per weight row (software adapters).
    MatmulRows(GgmlType),
    Embed(GgmlType),
    Quantize,
    RmsNorm,
    Rope,
    KvStore,
    KvShift,
    Attention,
    Glu,
    Add,
    AddBias,
    Scale,
    Gather,
}

impl Kernel {
    fn source(self) -> (&'static str, &'static str) {
        use Kernel::*;
        let ew = include_str!("shaders/elementwise.wgsl");
        match self {
            Matmul(_) => (include_str!("shaders/matmul.wgsl"), "main"),
            MatmulRows(_) => (include_str!("shaders/matmul_rows.wgsl"), "main"),
            Embed(_) => (include_str!("shaders/embed.wgsl"), "main"),
            Quantize => (include_str!("shaders/quantize.wgsl"), "main"),
            RmsNorm => (include_str!("shaders/rms_norm.wgsl"), "main"),
            Rope => (include_str!("shaders/rope.wgsl"), "main"),
            KvStore => (include_str!("shaders/kv_store.wgsl"), "main"),
            KvShift => (include_str!("shaders/kv_shift.wgsl"), "main"),
            Attention => (include_str!("shaders/attention.wgsl"), "main"),
            Glu => (ew, "glu"),
            Add => (ew, "add"),
            AddBias => (ew, "add_bias"),
            Scale => (ew, "scale"),
            Gather => (ew, "gather"),
        }
    }
}

/// Weight types the GPU kernels read directly; others are widened to F16 at upload.
pub fn gpu_weight_type(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F32 | F16 | Q4_0 | Q4_1 | Q5_0 | Q8_0 | Q4_K | Q5_K | Q6_K)
}

fn chunk_fn(ty: GgmlType) -> &'static str {
    use GgmlType::*;
    match ty {
        F32 => "chunk_f32",
        F16 => "chunk_f16",
        Q4_0 => "chunk_q4_0",
        Q4_1 => "chunk_q4_1",
        Q5_0 => "chunk_q5_0",
        Q8_0 => "chunk_q8_0",
        Q4_K => "chunk_q4_k",
        Q5_K => "chunk_q5_k",
        _ => "chunk_q6_k",
    }
}

/// The full WGSL text of a kernel (exposed for the shader-validation test).
pub fn assemble(k: Kernel, subgroups: bool) -> String {
    let (src, _) = k.source();
    let mut s = String::new();
    s.push_str(&COMMON.replace("//REDUCE", if subgroups { REDUCE_SUBGROUP } else { REDUCE_TREE }));
    if let Kernel::Matmul(ty) | Kernel::MatmulRows(ty) | Kernel::Embed(ty) = k {
        s.push_str(DEQUANT);
        s.push_str(&format!(
            "fn load_chunk(b: u32, c: u32) {{\n    wmin = 0.0;\n    {}(b, c);\n}}\n",
            chunk_fn(ty)
        ));
    }
    let body = if subgroups {
        src.replace("/*SG*/", ", @builtin(subgroup_invocation_id) sgi: u32")
            .replace("/*SGI*/", "g_sgi = sgi;")
    } else {
        src.to_string()
    };
    s.push_str(&body);
    s
}

/// Pipelines built on first use and kept for the backend's life.
#[derive(Default)]
pub struct Pipelines {
    cache: Mutex<HashMap<Kernel, Arc<wgpu::ComputePipeline>>>,
}

impl Pipelines {
    pub fn get(&self, ctx: &Context, k: Kernel) -> Arc<wgpu::ComputePipeline> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(k)
            .or_insert_with(|| {
                let label = format!("{k:?}");
                let module = ctx.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(&label),
                    source: wgpu::ShaderSource::Wgsl(assemble(k, ctx.subgroups).into()),
                });
                Arc::new(ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&label),
                    layout: None,
                    module: &module,
                    entry_point: Some(k.source().1),
                    compilation_options: Default::default(),
                    cache: None,
                }))
            })
            .clone()
    }
}
