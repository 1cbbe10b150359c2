// out[t, col0 + r] = dot(w[r], x[t]) on cooperative matrices (tensor cores), for prompt
// chunks and large batched decode steps. A workgroup takes BM tokens and BN weight rows;
// each stage dequantizes one 32-value chunk of each of its rows (dequant.wgsl's
// fetch_chunk, unpack_chunk) into workgroup memory as f16, beside the tokens' f16 activations (quantize
// mode 4), and each of the NSG = SGM x SGN subgroups multiplies
// its block of FM x FN 16x16 tiles into f32 accumulators held in registers (kernels.rs
// writes those statements out: `//MMA`, `//STORE`). Stages are double-buffered in
// workgroup memory, one barrier per stage, and their loads run AHEAD stages ahead
// (coop.rs): while a stage's products run, the next stage's words are dequantized into the
// other buffer and the loads of the stage AHEAD after this one are in flight.
// Small batches split k over n_splits() workgroups (wid.z) where the rows alone would give few
// workgroups: each writes its partial sums (`store` then writes them to a scratch buffer,
// kernels.rs) and coop_reduce.wgsl adds them up in order.
// Sums are f32 in the tensor cores' order: results differ from the integer paths by
// rounding (f16 activations instead of 8-bit ones), and a token's sums may depend on how
// many tokens share its tile (no batch invariance: `batch_invariant` turns this path off).
// prm: n_rows, k, n_tok, row_size, out_stride, col0, -, -, first row in the weight buffer,
// output row boundaries (kernels.rs matmul_store).
// A workgroup's tile comes from `tile` (kernels.rs COOP_DENSE: token tiles along x, row
// tiles along y; matmul_id_coop.wgsl: an expert's next tile of slots), its tokens' rows of
// activations from `x_row` and its results go out through `store`.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
// The weights and the f16 activations in 16-byte words (wide loads: dequant.wgsl).
@group(0) @binding(1) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> xh: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> ys: array<f32>;

// A staged row: 32 values and 8 of padding, in 4-value words (80 bytes: the tile loads'
// sixteen rows fall in distinct banks, and rows stay 16-byte aligned as they require).
const SV: u32 = 10u;
var<workgroup> xs: array<vec4<f16>, 2u * BM * SV>;
var<workgroup> ws: array<vec4<f16>, 2u * BN * SV>;
// A 16x16 f32 tile per subgroup: zeros to start the accumulators, then each result tile
// on its way to `store`.
var<workgroup> cs: array<f32, NSG * 256u>;

// The k split this workgroup sums (wid.z; 0 without a split).
var<private> g_split: u32;

// The fetched stages' activations in registers (set d's NX words of 8 values from d * NX,
// AHEAD sets; their weight rows' words are in dequant.wgsl's `raw`, set d's rows in slots
// d * NW..).
var<private> xst: array<vec4<u32>, AHEAD * NX>;

// The tile's first row in the weight buffer, and the activation rows of this invocation's
// NX token words.
var<private> g_w0: u32;
var<private> xrow: array<u32, NX>;

// The workgroup's tile, read through workgroupUniformLoad: a function's result is not
// uniform to the validator (its argument, the workgroup id, is not a builtin there), and
// the matrix operations after the early exit need uniform control flow.
var<workgroup> g_tile: vec4<u32>;

// Issues the loads of chunk c of the tile's NW rows per invocation and its tokens into
// register set d (below AHEAD, a constant at each call: the sets' indices stay static), their
// arithmetic left for `put`: invocations past the tile's rows or words repeat its last one,
// rows past the weight's end its last row, tokens past the tile's end its last token (none
// of those is stored).
fn fetch(c: u32, li: u32, r0: u32, d: u32) {
    for (var q = 0u; q < NW; q = q + 1u) {
        let i = min(li + q * WGS, BN - 1u);
        let r = min(r0 + i, prm[0] - 1u);
        fetch_chunk((g_w0 + r) * prm[3], c, d * NW + q);
    }
    for (var q = 0u; q < NX; q = q + 1u) {
        let i = min(li + q * WGS, 4u * BM - 1u);
        xst[d * NX + q] = xh[(xrow[q] * prm[1] + 32u * c) / 8u + i % 4u];
    }
}

// Dequantizes chunk c, fetched into register set d, into buffer b beside its tokens' values.
fn put(c: u32, b: u32, li: u32, d: u32) {
    for (var q = 0u; q < NW; q = q + 1u) {
        let i = li + q * WGS;
        unpack_chunk(c, d * NW + q);
        if i < BN {
            for (var j = 0u; j < 8u; j = j + 1u) {
                let v = vec4<f32>(wv[4u * j], wv[4u * j + 1u], wv[4u * j + 2u], wv[4u * j + 3u]);
                ws[(b * BN + i) * SV + j] = vec4<f16>(v + wmin);
            }
        }
    }
    for (var q = 0u; q < NX; q = q + 1u) {
        let i = li + q * WGS;
        if i < 4u * BM {
            let v = xst[d * NX + q];
            let at = (b * BM + i / 4u) * SV + 2u * (i % 4u);
            xs[at] = f16x4(v.x, v.y);
            xs[at + 1u] = f16x4(v.z, v.w);
        }
    }
}

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_id) sgid: u32, @builtin(subgroup_invocation_id) sgi: u32,
        @builtin(subgroup_size) sgn: u32) {
    let n_rows = prm[0];
    // The tile: its tokens t0..n_tok, its weight rows from r0 (of the matrix, whose first
    // row in the buffer is g_w0); none where an expert has no more slots.
    if li == 0u {
        g_tile = tile(wid);
    }
    let tl = workgroupUniformLoad(&g_tile);
    let t0 = tl.x;
    let n_tok = tl.y;
    let r0 = tl.w;
    if t0 >= n_tok {
        return;
    }
    g_w0 = tl.z;
    for (var q = 0u; q < NX; q = q + 1u) {
        let i = min(li + q * WGS, 4u * BM - 1u);
        xrow[q] = x_row(min(t0 + i / 4u, n_tok - 1u));
    }
    // This workgroup's chunks of k: c0.. (ns of them).
    let nk = prm[1] / 32u;
    let per = (nk + n_splits() - 1u) / n_splits();
    let c0 = min(wid.z * per, nk - 1u);
    let ns = min(per, nk - min(wid.z * per, nk));
    g_split = wid.z;
    // This subgroup's block of the tile. Where the adapter runs subgroups smaller than its
    // largest (the workgroup is sized for that), the extra ones repeat the last block and
    // store nothing: every subgroup runs the same matrix operations, in uniform control flow.
    let sg = min(sgid, NSG - 1u);
    let live = sgid < NSG;
    let bm = (sg % SGM) * 16u * FM;
    let bn = (sg / SGM) * 16u * FN;
    for (var i = li; i < NSG * 256u; i = i + WGS) {
        cs[i] = 0.0;
    }
    fetch(c0, li, r0, 0u);
    put(c0, 0u, li, 0u);
    workgroupBarrier();
    // The stages (coop.rs writes them out, `//STAGES`): loads of the stages after the first
    // put in flight, the accumulators started, then stage j in buffer j % 2 with its words
    // in register set j % AHEAD, as many stages a loop iteration as make both indices
    // static. Each stage first issues the loads of the stage AHEAD after it into the set
    // just dequantized (past the last stage, the last chunk again, unused), runs its
    // products, then dequantizes the next stage's words into the other buffer.
//STAGES
    // Each result tile through `cs` to `store` (biases and split outputs as the other
    // matmuls), the subgroup's invocations taking its values in turn.
    let co = sg * 256u;
//STORE
}
