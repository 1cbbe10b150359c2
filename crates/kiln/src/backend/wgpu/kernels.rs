//! WGSL sources assembled per kernel and weight type, compiled once into pipelines.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ::wgpu;

use super::context::Context;
use super::coop::CoopShape;
use super::coop_attn::AttnShape;
use crate::quant::GgmlType;

const COMMON: &str = include_str!("shaders/common.wgsl");
const REDUCE_TREE: &str = include_str!("shaders/reduce_tree.wgsl");
const REDUCE_SUBGROUP: &str = include_str!("shaders/reduce_subgroup.wgsl");
const DEQUANT: &str = include_str!("shaders/dequant.wgsl");
const DOT: &str = include_str!("shaders/dot.wgsl");
const DOT_VEC: &str = include_str!("shaders/dot_vec.wgsl");
const EXP: &str = include_str!("shaders/exp.wgsl");
const GLU: &str = include_str!("shaders/glu.wgsl");
const ROPE_CORE: &str = include_str!("shaders/rope_core.wgsl");
const ROPE_ROT: &str = include_str!("shaders/rope_rot.wgsl");
const QUANTIZE_CORE: &str = include_str!("shaders/quantize_core.wgsl");
const NORM_QUANTIZE: &str = include_str!("shaders/norm_quantize.wgsl");
const ATTN_QUANTIZE: &str = include_str!("shaders/attn_quantize.wgsl");
const ATTN_BLOCK_QUANTIZE: &str = include_str!("shaders/attn_block_quantize.wgsl");
const ROPE_EPILOGUE: &str = include_str!("shaders/rope_epilogue.wgsl");
const FF_SUM: &str = include_str!("shaders/ff_sum.wgsl");
const RMS_APPLY: &str = include_str!("shaders/rms_apply.wgsl");
const MATMUL_PROLOGUE: &str = include_str!("shaders/matmul_prologue.wgsl");
const ALIBI: &str = include_str!("shaders/alibi.wgsl");
const EXPERT_SLOTS: &str = include_str!("shaders/expert_slots.wgsl");
const KV_BLOCKS: &str = include_str!("shaders/kv_blocks.wgsl");
const ATTENTION_KV: &str = include_str!("shaders/attention_kv.wgsl");
const HADAMARD: &str = include_str!("shaders/hadamard.wgsl");
const KV_QUANT: &str = include_str!("shaders/kv_quant.wgsl");
/// IQ4_NL's table of values (ggml's `kvalues_iq4nl`), for the KV cache kernels.
const IQ4NL_TABLE: &str =
    "var<private> kv_iq4nl: array<i32, 16> = array<i32, 16>(-127, -104, -83, -65, -49, -35, \
                           -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);\n";
const MATMUL_ID_VEC: &str = include_str!("shaders/matmul_id_vec.wgsl");
const MATMUL_ID_COOP: &str = include_str!("shaders/matmul_id_coop.wgsl");
const ROUTE: &str = include_str!("shaders/route.wgsl");
const LAST_DONE: &str = include_str!("shaders/last_done.wgsl");
const NORM_ROPE_TAIL: &str = include_str!("shaders/norm_rope_tail.wgsl");
/// The router matmul's route tail (kernels.rs `Outs::route`): route.wgsl's accessors (its
/// parameters after the matmul's, the logits the matmul's output, read atomically as
/// stored; no selection bias: a biased router is not fused), the ids, weights and the
/// workgroups' counts (last_done.wgsl) bound at RI, RI + 1, RI + 2. The last workgroup to
/// finish acquires all the logits and routes the tokens of its grid z (TT). Needs a
/// workgroup of MAX_EXPERTS invocations.
const ROUTE_TAIL: &str = "@group(0) @binding(RI) var<storage, read_write> r_ids: array<f32>;
@group(0) @binding(RJ) var<storage, read_write> r_w: array<f32>;

fn route_prm(j: u32) -> u32 {
    return prm[11u + j];
}

fn route_logit(i: u32) -> f32 {
    return bitcast<f32>(atomicLoad(&ys[i]));
}

fn route_bias(i: u32) -> f32 {
    return 0.0;
}

fn route_out(o: u32, id: f32, w: f32) {
    r_ids[o] = id;
    r_w[o] = w;
}

fn matmul_tail(wid: vec3<u32>, nwg: vec3<u32>, li: u32, t0: u32, tt: u32) {
    if !last_done(wid.z, nwg.x * nwg.y, li) {
        return;
    }
    for (var j = 0u; j < tt; j = j + 1u) {
        route_token(t0 + j, li);
    }
}
";
/// The weighted-sum tail of a mixture of experts' down projection (one output, a workgroup
/// per slot and block of rows): each workgroup counts itself done in its (token, block)
/// counter (last_done.wgsl) after storing its rows (ys atomic), and the last of the
/// token's `k` slots (prm[10]) sums the block's rows over them by the routing weights (at
/// SW) into the sum's output (at SO), as moe.wgsl's `sum`: each product rounded, added in
/// slot order.
const SUM_TAIL: &str = "@group(0) @binding(SW) var<storage, read> s_w: array<f32>;
@group(0) @binding(SO) var<storage, read_write> s_out: array<f32>;

fn slot_value(s: u32, r: u32) -> f32 {
    return nc(bitcast<f32>(atomicLoad(&ys[s * prm[4] + r])) * s_w[s]);
}

fn matmul_tail(wid: vec3<u32>, nwg: vec3<u32>, li: u32, t0: u32, tt: u32) {
    let k = prm[10];
    let t = t0 / k;
    let b = wid.y * nwg.x + wid.x;
    if !last_done(t * nwg.x * nwg.y + b, k, li) {
        return;
    }
    let s0 = t * k;
    for (var i = li; i < RG * RR; i = i + RG * NPR) {
        let r = b * RG * RR + i;
        if r < prm[0] {
            var o = slot_value(s0, r);
            for (var j = 1u; j < k; j = j + 1u) {
                o = o + slot_value(s0 + j, r);
            }
            s_out[t * prm[4] + r] = o;
        }
    }
}
";
/// What an expert matmul on the vec path does as its last workgroups finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IdTail {
    Off,
    /// (A down projection: one output, each token's slots in the dispatch.) The weighted
    /// sum of a token's slots (SUM_TAIL).
    Sum,
    /// (A gate and up: two outputs of rows in whole blocks of 256.) The GLU of each block
    /// and its quantize for the down projection (GLU_TAIL).
    Glu,
}

/// The GLU tail of a mixture of experts' gate and up projection (two outputs, their rows
/// in blocks of 256, a workgroup per slot and RG * RR rows of one of them): each
/// workgroup counts itself done in its (slot, block) counter (last_done.wgsl) after
/// storing its rows (ys, ys1 atomic), and the last of the block's gate and up workgroups
/// makes the block's GLU (glu.wgsl, over the whole GLU's n_slots * prm[4] values, as the
/// GLU kernel) into GO and quantizes it for the down projection (quantize_core.wgsl; the
/// mode prm[15], the activation prm[16]) into GQ (quantize_core.wgsl's `xq` renamed: the
/// matmul reads its own activations as `xq`): the GLU kernel's work and bits, one
/// dispatch fewer.
const GLU_TAIL: &str = "@group(0) @binding(GO) var<storage, read_write> g_out: array<f32>;
@group(0) @binding(GQ) var<storage, read_write> gq: array<u32>;

fn matmul_tail(wid: vec3<u32>, nwg: vec3<u32>, li: u32, t0: u32, tt: u32) {
    let dim = prm[4];
    let blk = (wid.y * nwg.x + wid.x) * RG * RR % dim / 256u;
    if !last_done(t0 * (dim / 256u) + blk, 512u / (RG * RR), li) {
        return;
    }
    let w = min(li, 63u);
    let o = t0 * dim + 256u * blk + 4u * w;
    var v: vec4<f32>;
    for (var i = 0u; i < 4u; i = i + 1u) {
        let g = bitcast<f32>(atomicLoad(&ys[o + i]));
        let u = bitcast<f32>(atomicLoad(&ys1[o + i]));
        v[i] = glu_value(g, u, o + i, prm[2] * dim, prm[16]);
    }
    if li < 64u {
        for (var i = 0u; i < 4u; i = i + 1u) {
            g_out[o + i] = v[i];
        }
    }
    quantize_word(o / 4u, v, li < 64u, li, prm[15], prm[2], dim);
}
";
/// The route tail's parameter words after the matmul's 11 (route.wgsl's route_prm).
pub const ROUTE_WORDS: usize = 6;
/// The norm and RoPE tail's parameter words after the matmul's 11 (norm_rope_tail.wgsl).
pub const NORM_ROPE_WORDS: usize = 11;
/// The expert matmuls' parameter words (expert_slots.wgsl).
pub const EXPERT_WORDS: usize = 15;
/// The dense vec matmul's rows and tokens (matmul_vec.wgsl): TT tokens per workgroup of
/// the grid's z, the weight's rows from prm[8].
const VEC_DENSE: &str = "fn first_token(z: u32) -> u32 {
    return z * TT;
}

fn first_row(t: u32) -> u32 {
    return prm[8];
}

fn x_row(t: u32) -> u32 {
    return t;
}

fn in_row(t: u32) -> u32 {
    return t;
}
";
/// Four f16 values from two u32 words, as the tile kernels stage 16-byte loads of f16
/// (exact through f32: naga takes no bitcast from two u32 to four f16).
const F16X4: &str = "fn f16x4(a: u32, b: u32) -> vec4<f16> {
    return vec4<f16>(vec4<f32>(unpack2x16float(a), unpack2x16float(b)));
}
";
/// dequant.wgsl's reads of a weight buffer bound as u32 words, and as 16-byte words.
const WEIGHT_WORDS: &str = "fn wword(i: u32) -> u32 {
    return wq[i];
}

fn wquad(i: u32) -> vec4<u32> {
    return vec4<u32>(wq[4u * i], wq[4u * i + 1u], wq[4u * i + 2u], wq[4u * i + 3u]);
}
";
const WEIGHT_QUADS: &str = "fn wword(i: u32) -> u32 {
    return wq[i >> 2u][i & 3u];
}

fn wquad(i: u32) -> vec4<u32> {
    return wq[i];
}
";
/// The dense tile matmul's tiles (matmul_coop.wgsl): token tiles along the grid's x, row
/// tiles along y, the weight's rows from prm[8], each token its own activation row.
const COOP_DENSE: &str = "fn tile(wid: vec3<u32>) -> vec4<u32> {
    return vec4<u32>(wid.x * BM, prm[2], prm[8], wid.y * BN);
}

fn x_row(t: u32) -> u32 {
    return t;
}
";
/// quantize.wgsl's input: four values at `o` (stored back where the kernel computes them).
const QUANTIZE_IN: &str = "@group(0) @binding(1) var<storage, read> xs: array<f32>;

fn x4(o: u32, live: bool) -> vec4<f32> {
    return vec4<f32>(xs[o], xs[o + 1u], xs[o + 2u], xs[o + 3u]);
}";
const QUANTIZE_GLU_IN: &str = "@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(3) var<storage, read> ups: array<f32>;
@group(0) @binding(5) var<storage, read_write> gout: array<f32>;

fn x4(o: u32, live: bool) -> vec4<f32> {
    var v: vec4<f32>;
    let len = prm[1] * prm[2];
    for (var i = 0u; i < 4u; i = i + 1u) {
        v[i] = glu_value(xs[o + i], ups[o + i], o + i, len, prm[3]);
    }
    if live {
        for (var i = 0u; i < 4u; i = i + 1u) {
            gout[o + i] = v[i];
        }
    }
    return v;
}";
/// Whether every subgroup is a run of consecutive invocations starting at a multiple of its
/// length, which divides `size` (WGSL promises neither): checked once per workgroup, the
/// answer uniform. Included before the subgroup sums that rely on it.
const SUBGROUP_RUNS: &str = "var<workgroup> sg_split: u32;

fn subgroups_are_runs(lid: u32, size: u32) -> bool {
    let n = subgroupAdd(1u);
    let first = subgroupBroadcastFirst(lid);
    if lid == 0u {
        sg_split = 0u;
    }
    workgroupBarrier();
    if n > size || size % n != 0u || first % n != 0u || first + g_sgi != lid {
        sg_split = 1u;
    }
    return workgroupUniformLoad(&sg_split) == 0u;
}
";
/// matmul_vec.wgsl's sum of a row's NPR partials, in a fixed order, where subgroups are
/// runs (SUBGROUP_RUNS): a row within a subgroup by the tree's steps as a butterfly, a
/// row of several subgroups per subgroup, then their sums in order; else a tree.
const ROW_SUM_SUBGROUP: &str = "fn rows_by_subgroup(li: u32) -> bool {
    return subgroups_are_runs(li, NPR * RG);
}

fn row_sum(acc: f32, so: u32, lid: u32, by_subgroup: bool) -> f32 {
    if !by_subgroup {
        return row_sum_tree(acc, so, lid);
    }
    let n = subgroupAdd(1u);
    if n >= NPR {
        // Rows within a subgroup: the tree's halving steps as a butterfly, the tree's sum
        // in the row's first invocation (the one that stores).
        var v = acc;
        for (var s = NPR / 2u; s > 0u; s = s >> 1u) {
            v = v + subgroupShuffleXor(v, s);
        }
        return v;
    }
    let s = subgroupAdd(acc);
    if g_sgi == 0u {
        part[so + lid / n] = s;
    }
    workgroupBarrier();
    var v = 0.0;
    for (var i = 0u; i < NPR / n; i = i + 1u) {
        v = v + part[so + i];
    }
    workgroupBarrier();
    return v;
}
";
/// rms_norm.wgsl's float-float total: a butterfly per subgroup (its lane 0's sum), then
/// the subgroups' totals in order, where subgroups are runs (SUBGROUP_RUNS), else its
/// tree. Two barriers instead of nine.
const FF_TOTAL_SUBGROUP: &str = "fn ff_total(s: vec2<f32>, lid: u32) -> vec2<f32> {
    if !subgroups_are_runs(lid, NT) {
        return ff_total_tree(s, lid);
    }
    let n = subgroupAdd(1u);
    var t = s;
    for (var m = 1u; m < n; m = m << 1u) {
        t = ff_add(t, vec2<f32>(subgroupShuffleXor(t.x, m), subgroupShuffleXor(t.y, m)));
    }
    if g_sgi == 0u {
        red_hi[lid / n] = t.x;
        red_lo[lid / n] = t.y;
    }
    workgroupBarrier();
    var r = vec2<f32>(red_hi[0], red_lo[0]);
    for (var i = 1u; i < NT / n; i = i + 1u) {
        r = ff_add(r, vec2<f32>(red_hi[i], red_lo[i]));
    }
    return r;
}
";
const FF_TOTAL_TREE: &str = "fn ff_total(s: vec2<f32>, lid: u32) -> vec2<f32> {
    return ff_total_tree(s, lid);
}
";
const ROW_SUM_TREE: &str = "fn rows_by_subgroup(li: u32) -> bool {
    return false;
}

fn row_sum(acc: f32, so: u32, lid: u32, by_subgroup: bool) -> f32 {
    return row_sum_tree(acc, so, lid);
}
";
/// rms_norm.wgsl's input: a word of the row (`x_at`: x, or x + y where the residual add
/// comes first, `y_at` and `add_y` its parts), and where the sum is kept; bound at XS (YR,
/// XO), the add's scale at prm[P_ADD] (per includer).
const NORM_IN: &str = "@group(0) @binding(XS) var<storage, read> xs: array<vec4<f32>>;

fn y_at(j: u32) -> vec4<f32> {
    return vec4<f32>(0.0);
}

fn add_y(x: vec4<f32>, y: vec4<f32>) -> vec4<f32> {
    return x;
}

fn x_at(j: u32) -> vec4<f32> {
    return xs[j];
}

fn x_keep(j: u32, v: vec4<f32>) {}";
const NORM_ADD_IN: &str = "@group(0) @binding(XS) var<storage, read> xs: array<vec4<f32>>;
@group(0) @binding(YR) var<storage, read> yr: array<vec4<f32>>;
@group(0) @binding(XO) var<storage, read_write> xo: array<vec4<f32>>;

fn y_at(j: u32) -> vec4<f32> {
    return yr[j];
}

// The CPU's add: x + y * scale (the product rounded on its own).
fn add_y(x: vec4<f32>, y: vec4<f32>) -> vec4<f32> {
    let s = pf(P_ADD);
    if s == 1.0 {
        return x + y;
    }
    return x + vec4<f32>(nc(y.x * s), nc(y.y * s), nc(y.z * s), nc(y.w * s));
}

fn x_at(j: u32) -> vec4<f32> {
    return add_y(xs[j], yr[j]);
}

fn x_keep(j: u32, v: vec4<f32>) {
    xo[j] = v;
}";
/// matmul_prologue.wgsl's ops: the word loads `in_a`, `in_b`, the op's input value
/// `in_value`, `in_scale` over all of them, and `in_out`, the value quantized (stored too
/// where `keep`). The norm of a decode step's one row (its input NORM_IN or NORM_ADD_IN; the
/// weight at WN, its output at NO; prm[PP + 1, 2]: eps, weight length) ...
const PROLOGUE_NORM: &str = "@group(0) @binding(WN) var<storage, read> wn: array<f32>;
@group(0) @binding(NO) var<storage, read_write> nout: array<vec4<f32>>;

fn in_a(j: u32) -> vec4<f32> {
    return xs[j];
}

fn in_b(j: u32) -> vec4<f32> {
    return y_at(j);
}

fn in_value(j: u32, a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {
    return add_y(a, b);
}

fn in_scale(v: array<vec4<f32>, NC>, li: u32, nw: u32) -> f32 {
    var s = vec2<f32>(0.0, 0.0);
    for (var c = 0u; c < NC; c = c + 1u) {
        if c * NT + li < nw {
            s = ff_squares(s, v[c]);
        }
    }
    return rms_scale(ff_total(s, li), 4u * nw, pf(PP + 1u));
}

fn in_out(j: u32, v: vec4<f32>, scale: f32, keep: bool) -> vec4<f32> {
    let y = rms_apply(v, scale, j, prm[PP + 2u]);
    if keep {
        x_keep(j, v);
        nout[j] = y;
    }
    return y;
}";
/// ... (ExpertNorm) where each normed word goes: as f32 into the workgroup's row `xq`
/// (the router's float dots read it), and by the first workgroup quantized for the experts
/// into EQ (quantize_core.wgsl's `xq` renamed, the mode prm[PP]) ...
const EXPERT_PUT: &str = "@group(0) @binding(EQ) var<storage, read_write> eq: array<u32>;

fn in_put(j: u32, y: vec4<f32>, live: bool, li: u32, first: bool, k: u32) {
    if live {
        for (var i = 0u; i < 4u; i = i + 1u) {
            xq[4u * j + i] = bitcast<u32>(y[i]);
        }
    }
    if first {
        quantize_word(j, y, live, li, prm[PP], 1u, k);
    }
}
";
/// ... the GLU of the row from word `in_w0` (gate bound at 2, up at UP, its
/// output at GO; prm[PP + 1, 2]: the act, the values of all rows, whose whole groups of 16
/// take ggml's expf as the GLU kernel's do) ...
const PROLOGUE_GLU: &str = "@group(0) @binding(2) var<storage, read> xs: array<vec4<f32>>;
@group(0) @binding(UP) var<storage, read> ups: array<vec4<f32>>;
@group(0) @binding(GO) var<storage, read_write> gout: array<vec4<f32>>;

fn in_a(j: u32) -> vec4<f32> {
    return xs[in_w0 + j];
}

fn in_b(j: u32) -> vec4<f32> {
    return ups[in_w0 + j];
}

fn in_value(j: u32, a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {
    var v: vec4<f32>;
    for (var i = 0u; i < 4u; i = i + 1u) {
        v[i] = glu_value(a[i], b[i], 4u * (in_w0 + j) + i, prm[PP + 2u], prm[PP + 1u]);
    }
    return v;
}

fn in_scale(v: array<vec4<f32>, NC>, li: u32, nw: u32) -> f32 {
    return 1.0;
}

fn in_out(j: u32, v: vec4<f32>, scale: f32, keep: bool) -> vec4<f32> {
    if keep {
        gout[in_w0 + j] = v;
    }
    return v;
}";
/// ... or none (f32 values bound at 2, the row from word `in_w0`).
const PROLOGUE_QUANTIZE: &str = "@group(0) @binding(2) var<storage, read> xs: array<vec4<f32>>;

fn in_a(j: u32) -> vec4<f32> {
    return xs[in_w0 + j];
}

fn in_b(j: u32) -> vec4<f32> {
    return vec4<f32>(0.0);
}

fn in_value(j: u32, a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {
    return a;
}

fn in_scale(v: array<vec4<f32>, NC>, li: u32, nw: u32) -> f32 {
    return 1.0;
}

fn in_out(j: u32, v: vec4<f32>, scale: f32, keep: bool) -> vec4<f32> {
    return v;
}";
/// Packed 4x8 integer dot: the WGSL builtin (naga emits OpSDot where the device has it, a
/// polyfill elsewhere), or plain shifts on the forced fallback path.
const DOT4_PACKED: &str = "    return dot4I8Packed(a, b);";
const DOT4_PLAIN: &str = "    var s = 0;
    for (var i = 0u; i < 32u; i = i + 8u) {
        s = s + extractBits(bitcast<i32>(a), i, 8u) * extractBits(bitcast<i32>(b), i, 8u);
    }
    return s;";

/// A matmul's outputs: how many (1, or 2-3 for weights uploaded together: q/k/v,
/// gate/up), whether each adds its bias vector as values are stored (q/k/v biases), and
/// (vec path) whether q/k/v rows are stored with RoPE and the KV store (rope_epilogue.wgsl),
/// whether a mixture of experts' router logits are routed by the workgroup that finishes
/// last (`route`: ROUTE_TAIL, route.wgsl; one output), whether q and k heads are
/// RMSNormed, then stored with RoPE and the KV store with v, by the last workgroup of each
/// head to finish (`norm_rope`: norm_rope_tail.wgsl; three outputs), and the wide-unit
/// format (`vec_fast`) of the last output's rows where it is not the others' (Q4_K_M's Q6_K
/// v under Q4_K q and k: `tail`, 0 where all share one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Outs {
    pub n: u8,
    pub bias: bool,
    pub rope: bool,
    pub route: bool,
    pub norm_rope: bool,
    pub tail: u8,
}

/// One output, no bias, RoPE, route or tail (the expert matmuls').
pub const ONE_OUT: Outs = Outs { n: 1, bias: false, rope: false, route: false, norm_rope: false, tail: 0 };

/// Where the vec matmul's activations come from: quantized rows bound at 2 (`Quantized`),
/// or, in a decode step, made by every workgroup in its prologue from the op before
/// (matmul_prologue.wgsl): the attention's f32 output quantized, the RMSNorm (with the
/// residual add), or the GLU; one dispatch instead of two. `ExpertNorm` is a mixture of
/// experts' f32 router's: the residual add and RMSNorm kept in f32 for the router's
/// float dots, its first workgroup also quantizing the norm for the experts into a bound
/// buffer (the FFN norm's dispatch saved). The value is k, which sizes the workgroup memory
/// they go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Input {
    Quantized,
    Quantize(u32),
    Norm(u32),
    AddNorm(u32),
    Glu(u32),
    ExpertNorm(u32),
}

impl Input {
    /// Words of workgroup memory a row of k takes: quantized, k / 4 of quants, then the
    /// scales and sums (at most k / 16 + k / 256: Q8_K's); in f32, k.
    pub fn words(k: usize, f32_row: bool) -> usize {
        if f32_row {
            k
        } else {
            k / 4 + k / 16 + k / 256 + 1
        }
    }

    /// Its buffers bound after the matmul's own (before the RoPE store's caches).
    pub fn extra_bindings(self) -> usize {
        match self {
            Input::Quantized | Input::Quantize(_) => 0,
            Input::Norm(_) => 2,
            Input::Glu(_) => 3,
            Input::AddNorm(_) => 4,
            Input::ExpertNorm(_) => 5,
        }
    }
}

/// Which attention kernel an `AttentionKv` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnKind {
    /// attention.wgsl (the exact kernel).
    Exact,
    /// attention_split.wgsl's partial sums.
    Partial,
    /// attention_split.wgsl's output where every head's keys fit one chunk.
    Direct,
}

/// What a `KvRows` kernel does (kv_rows.wgsl's entry points).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvOp {
    Store,
    Load,
    Copy,
}

/// A KV cache type's code in the WGSL kernels (kv_blocks.wgsl's KV_TY; 6: F16) and its
/// bytes per 32 values.
pub(super) fn kv_code(ty: GgmlType) -> (u32, usize) {
    use GgmlType::*;
    let code = match ty {
        Q8_0 => 0,
        Q4_0 => 1,
        Q4_1 => 2,
        Q5_0 => 3,
        Q5_1 => 4,
        IQ4_NL => 5,
        _ => 6,
    };
    (code, ty.type_size() * 32 / ty.block_size())
}

/// kv_blocks.wgsl for the cache named `name` (kc, vc, kq) of `ty`, its words read by `word`.
fn kv_blocks(name: &str, ty: GgmlType, word: &str) -> String {
    let (code, bb) = kv_code(ty);
    let mut s = format!(
        "const KV_TY: u32 = {code}u;\nconst KV_BB: u32 = {bb}u;\nfn KV_word(i: u32) -> u32 {{\n    return {word};\n}}\n"
    );
    s.push_str(KV_BLOCKS);
    s.replace("KV_", &format!("{name}_"))
}

/// How an attention kernel leaves its output for the matmul that reads it: as it is
/// (`Off`), quantized by each head's workgroup (`Head`: heads of whole blocks,
/// attn_quantize.wgsl), or by the last of a block's heads to finish (`Block`: heads that
/// divide a Q8_K superblock of 256, as Q4_K's and Q6_K's activations take heads of 64 and
/// 128; attn_block_quantize.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnTail {
    Off,
    Head,
    Block,
}

/// A compute kernel: its source file and entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// A workgroup per weight row with the CPU's exact float chains (bit-identical). The
    /// count is of outputs (1, or 2-3 for weights uploaded together: q/k/v, gate/up).
    Matmul(GgmlType, Outs),
    /// An invocation per weight row (software adapters).
    MatmulRows(GgmlType, Outs),
    /// Rows split over a workgroup, f32 partial sums (not bit-identical to the CPU, still
    /// batch invariant).
    MatmulVec(GgmlType, Outs, Input, VecShape),
    /// Tiles on cooperative matrices (coop.rs): prompt chunks and large decode batches.
    MatmulCoop(GgmlType, Outs, CoopShape),
    /// The sum of a tile matmul's k splits, stored to its outputs.
    CoopReduce(Outs),
    /// A prompt's expert slots grouped by expert (expert_group.wgsl, moe_coop.rs).
    ExpertGroup,
    /// The tile matmul through experts, each workgroup one expert's tile of slots
    /// (matmul_id_coop.wgsl); the count is of outputs (1, or 2: a gate and up in one
    /// buffer). k is never split.
    MatmulIdCoop(GgmlType, u8, CoopShape),
    /// The embedding lookup; `true`: the ids are read from a device buffer (bound third:
    /// the last greedy step's), not from the parameters.
    Embed(GgmlType, bool),
    Quantize,
    /// The gated activation (a deferred glu op) fused into the quantize that reads it.
    QuantizeGlu,
    /// RMSNorm; `true`: its output also quantized for the matmul reading it (prm[5] the
    /// mode, the quantized rows bound last).
    RmsNorm(bool),
    /// Residual add fused with the next RMSNorm (and, `true`, the quantize after it).
    AddRmsNorm(bool),
    /// LayerNorm with its weight and optional bias (encoders), a workgroup per row.
    LayerNorm,
    /// GELU-tanh in place (BERT's feed-forward).
    Gelu,
    /// LFM2's short convolution: each token's output, and the new states' rows to a
    /// scratch buffer (short_conv.wgsl `conv`)...
    ShortConv,
    /// ... then those rows stored to their state slots (`state`).
    ConvState,
    Rope,
    /// RoPE on q and k with the KV store, fused.
    RopeStore,
    /// The same after each head of q and k is RMSNormed (rope_store.wgsl `norm`).
    RopeStoreNorm,
    /// RoPE on q and k with the store to quantized caches (rope_store.wgsl `quantized`).
    RopeStoreQ,
    KvStore,
    KvShift,
    /// Attention, its output also quantized for the matmul reading it as the tail says
    /// (prm[8] the mode, the quantized rows bound after the output).
    Attention(AttnTail),
    /// The vec path's decode attention, split over key chunks: the chunks' partial sums.
    AttnPartial,
    /// The same kernel where every head's keys fit one chunk: the output itself, no merge;
    /// the tail as Attention's.
    AttnDirect(AttnTail),
    /// Their merge per (token, head); the tail as Attention's.
    AttnCombine(AttnTail),
    /// Prompt attention on cooperative matrices (coop_attn.rs); `true` as Attention's.
    AttnCoop(bool, AttnShape),
    /// Attention over caches of the K and V types (crate::kv::CACHE_TYPES, one at least
    /// quantized; attention_kv.wgsl), as the kernel `AttnKind` names, without a quantize tail.
    AttentionKv(AttnKind, GgmlType, GgmlType),
    /// Rows in and out of one KV cache of a cache type (kv_rows.wgsl).
    KvRows(KvOp, GgmlType),
    /// Rows rotated by a quantized cache's Walsh-Hadamard transform (kv_rotate.wgsl);
    /// `true`: also quantized (prm[8] the mode, the quantized rows bound third).
    KvRotate(bool),
    Glu,
    Add,
    AddBias,
    Scale,
    Softcap,
    Gather,
    Argmax,
    /// The best of each row's parts (argmax.wgsl's `combine`).
    ArgmaxCombine,
    /// A mixture of experts' matmul, each slot's row through its own expert (the ids read
    /// from a device buffer; moe.rs): `true` a workgroup per row (the exact kernel's
    /// arithmetic), `false` an invocation per row (software adapters). Both bit-identical
    /// to the CPU's dense matmul of the same rows.
    MatmulId(GgmlType, bool),
    /// The same on the vec path (matmul_id_vec.wgsl): each slot's rows through the vec
    /// matmul, its arithmetic and bandwidth (hardware GPUs).
    /// The count is of outputs (1, or 2: a gate and up in one buffer); the input quantized
    /// as the dense vec matmul's; the tail ([`IdTail`]) it runs as its slots finish.
    MatmulIdVec(GgmlType, u8, IdTail, VecShape),
    /// The router's top-k per token (moe.wgsl's entry, route.wgsl).
    MoeRoute,
    /// The routing-weighted sum of each token's expert outputs.
    MoeSum,
    /// A shared expert's output added through its sigmoid gate.
    MoeGatedAdd,
}

impl Kernel {
    fn source(self) -> (&'static str, &'static str) {
        use Kernel::*;
        let ew = include_str!("shaders/elementwise.wgsl");
        match self {
            Matmul(..) => (include_str!("shaders/matmul.wgsl"), "main"),
            MatmulRows(..) => (include_str!("shaders/matmul_rows.wgsl"), "main"),
            MatmulVec(..) | MatmulIdVec(..) => (include_str!("shaders/matmul_vec.wgsl"), "main"),
            MatmulCoop(..) | MatmulIdCoop(..) => (include_str!("shaders/matmul_coop.wgsl"), "main"),
            ExpertGroup => (include_str!("shaders/expert_group.wgsl"), "main"),
            CoopReduce(_) => (include_str!("shaders/coop_reduce.wgsl"), "main"),
            Embed(..) => (include_str!("shaders/embed.wgsl"), "main"),
            Quantize | QuantizeGlu => (include_str!("shaders/quantize.wgsl"), "main"),
            RmsNorm(_) | AddRmsNorm(_) => (include_str!("shaders/rms_norm.wgsl"), "main"),
            LayerNorm => (include_str!("shaders/layer_norm.wgsl"), "main"),
            Gelu => (include_str!("shaders/gelu.wgsl"), "main"),
            ShortConv => (include_str!("shaders/short_conv.wgsl"), "conv"),
            ConvState => (include_str!("shaders/short_conv.wgsl"), "state"),
            Rope => (include_str!("shaders/rope.wgsl"), "main"),
            RopeStore => (include_str!("shaders/rope_store.wgsl"), "main"),
            RopeStoreNorm => (include_str!("shaders/rope_store.wgsl"), "norm"),
            RopeStoreQ => (include_str!("shaders/rope_store.wgsl"), "quantized"),
            KvStore => (include_str!("shaders/kv_store.wgsl"), "main"),
            KvShift => (include_str!("shaders/kv_shift.wgsl"), "main"),
            Attention(_) => (include_str!("shaders/attention.wgsl"), "main"),
            AttnPartial | AttnDirect(_) => (include_str!("shaders/attention_split.wgsl"), "main"),
            AttnCombine(_) => (include_str!("shaders/attention_combine.wgsl"), "main"),
            AttnCoop(..) => (include_str!("shaders/attention_coop.wgsl"), "main"),
            AttentionKv(AttnKind::Exact, ..) => (include_str!("shaders/attention.wgsl"), "main"),
            AttentionKv(..) => (include_str!("shaders/attention_split.wgsl"), "main"),
            KvRows(op, _) => (
                include_str!("shaders/kv_rows.wgsl"),
                match op {
                    KvOp::Store => "store",
                    KvOp::Load => "load",
                    KvOp::Copy => "copy",
                },
            ),
            KvRotate(_) => (include_str!("shaders/kv_rotate.wgsl"), "main"),
            Glu => (ew, "glu"),
            Add => (ew, "add"),
            AddBias => (ew, "add_bias"),
            Scale => (ew, "scale"),
            Softcap => (ew, "softcap"),
            Gather => (ew, "gather"),
            Argmax => (include_str!("shaders/argmax.wgsl"), "main"),
            ArgmaxCombine => (include_str!("shaders/argmax.wgsl"), "combine"),
            // The exact kernel's file (its dot_wg) with the expert-indexed entry points.
            MatmulId(_, exact) => (
                concat!(include_str!("shaders/matmul.wgsl"), include_str!("shaders/matmul_id.wgsl")),
                if exact { "by_id_exact" } else { "by_id_rows" },
            ),
            MoeRoute => (include_str!("shaders/moe.wgsl"), "route"),
            MoeSum => (include_str!("shaders/moe.wgsl"), "sum"),
            MoeGatedAdd => (include_str!("shaders/moe.wgsl"), "gated_add"),
        }
    }
}

/// Weight rows per workgroup of the exact matmul, 64 invocations each (fewer, larger
/// workgroups launch faster; 1, 2 and 4 measured on the H200, 2 best).
pub const EXACT_ROWS: usize = 2;

/// The vec matmul's base shape: weight rows per workgroup and invocations per row. 32 x 4
/// measured best on the H200 (7B tg128: 64 x 2 197, 32 x 4 203, 32 x 8 206, 64 x 4 198,
/// 128 x 2 166 tok/s; Qwen2.5-7B 143, 150, 148, 149, 114).
const VEC_RG: usize = 4;
const VEC_NPR: usize = 32;

/// A vec matmul's workgroup: weight rows (`rg` slots of `npr` invocations, `rr` rows each)
/// and tokens (matmul_vec.wgsl's RG, NPR, RR, TT: one row a slot and one token for a decode
/// step; for prompts [`VEC_TT`] tokens, and [`VEC_RR`] rows a slot where they can share
/// activations).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VecShape {
    pub rg: usize,
    pub npr: usize,
    pub rr: usize,
    pub tt: usize,
}

/// Rows a slot of a prompt's vec matmul takes: a token's activations of a unit are loaded
/// once for them all.
pub const VEC_RR: usize = 2;

/// Tokens per workgroup of a vec matmul over several: each weight unit loaded and unpacked
/// once for all of them.
pub const VEC_TT: usize = 8;

/// Invocations in flight under which a weight's long rows take more invocations each.
const VEC_THREADS: usize = 1 << 16;

/// The fewest invocations a vec matmul gives a short row: 16, or the adapter's subgroup
/// where it is smaller (a row then still fits one subgroup's butterfly).
pub fn vec_npr_min(subgroup_max: u32) -> usize {
    (subgroup_max as usize).clamp(8, 16)
}

/// The vec matmul's shape for a weight of `rows` rows of `k` values: 32 invocations a row,
/// 64 or 128 where its rows alone would keep fewer than `VEC_THREADS` in flight and each
/// still has two two-unit steps (the long rows of a small model's down projection: more
/// loads in flight), and `npr_min` ([`vec_npr_min`]) where a row's units fit one two-unit
/// step of that many (short rows: fewer idle invocations, twice the workgroup's rows), as
/// many invocations per workgroup. By the weight alone, so a token's sums are the same in
/// any batch. Measured on an H200: Qwen2.5-1.5B's down (1536 rows) at 64, decode 472 -> 481
/// tok/s (prompts 2174 -> 2148); Qwen2.5-7B's (3584 rows) would lose at 64 (292 -> 284), so
/// the bound sits between them. At 16 for rows of at most 32 units (k 576 and 1536; 8
/// measured the same): smollm2 895 -> 945, Qwen2.5-1.5B 509 -> 547 tok/s (with the 2 MiB
/// prologue bound), its prompts 2419 -> 3122 (its 151,936-row output: 148 -> 94 us).
pub fn vec_shape_for(ty: GgmlType, rows: usize, k: usize, npr_min: usize) -> VecShape {
    let (rg, mut npr) = (VEC_RG, VEC_NPR);
    // Units per row (matmul_vec.wgsl's nu).
    let units = match (vec_fast(ty), ty) {
        (2.., _) => k / 64,
        (_, GgmlType::F32 | GgmlType::F16) => k / 8,
        _ => k / 32,
    };
    while npr < 128 && rows * npr < VEC_THREADS && units >= 4 * npr {
        npr *= 2;
    }
    while npr > npr_min && units <= npr {
        npr /= 2;
    }
    let rg = if npr < VEC_NPR { rg * VEC_NPR / npr } else { rg.min(256 / npr) };
    VecShape { rg, npr, rr: 1, tt: 1 }
}

/// The vec matmul's wide units for `ty` (dot_vec.wgsl's FAST: 1 Q4_0, 2 Q4_K, 3 Q6_K), 0
/// where it has none.
pub fn vec_fast(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::Q4_0 => 1,
        GgmlType::Q4_K => 2,
        GgmlType::Q6_K => 3,
        _ => 0,
    }
}

/// Weight types the GPU kernels read directly; others are widened to F16 at upload.
pub fn gpu_weight_type(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F32 | F16 | Q4_0 | Q4_1 | Q5_0 | Q8_0 | Q4_K | Q5_K | Q6_K)
}

/// A weight type's chunk functions in dequant.wgsl (`fetch_NAME`, `unpack_NAME`) and the
/// words a chunk's fetch holds (where it loads a window, two more: `rw` may read past it).
fn chunk_fn(ty: GgmlType) -> (&'static str, u32) {
    use GgmlType::*;
    match ty {
        F32 => ("f32", 32),
        F16 => ("f16", 22),
        Q4_0 => ("q4_0", 10),
        Q4_1 => ("q4_1", 10),
        Q5_0 => ("q5_0", 14),
        Q8_0 => ("q8_0", 14),
        Q4_K => ("q4_k", 12),
        Q5_K => ("q5_k", 20),
        _ => ("q6_k", 26),
    }
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
    // The float steps of the K formats (dot.wgsl): as the CPU's Q5_K, Q4_K, Q6_K kernels.
    let kmode = match ty {
        Q4_K => 1,
        Q6_K => 2,
        _ => 0,
    };
    format!(
        "const CLASS: u32 = {class}u;\nconst KMODE: u32 = {kmode}u;\nconst BB: u32 = {}u;\nconst HAS_MIN: bool = {};\n\
         const WF16: bool = {};\nconst GENERIC: bool = {};\n\
         fn unit_a(o: u32, xw: u32) {{\n    {unit}(o, xw);\n}}\n\
         fn sub_k(o: u32, j: u32, xw: u32) -> vec2<i32> {{\n    return {sub}(o, j, xw);\n}}\n\
         fn kscale(o: u32) -> vec2<f32> {{\n    return {kscale}(o);\n}}\n",
        ty.type_size(),
        ty == Q4_1,
        ty == F16,
        ty == Q5_0,
    )
}

/// The matmuls' `store(t, r, v)` of row `r`'s value for token `t`: to `ys` at the
/// output stride and column (prm 4, 5), or, for weights uploaded together, to the output
/// whose rows hold `r` (bindings 3, 4, 5 from the row boundaries prm 9, 10).
fn matmul_store(outs: Outs, base: usize) -> String {
    let n = outs.n as usize;
    // (Atomic words where a tail's last workgroup reads them.)
    let atomic = outs.norm_rope;
    let ty = if atomic { "array<atomic<u32>>" } else { "array<f32>" };
    let mut s = String::new();
    for i in 1..n {
        s.push_str(&format!("@group(0) @binding({}) var<storage, read_write> ys{i}: {ty};\n", base + i));
    }
    if outs.bias {
        for i in 0..n {
            s.push_str(&format!(
                "@group(0) @binding({}) var<storage, read> bias{i}: array<f32>;\n",
                base + n + i
            ));
        }
    }
    // Value v of column c of output i; the bias add is the CPU's separate add (nc: never
    // fused with the product before it).
    let value = |i: usize| if outs.bias { format!("nc(v) + bias{i}[c]") } else { "v".to_string() };
    let mut body = String::new();
    if n == 1 && outs.route {
        // Atomic words, which the route tail reads.
        body.push_str("    let c = prm[5] + r;\n    atomicStore(&ys[t * prm[4] + c], bitcast<u32>(v));\n");
    } else if n == 1 {
        // prm[4] columns from prm[5] (a part of a weight split by rows).
        body.push_str(&format!("    let c = prm[5] + r;\n    ys[t * prm[4] + c] = {};\n", value(0)));
    }
    // Output i holds rows bound[i]..bound[i + 1] of the dispatch.
    let bound = |i: usize| match i {
        0 => "0u".to_string(),
        i if i == n => "prm[0]".to_string(),
        i => format!("prm[{}]", 8 + i),
    };
    for i in (0..n).rev().filter(|_| n > 1) {
        let name = if i == 0 { "ys".to_string() } else { format!("ys{i}") };
        let (lo, hi) = (bound(i), bound(i + 1));
        let at = format!("{name}[t * ({hi} - {lo}) + c]");
        let put = if atomic {
            format!("atomicStore(&{at}, bitcast<u32>({}))", value(i))
        } else {
            format!("{at} = {}", value(i))
        };
        body.push_str(&format!(
            "    if r >= {lo} {{\n        let c = r - {lo};\n        {put};\n        return;\n    }}\n"
        ));
    }
    s.push_str(&format!("fn store(t: u32, r: u32, v: f32) {{\n{body}}}\n"));
    // Row r's value with its bias (the RoPE store takes values before storing them).
    let mut biased = String::new();
    for i in (0..n).rev() {
        let (lo, v) = (bound(i), value(i));
        let c = if n == 1 { "prm[5] + r".to_string() } else { format!("r - {lo}") };
        biased.push_str(&format!("    if r >= {lo} {{\n        let c = {c};\n        return {v};\n    }}\n"));
    }
    s.push_str(&format!("fn biased(r: u32, v: f32) -> f32 {{\n{biased}    return v;\n}}\n"));
    s
}

/// The vec matmul's activations (`Input`): bound at 2 (and at `xv` as 16-byte words for
/// the wide units), or made in the prologue into workgroup memory from the op's buffers
/// (bound at 2 and from `extras`); its parameters start after the RoPE store's.
fn matmul_input(
    input: Input,
    nt: usize,
    xv: usize,
    extras: usize,
    pp: usize,
    fast: bool,
    subgroups: bool,
) -> String {
    let k = match input {
        Input::Quantized => {
            let mut s = "@group(0) @binding(2) var<storage, read> xq: array<u32>;\n\
                         fn prologue(li: u32, first: bool, row: u32) {}\n"
                .to_string();
            if fast {
                s.push_str(&format!(
                    "@group(0) @binding({xv}) var<storage, read> xv: array<vec4<u32>>;\n\
                     fn xv_at(i: u32) -> vec4<u32> {{\n    return xv[i];\n}}\n"
                ));
            }
            return s;
        }
        Input::Quantize(k) | Input::Norm(k) | Input::AddNorm(k) | Input::Glu(k) | Input::ExpertNorm(k) => {
            k as usize
        }
    };
    let nc = (k / 4).div_ceil(nt);
    let experts = matches!(input, Input::ExpertNorm(_));
    let mut s = MATMUL_PROLOGUE
        .replace("XQW", &format!("{}u", Input::words(k, experts)))
        .replace("NCW", &format!("{nc}u"));
    s.push_str(
        "fn xv_at(i: u32) -> vec4<u32> {\n    return vec4<u32>(xq[4u * i], xq[4u * i + 1u], xq[4u * i + 2u], xq[4u * i + 3u]);\n}\n",
    );
    let at = |i: usize| (extras + i).to_string();
    s.push_str(&if experts {
        // quantize_core's output renamed: `xq` is the f32 row here.
        format!("{}{}", EXPERT_PUT.replace("EQ", &at(4)), QUANTIZE_CORE.replace("xq[", "eq["))
    } else {
        "fn in_put(j: u32, y: vec4<f32>, live: bool, li: u32, first: bool, k: u32) {\n    \
         quantize_word(j, y, live, li, prm[PP], 1u, k);\n}\n"
            .to_string()
    });
    let op = match input {
        Input::Norm(_) | Input::AddNorm(_) | Input::ExpertNorm(_) => {
            let read = if matches!(input, Input::Norm(_)) { NORM_IN } else { NORM_ADD_IN };
            s.push_str(FF_SUM);
            s.push_str(RMS_APPLY);
            s.push_str(if subgroups { FF_TOTAL_SUBGROUP } else { FF_TOTAL_TREE });
            let read = read.replace("XS", "2").replace("YR", &at(2)).replace("XO", &at(3));
            format!(
                "{}\n{}",
                read.replace("P_ADD", &format!("{}u", pp + 3)),
                PROLOGUE_NORM.replace("WN", &at(0)).replace("NO", &at(1))
            )
        }
        Input::Glu(_) => {
            s.push_str(&GLU.replace("GT", &at(1)));
            PROLOGUE_GLU.replace("UP", &at(0)).replace("GO", &at(2))
        }
        _ => PROLOGUE_QUANTIZE.to_string(),
    };
    s.push_str(&op);
    s.push('\n');
    s.replace("PP", &format!("{pp}u"))
}

/// The full WGSL text of a kernel (exposed for the shader-validation test). `subgroups`
/// false is the portable fallback: tree reductions and plain integer dots.
/// `fused_fma`: the driver's fma() rounds once (else it is emulated from exact parts).
pub fn assemble(k: Kernel, subgroups: bool, fused_fma: bool) -> String {
    let (src, _) = k.source();
    let mut s = String::new();
    if let Kernel::MatmulCoop(_, _, shape) | Kernel::MatmulIdCoop(_, _, shape) = k {
        s.push_str(super::coop::enables(shape));
    }
    if let Kernel::AttnCoop(_, shape) = k {
        s.push_str(super::coop_attn::enables(shape));
    }
    if let Kernel::MatmulCoop(..) | Kernel::MatmulIdCoop(..) | Kernel::AttnCoop(..) = k {
        s.push_str(F16X4);
    }
    let fma = if fused_fma { "    return fma(a, b, c);" } else { "    return fma_soft(a, b, c);" };
    s.push_str(
        &COMMON
            .replace("//REDUCE", if subgroups { REDUCE_SUBGROUP } else { REDUCE_TREE })
            .replace("//FMA", fma),
    );
    if let Kernel::Matmul(ty, _)
    | Kernel::MatmulRows(ty, _)
    | Kernel::MatmulVec(ty, ..)
    | Kernel::MatmulCoop(ty, ..)
    | Kernel::MatmulIdCoop(ty, ..)
    | Kernel::MatmulId(ty, _)
    | Kernel::MatmulIdVec(ty, ..)
    | Kernel::Embed(ty, _) = k
    {
        // Fetch slots: one, or the tile matmul's rows per invocation for each stage it has
        // in flight.
        let nq = match k {
            Kernel::MatmulCoop(_, _, shape) | Kernel::MatmulIdCoop(_, _, shape) => {
                shape.ahead * shape.rows_per_invocation()
            }
            _ => 1,
        };
        let (name, words) = chunk_fn(ty);
        s.push_str(&format!("const RAW: u32 = {words}u;\nconst NQ: u32 = {nq}u;\n"));
        // The weight buffer's words: the tile matmul binds it as 16-byte words.
        s.push_str(match k {
            Kernel::MatmulCoop(..) | Kernel::MatmulIdCoop(..) => WEIGHT_QUADS,
            _ => WEIGHT_WORDS,
        });
        s.push_str(DEQUANT);
        s.push_str(&format!(
            "fn fetch_chunk(b: u32, c: u32, q: u32) {{\n    fetch_{name}(b, c, q);\n}}\n\
             fn unpack_chunk(c: u32, q: u32) {{\n    wmin = 0.0;\n    unpack_{name}(c, q);\n}}\n\
             fn load_chunk(b: u32, c: u32) {{\n    fetch_chunk(b, c, 0u);\n    unpack_chunk(c, 0u);\n}}\n"
        ));
    }
    let dot = match k {
        Kernel::Matmul(ty, outs) | Kernel::MatmulRows(ty, outs) | Kernel::MatmulVec(ty, outs, ..) => {
            Some((ty, outs))
        }
        // (Its store is for matmul.wgsl's own entry point, unused.)
        Kernel::MatmulId(ty, _) => Some((ty, ONE_OUT)),
        Kernel::MatmulIdVec(ty, ..) => Some((ty, ONE_OUT)),
        _ => None,
    };
    if let Some((ty, outs)) = dot {
        s.push_str(&DOT.replace("//DOT4", if subgroups { DOT4_PACKED } else { DOT4_PLAIN }));
        s.push_str(&dot_consts(ty));
        // (The expert slots' store is matmul_id_vec.wgsl's.)
        if !matches!(k, Kernel::MatmulIdVec(..)) {
            s.push_str(&matmul_store(outs, 3));
        }
    }
    match k {
        // A split's partial sums, [split][token][row], for CoopReduce.
        Kernel::MatmulCoop(_, _, shape) if shape.ks > 1 => {
            s.push_str(COOP_DENSE);
            s.push_str(
                "fn store(t: u32, r: u32, v: f32) {\n    ys[(g_split * prm[2] + t) * prm[0] + r] = v;\n}\n",
            )
        }
        Kernel::MatmulCoop(_, outs, _) => {
            s.push_str(COOP_DENSE);
            s.push_str(&matmul_store(outs, 3));
        }
        // A slot's row to the output that holds it (matmul_store's, by slot), the slots'
        // groups bound after the outputs.
        Kernel::MatmulIdCoop(_, n, _) => {
            s.push_str(&matmul_store(Outs { n, ..ONE_OUT }, 3).replace("fn store(", "fn store_slot("));
            s.push_str(&MATMUL_ID_COOP.replace("GRP", &(3 + n as usize).to_string()));
        }
        // Its outputs bound from 2 on (the partial sums at 1).
        Kernel::CoopReduce(outs) => s.push_str(&matmul_store(outs, 2)),
        _ => {}
    }
    if let Kernel::Embed(_, device_ids) = k {
        s.push_str(if device_ids {
            "@group(0) @binding(3) var<storage, read> dev_ids: array<u32>;\n\
             fn token_id(t: u32) -> u32 {\n    return dev_ids[t];\n}\n"
        } else {
            "fn token_id(t: u32) -> u32 {\n    return prm[6u + t];\n}\n"
        });
    }
    if let Kernel::RmsNorm(_) | Kernel::AddRmsNorm(_) | Kernel::LayerNorm = k {
        s.push_str(FF_SUM);
        s.push_str(RMS_APPLY);
        s.push_str(if subgroups { FF_TOTAL_SUBGROUP } else { FF_TOTAL_TREE });
        if subgroups {
            s.push_str(SUBGROUP_RUNS);
        }
    }
    if let Kernel::RopeStore | Kernel::RopeStoreNorm | Kernel::RopeStoreQ = k {
        // `norm`'s head sums: a workgroup of 64 (a head is at most 64 words).
        s.push_str("const NT: u32 = 64u;\n");
        s.push_str(FF_SUM);
        s.push_str(RMS_APPLY);
        s.push_str(FF_TOTAL_TREE);
    }
    if let Kernel::AttnPartial | Kernel::AttnDirect(_) = k {
        s.push_str(&format!("const DIRECT: bool = {};\n", k != Kernel::AttnPartial));
    }
    if let Kernel::AttentionKv(kind, _, _) = k {
        if kind != AttnKind::Exact {
            s.push_str(&format!("const DIRECT: bool = {};\n", kind == AttnKind::Direct));
        }
    }
    // The attention kernels' quantized caches (attention_kv.wgsl): K's scores, V's values,
    // or stubs where the cache holds f16.
    let kv_types = match k {
        Kernel::AttentionKv(kind, kt, vt) => Some((kind, kt, vt)),
        Kernel::Attention(_) => Some((AttnKind::Exact, GgmlType::F16, GgmlType::F16)),
        Kernel::AttnPartial | Kernel::AttnDirect(_) => {
            Some((AttnKind::Partial, GgmlType::F16, GgmlType::F16))
        }
        _ => None,
    };
    if let Some((kind, kt, vt)) = kv_types {
        let (kq, vq) = (kt != GgmlType::F16, vt != GgmlType::F16);
        s.push_str(&format!(
            "const KQ: bool = {kq};\nconst VQ: bool = {vq};\nconst K_BB: u32 = {}u;\nconst V_BB: u32 = {}u;\n",
            kv_code(kt).1,
            kv_code(vt).1
        ));
        if kq || vq {
            s.push_str(IQ4NL_TABLE);
        }
        if kq {
            // The split kernel reads K as 16-byte words.
            let word = if kind == AttnKind::Exact { "kc[i]" } else { "kc[i >> 2u][i & 3u]" };
            s.push_str(&kv_blocks("kc", kt, word));
            s.push_str(ATTENTION_KV);
        } else {
            s.push_str("fn k_score(o: u32, row: u32, hd: u32) -> f32 {\n    return 0.0;\n}\n");
        }
        if vq {
            s.push_str(&kv_blocks("vc", vt, "vc[i]"));
            s.push_str("fn v_pair(o: u32, e: u32) -> vec2<f32> {\n    return vc_pair(o, e);\n}\n");
        } else {
            s.push_str("fn v_pair(o: u32, e: u32) -> vec2<f32> {\n    return vec2<f32>(0.0);\n}\n");
        }
    }
    if let Kernel::KvRows(_, ty) = k {
        s.push_str(&format!("const KT: u32 = {}u;\n", kv_code(ty).0));
        s.push_str(IQ4NL_TABLE);
        s.push_str(&kv_blocks("kq", ty, "atomicLoad(&kq[i])"));
    }
    let src = match k {
        Kernel::Matmul(..) | Kernel::MatmulId(..) => {
            if let Kernel::MatmulId(..) = k {
                s.push_str(&EXPERT_SLOTS.replace("IDS", "4"));
            }
            s.push_str(&format!("const RG: u32 = {EXACT_ROWS}u;\n"));
            src.replace("@workgroup_size(256)", &format!("@workgroup_size({})", 64 * EXACT_ROWS))
        }
        Kernel::MatmulCoop(_, _, shape) | Kernel::MatmulIdCoop(_, _, shape) => {
            super::coop::source(shape, src)
        }
        Kernel::AttnCoop(_, shape) => super::coop_attn::source(shape, src),
        Kernel::MatmulVec(..) | Kernel::MatmulIdVec(..) => {
            let (ty, outs, input, VecShape { rg, npr, rr, tt }) = match k {
                Kernel::MatmulVec(ty, outs, input, shape) => (ty, outs, input, shape),
                Kernel::MatmulIdVec(ty, n, _, shape) => (ty, Outs { n, ..ONE_OUT }, Input::Quantized, shape),
                _ => unreachable!("matched above"),
            };
            s.push_str(&format!(
                "const RG: u32 = {rg}u;\nconst NPR: u32 = {npr}u;\nconst RR: u32 = {rr}u;\nconst TT: u32 = {tt}u;\n"
            ));
            let fast = vec_fast(ty);
            s.push_str(&format!("const FAST: u32 = {fast}u;\nconst ROPE: bool = {};\n", outs.rope));
            // The tail's first row: the last output's (matmul_store's bounds).
            s.push_str(&format!(
                "const TAIL: u32 = {}u;\nconst TAIL_AT: u32 = {}u;\n",
                outs.tail,
                7 + outs.n
            ));
            // Bound after the outputs and biases: (wide units) the activations as 16-byte
            // words where they are bound, and the weights again as 16-byte words; then the
            // prologue's buffers, then the KV caches of the RoPE store.
            let xv = 3 + outs.n as usize * if outs.bias { 2 } else { 1 };
            let bound = input == Input::Quantized;
            let wv = xv + usize::from(bound);
            let extras = if fast == 0 { xv } else { wv + 1 };
            let kc = extras + input.extra_bindings();
            let tail = match k {
                Kernel::MatmulIdVec(_, _, tail, _) => tail,
                _ => IdTail::Off,
            };
            // An expert matmul's ids are bound after the activations (then a sum tail's
            // buffers).
            if let Kernel::MatmulIdVec(..) = k {
                s.push_str(&EXPERT_SLOTS.replace("IDS", &kc.to_string()));
                s.push_str(MATMUL_ID_VEC);
                // Row r of slot s to its output: rows from prm[4] on to the second (bound at 4).
                // (Stored atomically where a tail's last workgroup reads them.)
                let (ys_ty, put) = match tail {
                    IdTail::Off => ("array<f32>", "BUF[IDX] = v;"),
                    _ => ("array<atomic<u32>>", "atomicStore(&BUF[IDX], bitcast<u32>(v));"),
                };
                let put = |b: &str, i: &str| put.replace("BUF", b).replace("IDX", i);
                s.push_str(&if outs.n == 1 {
                    format!(
                        "fn store_out(s: u32, r: u32, v: f32) {{\n    {}\n}}\n",
                        put("ys", "s * prm[4] + r")
                    )
                } else {
                    format!(
                        "@group(0) @binding(4) var<storage, read_write> ys1: {ys_ty};\n\
                         fn store_out(s: u32, r: u32, v: f32) {{\n    if r >= prm[4] {{\n        {}\n    \
                         }} else {{\n        {}\n    }}\n}}\n",
                        put("ys1", "s * prm[4] + r - prm[4]"),
                        put("ys", "s * prm[4] + r")
                    )
                });
            } else {
                s.push_str(VEC_DENSE);
            }
            if outs.route {
                s.push_str(&ROUTE_TAIL.replace("RI", &kc.to_string()).replace("RJ", &(kc + 1).to_string()));
                s.push_str(&LAST_DONE.replace("DC", &(kc + 2).to_string()));
            } else if outs.norm_rope {
                // The caches, the q and k norms' weights, the counters.
                let at = |i: usize| (kc + i).to_string();
                s.push_str(
                    &NORM_ROPE_TAIL
                        .replace("KC", &at(0))
                        .replace("VC", &at(1))
                        .replace("HQ", &at(2))
                        .replace("HK", &at(3)),
                );
                s.push_str(&LAST_DONE.replace("DC", &at(4)));
            } else if tail == IdTail::Sum {
                s.push_str(
                    &SUM_TAIL.replace("SW", &(kc + 1).to_string()).replace("SO", &(kc + 2).to_string()),
                );
                s.push_str(&LAST_DONE.replace("DC", &(kc + 3).to_string()));
            } else if tail == IdTail::Glu {
                // The GLU's output, the quantized activations, the GELU table, the counters.
                s.push_str(
                    &GLU_TAIL.replace("GO", &(kc + 1).to_string()).replace("GQ", &(kc + 2).to_string()),
                );
                s.push_str(&QUANTIZE_CORE.replace("xq[", "gq["));
                s.push_str(&GLU.replace("GT", &(kc + 3).to_string()));
                s.push_str(&LAST_DONE.replace("DC", &(kc + 4).to_string()));
            } else {
                s.push_str("fn matmul_tail(wid: vec3<u32>, nwg: vec3<u32>, li: u32, t0: u32, tt: u32) {}\n");
            }
            if outs.rope {
                s.push_str(
                    &ROPE_EPILOGUE.replace("KC", &kc.to_string()).replace("VC", &(kc + 1).to_string()),
                );
            } else {
                s.push_str(
                    "fn rope_row(l: u32) -> u32 {\n    return l;\n}\n\
                     fn rope_store(t: u32, l0: u32, slot: u32, lid: u32, v: f32, n_rows: u32) {}\n",
                );
            }
            if fast == 0 {
                s.push_str(
                    "struct WUnit {\n    a: vec4<u32>,\n}\n\
                     struct XUnit {\n    a: vec4<u32>,\n}\n\
                     fn fast_w(f: u32, base: u32, u: u32) -> WUnit {\n    return WUnit(vec4<u32>());\n}\n\
                     fn fast_xl(f: u32, u: u32, t: u32, k: u32) -> XUnit {\n    return XUnit(vec4<u32>());\n}\n\
                     fn fast_dot(f: u32, w: WUnit, x: XUnit) -> f32 {\n    return 0.0;\n}\n\
                     fn row_bytes(f: u32, k: u32) -> u32 {\n    return 0u;\n}\n",
                );
            } else {
                s.push_str(&DOT_VEC.replace("WV", &wv.to_string()));
            }
            // The prologue's parameters after the RoPE store's or the route's.
            let pp = if outs.rope {
                18
            } else if outs.route {
                11 + ROUTE_WORDS
            } else if outs.norm_rope {
                11 + NORM_ROPE_WORDS
            } else {
                11
            };
            s.push_str(&matmul_input(input, rg * npr, xv, extras, pp, fast != 0, subgroups));
            if outs.norm_rope {
                // The norm's float-float sum over the workgroup (a norm prologue may have
                // brought it).
                if !s.contains("const NT:") {
                    s.push_str("const NT: u32 = NPR * RG;\n");
                }
                if !s.contains("fn ff_total(") {
                    s.push_str(FF_SUM);
                    s.push_str(if subgroups { FF_TOTAL_SUBGROUP } else { FF_TOTAL_TREE });
                }
            }
            s.push_str(if subgroups { ROW_SUM_SUBGROUP } else { ROW_SUM_TREE });
            if subgroups {
                s.push_str(SUBGROUP_RUNS);
            }
            let src = if outs.route || outs.norm_rope || tail != IdTail::Off {
                src.replace(
                    "@group(0) @binding(3) var<storage, read_write> ys: array<f32>;",
                    "@group(0) @binding(3) var<storage, read_write> ys: array<atomic<u32>>;",
                )
            } else {
                src.to_string()
            };
            src.replace("@workgroup_size(256)", &format!("@workgroup_size({})", npr * rg))
        }
        _ => src.to_string(),
    };
    let input = match k {
        Kernel::QuantizeGlu => QUANTIZE_GLU_IN,
        Kernel::RmsNorm(_) => NORM_IN,
        Kernel::AddRmsNorm(_) => NORM_ADD_IN,
        _ => QUANTIZE_IN,
    };
    let input = input.replace("XS", "2").replace("YR", "4").replace("XO", "5").replace("P_ADD", "4u");
    let mut src = src.replace("//INPUT", &input);
    match k {
        // The quantized rows are bound after the norm's buffers (w, x, out; y, new x).
        Kernel::RmsNorm(true) => src.push_str(&NORM_QUANTIZE.replace("XQ", "4")),
        Kernel::AddRmsNorm(true) => src.push_str(&NORM_QUANTIZE.replace("XQ", "6")),
        Kernel::RmsNorm(false) | Kernel::AddRmsNorm(false) => {
            src.push_str("fn norm_tail(w: u32, v: vec4<f32>, live: bool, lid: u32) {}\n")
        }
        Kernel::KvRotate(true) => src.push_str(
            "@group(0) @binding(3) var<storage, read_write> xq: array<u32>;\n\
             fn rot_tail(w: u32, v: vec4<f32>, live: bool, lid: u32) {\n    \
             quantize_word(w, v, live, lid, prm[8], prm[0], prm[1]);\n}\n",
        ),
        Kernel::KvRotate(false) => {
            src.push_str("fn rot_tail(w: u32, v: vec4<f32>, live: bool, lid: u32) {}\n")
        }
        // The quantized rows are bound after the attention's output.
        // (A block's counters after them.)
        Kernel::Attention(AttnTail::Head)
        | Kernel::AttnDirect(AttnTail::Head)
        | Kernel::AttnCoop(true, _) => src.push_str(&ATTN_QUANTIZE.replace("XQ", "5")),
        Kernel::AttnCombine(AttnTail::Head) => src.push_str(&ATTN_QUANTIZE.replace("XQ", "3")),
        Kernel::Attention(AttnTail::Block) | Kernel::AttnDirect(AttnTail::Block) => {
            src.push_str(&ATTN_BLOCK_QUANTIZE.replace("XQ", "5"));
            src.push_str(&LAST_DONE.replace("DC", "6"))
        }
        Kernel::AttnCombine(AttnTail::Block) => {
            src.push_str(&ATTN_BLOCK_QUANTIZE.replace("XQ", "3"));
            src.push_str(&LAST_DONE.replace("DC", "4"))
        }
        Kernel::Attention(AttnTail::Off)
        | Kernel::AttnCoop(false, _)
        | Kernel::AttnCombine(AttnTail::Off)
        | Kernel::AttnPartial
        | Kernel::AttentionKv(..)
        | Kernel::AttnDirect(AttnTail::Off) => src.push_str(
            "fn attn_tail(w: u32, live: bool, lid: u32) {}\n\
             fn attn_tail_of(w: u32, v: vec4<f32>, live: bool, lid: u32) {}\n",
        ),
        _ => {}
    }
    // (The vec matmul's prologue, in `s`, quantizes too.)
    if (src.contains("quantize_word(") || s.contains("quantize_word(")) && !s.contains("fn quantize_word(") {
        s.push_str(QUANTIZE_CORE);
    }
    if src.contains("glu_value(") {
        // The GELU table is bound after the kernel's other buffers.
        s.push_str(&GLU.replace("GT", if k == Kernel::Gelu { "2" } else { "4" }));
    }
    if src.contains("kv_quantize(") {
        if !s.contains("kv_iq4nl") {
            s.push_str(IQ4NL_TABLE);
        }
        s.push_str(KV_QUANT);
    }
    if src.contains("hadamard(") || src.contains("kv_quantize(") {
        s.push_str(HADAMARD);
    }
    if src.contains("alibi_bias(") {
        s.push_str(ALIBI);
    }
    if src.contains("rope_pair(") {
        s.push_str(ROPE_CORE);
    }
    if src.contains("rope_rot(") || s.contains("rope_rot(") {
        s.push_str(ROPE_ROT);
    }
    if src.contains("route_token(") || s.contains("route_token(") {
        s.push_str(ROUTE);
    }
    if s.contains("exp_acc(")
        || src.contains("exp_acc(")
        || src.contains("softcap_score(")
        || src.contains("expf_ggml(")
    {
        s.push_str(EXP);
    }
    let body = if subgroups {
        src.replace("/*SG*/", ", @builtin(subgroup_invocation_id) sgi: u32")
            .replace("/*SGI*/", "g_sgi = sgi;")
    } else {
        src
    };
    s.push_str(&body);
    set_opaque_flag(&s)
}

/// Inserts `g_opaque = ...` (common.wgsl's `nc`) as the first statement of every entry point.
fn set_opaque_flag(src: &str) -> String {
    let mut out = String::with_capacity(src.len() + 256);
    let mut rest = src;
    while let Some(at) = rest.find("@compute") {
        let body = at + rest[at..].find("{\n").expect("an entry point has a body") + 2;
        out.push_str(&rest[..body]);
        out.push_str("    g_opaque = prm[0] == 0xffffffffu;\n");
        rest = &rest[body..];
    }
    out.push_str(rest);
    out
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
                let desc = wgpu::ShaderModuleDescriptor {
                    label: Some(&label),
                    source: wgpu::ShaderSource::Wgsl(assemble(k, ctx.subgroups, ctx.fused_fma).into()),
                };
                let mut checks = wgpu::ShaderRuntimeChecks::checked();
                // Every loop of these kernels is bounded by its parameters; naga's added loop
                // counters would keep drivers from unrolling and batching loads.
                checks.force_loop_bounding = false;
                // SAFETY: the kernels are ours (no infinite loops); bounds checks stay on.
                let module = unsafe { ctx.device.create_shader_module_trusted(desc, checks) };
                Arc::new(ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&label),
                    layout: None,
                    module: &module,
                    entry_point: Some(k.source().1),
                    // Every kernel writes its workgroup memory before reading it: skip the
                    // zero fill WGSL otherwise requires (a serial store loop on some drivers).
                    compilation_options: wgpu::PipelineCompilationOptions {
                        zero_initialize_workgroup_memory: false,
                        ..Default::default()
                    },
                    cache: ctx.pipeline_cache.as_ref().map(|c| &c.0),
                }))
            })
            .clone()
    }
}
