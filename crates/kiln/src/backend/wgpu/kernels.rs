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
const DOT: &str = include_str!("shaders/dot.wgsl");
const EXP: &str = include_str!("shaders/exp.wgsl");
/// Packed 4x8 integer dot: the WGSL builtin (naga emits OpSDot where the device has it, a
/// polyfill elsewhere), or plain shifts on the forced fallback path.
const DOT4_PACKED: &str = "    return dot4I8Packed(a, b);";
const DOT4_PLAIN: &str = "    var s = 0;
    for (var i = 0u; i < 32u; i = i + 8u) {
        s = s + extractBits(bitcast<i32>(a), i, 8u) * extractBits(bitcast<i32>(b), i, 8u);
    }
    return s;";

/// A compute kernel: its source file and entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// A workgroup per weight row (hardware GPUs).
    Matmul(GgmlType),
    /// An invocation per weight row (software adapters).
    MatmulRows(GgmlType),
    /// 32-value block formats on hardware GPUs: an invocation per lane chain, rows staged
    /// in workgroup memory.
    MatmulLanes(GgmlType),
    /// K formats on hardware GPUs: rows staged in workgroup memory, eight invocations per
    /// superblock.
    MatmulKLanes(GgmlType),
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
            MatmulLanes(_) => (include_str!("shaders/matmul_lanes.wgsl"), "main"),
            MatmulKLanes(_) => (include_str!("shaders/matmul_klanes.wgsl"), "main"),
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

/// Whether the lane-staged kernel (matmul_lanes.wgsl) reads `ty`.
pub fn lanes_type(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q8_0)
}

/// Whether the staged K kernel (matmul_klanes.wgsl) reads `ty`.
pub fn klanes_type(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_K | Q5_K | Q6_K)
}

/// dot.wgsl's K sub-block and scale functions of `ty`, rewritten to read the weights from
/// the workgroup copy (`ssub_k`, `skscale`): one source for both memories.
fn shared_subs(ty: GgmlType) -> String {
    use GgmlType::*;
    let (sub, kscale) = match ty {
        Q5_K => ("sub_q5_k", "kscale_q4_k"),
        Q6_K => ("sub_q6_k", "kscale_q6_k"),
        _ => ("sub_q4_k", "kscale_q4_k"),
    };
    let extract = |name: &str| {
        let start = DOT.find(&format!("fn {name}(")).expect("dot.wgsl defines it");
        let end = start + DOT[start..].find("\n}\n").expect("function ends") + 3;
        DOT[start..end].to_string()
    };
    let mut out = String::new();
    for f in ["scale_min_k4_u", sub, kscale] {
        out.push_str(
            &extract(f)
                .replace("wq[", "sw[")
                .replace("wbyte(", "sbyte_at(")
                .replace("wu32(", "s32(")
                .replace("wf16(", "s16(")
                .replace("scale_min_k4_u(j", "s_scale_min_k4_u(j")
                .replace(&format!("fn {f}("), &format!("fn s_{f}(")),
        );
    }
    out.push_str(&format!(
        "fn ssub_k(o: u32, j: u32, xw: u32) -> vec2<i32> {{\n    return s_{sub}(o, j, xw);\n}}\n\
         fn skscale(o: u32) -> vec2<f32> {{\n    return s_{kscale}(o);\n}}\n"
    ));
    out
}

/// matmul_lanes.wgsl's constants: the format, its quants' offset, blocks per stage.
fn lanes_consts(ty: GgmlType) -> String {
    use GgmlType::*;
    let (qtype, qs, cb) = match ty {
        Q4_1 => (1, 4, 32),
        Q5_0 => (5, 6, 32),
        Q8_0 => (8, 2, 16),
        _ => (0, 2, 32),
    };
    format!("const QTYPE: u32 = {qtype}u;\nconst QS: u32 = {qs}u;\nconst CB: u32 = {cb}u;\n")
}

/// The matmul's view of a weight type (dot.wgsl): its class (0: 32-value blocks with lane
/// chains, 1: K superblocks, 2: floats), block bytes, and its unit functions.
fn dot_consts(ty: GgmlType) -> String {
    use GgmlType::*;
    let (class, unit, sub, kscale) = match ty {
        Q4_0 => (0, "unit_q4_0", "sub_q4_k", "kscale_q4_k"),
        Q4_1 => (0, "unit_q4_1", "sub_q4_k", "kscale_q4_k"),
        Q5_0 => (0, "unit_q5_0", "sub_q4_k", "kscale_q4_k"),
        Q8_0 => (0, "unit_q8_0", "sub_q4_k", "kscale_q4_k"),
        Q4_K => (1, "unit_q8_0", "sub_q4_k", "kscale_q4_k"),
        Q5_K => (1, "unit_q8_0", "sub_q5_k", "kscale_q4_k"),
        Q6_K => (1, "unit_q8_0", "sub_q6_k", "kscale_q6_k"),
        _ => (2, "unit_q8_0", "sub_q4_k", "kscale_q4_k"),
    };
    format!(
        "const CLASS: u32 = {class}u;\nconst BB: u32 = {}u;\nconst HAS_MIN: bool = {};\n\
         const WF16: bool = {};\n\
         fn unit_a(o: u32, xw: u32) {{\n    {unit}(o, xw);\n}}\n\
         fn sub_k(o: u32, j: u32, xw: u32) -> vec2<i32> {{\n    return {sub}(o, j, xw);\n}}\n\
         fn kscale(o: u32) -> vec2<f32> {{\n    return {kscale}(o);\n}}\n",
        ty.type_size(),
        ty == Q4_1,
        ty == F16,
    )
}

/// The full WGSL text of a kernel (exposed for the shader-validation test). `subgroups`
/// false is the portable fallback: tree reductions and plain integer dots.
/// `fused_fma`: the driver's fma() rounds once (else it is emulated from exact parts).
pub fn assemble(k: Kernel, subgroups: bool, fused_fma: bool) -> String {
    let (src, _) = k.source();
    let mut s = String::new();
    let fma = if fused_fma { "    return fma(a, b, c);" } else { "    return fma_soft(a, b, c);" };
    s.push_str(
        &COMMON
            .replace("//REDUCE", if subgroups { REDUCE_SUBGROUP } else { REDUCE_TREE })
            .replace("//FMA", fma),
    );
    if let Kernel::Matmul(ty)
    | Kernel::MatmulRows(ty)
    | Kernel::MatmulLanes(ty)
    | Kernel::MatmulKLanes(ty)
    | Kernel::Embed(ty) = k
    {
        s.push_str(DEQUANT);
        s.push_str(&format!(
            "fn load_chunk(b: u32, c: u32) {{\n    wmin = 0.0;\n    {}(b, c);\n}}\n",
            chunk_fn(ty)
        ));
    }
    if let Kernel::Matmul(ty) | Kernel::MatmulRows(ty) | Kernel::MatmulLanes(ty) | Kernel::MatmulKLanes(ty) =
        k
    {
        s.push_str(&DOT.replace("//DOT4", if subgroups { DOT4_PACKED } else { DOT4_PLAIN }));
        s.push_str(&dot_consts(ty));
    }
    if let Kernel::MatmulLanes(ty) = k {
        s.push_str(&lanes_consts(ty));
    }
    if src.contains("exp_acc(") {
        s.push_str(EXP);
    }
    let src = match k {
        Kernel::MatmulKLanes(ty) => src.replace("//SHARED_SUBS", &shared_subs(ty)),
        _ => src.to_string(),
    };
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
                    source: wgpu::ShaderSource::Wgsl(assemble(k, ctx.subgroups, ctx.fused_fma).into()),
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
