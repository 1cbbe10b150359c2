// Prompt attention on cooperative matrices (tensor cores), flash-attention style. A
// workgroup takes BQ = 16 x NSG query tokens of one head, each of its NSG subgroups 16 of
// them, their queries (f16, times each token's multiplier) staged through workgroup memory
// to tiles each subgroup holds in registers for the whole kernel. Keys and values go
// through workgroup memory in tiles of BK positions, f16 as the cache holds them, their
// loads issued a step before they are staged: a tile's values while its scores are
// computed, the next tile's keys while its weights are taken and multiplied. Per tile a
// subgroup computes its 16 x BK scores S = Q·Kᵀ (16x16x16 f16 products into f32), then its
// invocations (a few per query row) scale, soft-cap and mask them (the keys first..last its
// token sees: causal, sliding window) and take the online softmax's weights P = exp(S -
// m), rounded to f16, which the values multiply into f32 accumulators O += P·V held in
// registers. The reference max m is raised lazily: only where a tile's scores pass it by
// more than RESCALE (the weights then stay below e^RESCALE, well within f16) are a row's
// accumulators and sum rescaled, through workgroup memory, so most tiles leave them in
// registers. coop_attn.rs writes the matrix statements out (`//OINIT`, `//QK`,
// `//RESCALE`, `//PV`, `//OUT`), on cooperative matrices or emulated. Sums are f32 in the
// tensor cores' order and the weights f16: results differ from the portable kernels by
// rounding, and a token's may depend on which tokens share its tile (no batch invariance:
// `batch_invariant` keeps the portable kernels). prm as attention.wgsl's (ALiBi and
// quantized caches stay on the portable kernels); a workgroup's tokens belong to one
// sequence (mod.rs checks), whose block table is its first token's. `attn_tail`
// (kernels.rs) is empty, or quantizes the output for the next matmul.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> qs: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> kc: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> vc: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> ys: array<f32>;

// A staged row: HD values and 8 of padding, in 4-value words (rows 16-byte aligned, as
// the tile loads require; their rows fall in distinct banks).
const SR: u32 = HD / 4u + 2u;
// A row of weights: BK values and 8 of padding.
const PR: u32 = BK / 4u + 2u;
// (SS, a row of scores: BK values and coop_attn.rs's padding, rows 16-byte aligned.)
// Sixteen-byte words of a tile of keys (or values) each invocation loads.
const KVW: u32 = (BK * HD / 8u + WGS - 1u) / WGS;
// How far a tile's scores may pass the reference max before the accumulators are
// rescaled (the weights stay below e^8 ~ 2981, and the f32 sums lose nothing).
const RESCALE: f32 = 8.0;

// The queries (a row per token), and each tile's keys, then its values (a row per position).
var<workgroup> qsv: array<vec4<f16>, BQ * SR>;
var<workgroup> kvs: array<vec4<f16>, BK * SR>;
// Per subgroup, and one more for subgroups past NSG (adapters running subgroups smaller
// than their largest; their results are dropped): its 16 x BK scores in f32, each
// accumulator tile on its way to a rescale or the output; its weights in f16; per query
// row the reference max, the sum of weights and this tile's rescale factor.
var<workgroup> ss: array<f32, (NSG + 1u) * 16u * SS>;
var<workgroup> ps: array<vec4<f16>, (NSG + 1u) * 16u * PR>;
var<workgroup> rm: array<f32, (NSG + 1u) * 16u>;
var<workgroup> rl: array<f32, (NSG + 1u) * 16u>;
var<workgroup> ra: array<f32, (NSG + 1u) * 16u>;
// Zeros the accumulators start from.
var<workgroup> zs: array<f32, 256>;
// Whether some row of this tile raised its reference max (in x). Sixteen bytes, as every
// workgroup variable here: whatever order a driver lays them out in, each then starts
// 16-byte aligned, which the tile loads and stores require.
var<workgroup> raised: vec4<u32>;

// A tile's keys and values on their way from the cache to `kvs`.
var<private> kr: array<vec4<u32>, KVW>;
var<private> vr: array<vec4<u32>, KVW>;

// The subgroup's rows of a tile of keys from k0: scores scaled, soft-capped and masked in
// place, each row's reference max raised where the tile passes it by more than RESCALE,
// the weights to `ps` in f16, their sum into the row's. A row is taken by `parts`
// invocations (as many as the subgroup has beyond 16, up to one per 4 keys), each for
// `width` of its keys, their maxima and sums combined by shuffles; in subgroups of fewer
// than 16 invocations, by one invocation, in turns. Each invocation starts at its own
// offset into its keys, (r / 4) % 4, so a subgroup of 32 reads its 32 scores at a time from
// distinct banks (rows of scores are 4 banks apart).
fn softmax_rows(k0: u32, t0: u32, so: u32, po: u32, ro: u32, sgi: u32, sgn: u32) {
    let neg_inf = bitcast<f32>(0xff800000u);
    let n_tok = prm[0];
    let scale = pf(4u);
    let cap = pf(10u);
    let rows = min(sgn, 16u);
    let parts = min(sgn / rows, BK / 4u);
    let width = BK / parts;
    let part = (sgi / rows) % parts;
    let c0 = part * width;
    for (var r0 = 0u; r0 < 16u; r0 = r0 + rows) {
        let r = r0 + sgi % rows;
        let ti = prm[6] + 4u * min(t0 + r, n_tok - 1u);
        let last = prm[ti];
        let first = prm[ti + 1u];
        let row = so + r * SS;
        let rot = (r / 4u) % 4u;
        // The row's state, read by every part before the shuffles (after them, part 0
        // writes it).
        var m = rm[ro + r];
        let l0 = rl[ro + r];
        var mx = neg_inf;
        for (var i = 0u; i < width; i = i + 1u) {
            let c = c0 + (i + rot) % width;
            let p = k0 + c;
            var s = neg_inf;
            if p >= first && p <= last {
                s = softcap_score(ss[row + c] * scale, cap);
            }
            ss[row + c] = s;
            mx = max(mx, s);
        }
        for (var o = rows; o < rows * parts; o = o * 2u) {
            mx = max(mx, subgroupShuffleXor(mx, o));
        }
        var alpha = 1.0;
        if mx > m + RESCALE {
            // (The row's first keys: its accumulators are still zeros, nothing to rescale.)
            if m > neg_inf {
                alpha = exp(m - mx);
                raised.x = 1u;
            } else {
                alpha = 0.0;
            }
            m = mx;
        }
        var l = 0.0;
        for (var i = 0u; i < width; i = i + 1u) {
            let c = c0 + (i + rot) % width;
            let s = ss[row + c];
            let w = f16(select(0.0, exp(s - m), s > neg_inf));
            ps[po + r * PR + c / 4u][c % 4u] = w;
            l = l + f32(w);
        }
        for (var o = rows; o < rows * parts; o = o * 2u) {
            l = l + subgroupShuffleXor(l, o);
        }
        if part == 0u {
            rm[ro + r] = m;
            ra[ro + r] = alpha;
            rl[ro + r] = l0 * alpha + l;
        }
    }
}

// The accumulator tile in `ss` at so, each row times its rescale factor.
fn rescale_tile(so: u32, ro: u32, sgi: u32, sgn: u32) {
    for (var e = sgi; e < 256u; e = e + sgn) {
        ss[so + e] = ss[so + e] * ra[ro + e / 16u];
    }
}

// Accumulator tile j in `ss` at so to the output, each row divided by its sum (rows of
// tokens tb.., past the batch or of subgroups past NSG not stored).
fn out_tile(j: u32, so: u32, ro: u32, sgi: u32, sgn: u32, live: bool, tb: u32, h: u32) {
    for (var e = sgi; e < 256u; e = e + sgn) {
        let t = tb + e / 16u;
        if live && t < prm[0] {
            let l = rl[ro + e / 16u];
            ys[(t * prm[1] + h) * HD + 16u * j + e % 16u] = ss[so + e] * select(0.0, 1.0 / l, l != 0.0);
        }
    }
}

// Issues the loads of the tile's keys (or values) from k0, 16 bytes an invocation at a
// time, into `kr` (`vr`); positions past kmax repeat it (their scores are masked).
fn fetch_kv(is_v: bool, k0: u32, kmax: u32, tab: u32, kvh: u32, li: u32) {
    let slot_w = prm[2] * HD / 8u;
    let head_w = HD / 8u;
    let bs = prm[5];
    for (var q = 0u; q < KVW; q = q + 1u) {
        let i = min(li + q * WGS, BK * head_w - 1u);
        let p = min(k0 + i / head_w, kmax);
        let at = (prm[tab + p / bs] * bs + p % bs) * slot_w + kvh * head_w + i % head_w;
        if is_v {
            vr[q] = vc[at];
        } else {
            kr[q] = kc[at];
        }
    }
}

// The fetched keys (or values) to `kvs` in f16.
fn put_kv(is_v: bool, li: u32) {
    let head_w = HD / 8u;
    for (var q = 0u; q < KVW; q = q + 1u) {
        let i = li + q * WGS;
        if i < BK * head_w {
            let w = select(kr[q], vr[q], is_v);
            let at = (i / head_w) * SR + 2u * (i % head_w);
            kvs[at] = f16x4(w.x, w.y);
            kvs[at + 1u] = f16x4(w.z, w.w);
        }
    }
}

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_id) sgid: u32, @builtin(subgroup_invocation_id) sgi: u32,
        @builtin(subgroup_size) sgn: u32) {
    let n_tok = prm[0];
    let n_head = prm[1];
    let h = wid.y;
    let kvh = h / (n_head / prm[2]);
    let t0 = wid.x * BQ;
    // This subgroup's rows. Where the adapter runs subgroups smaller than its largest (the
    // workgroup is sized for that), the extra ones repeat the last rows into a slot of
    // their own and store nothing: every subgroup runs the same matrix operations, in
    // uniform control flow.
    let sg = min(sgid, NSG - 1u);
    let live = sgid < NSG;
    let slot = select(NSG, sg, live);
    let so = slot * 16u * SS;
    let po = slot * 16u * PR;
    let ro = slot * 16u;
    let tb = t0 + 16u * sg;
    // The keys any of the block's tokens sees, in its sequence's table.
    var kmin = 0xffffffffu;
    var kmax = 0u;
    for (var i = 0u; i < BQ; i = i + 1u) {
        let ti = prm[6] + 4u * min(t0 + i, n_tok - 1u);
        kmax = max(kmax, prm[ti]);
        kmin = min(kmin, prm[ti + 1u]);
    }
    let tab = prm[7] + prm[prm[6] + 4u * t0 + 2u];
    // The queries to rows of `qsv` in f16 (tokens past the batch repeat its last), the
    // rows' state, the zeros.
    for (var i = li; i < BQ * HD / 4u; i = i + WGS) {
        let r = i / (HD / 4u);
        let t = min(t0 + r, n_tok - 1u);
        let qm = pf(prm[6] + 4u * t + 3u);
        qsv[r * SR + i % (HD / 4u)] = vec4<f16>(qs[(t * n_head + h) * (HD / 4u) + i % (HD / 4u)] * qm);
    }
    for (var i = li; i < (NSG + 1u) * 16u; i = i + WGS) {
        rm[i] = bitcast<f32>(0xff800000u);
        rl[i] = 0.0;
    }
    for (var i = li; i < 256u; i = i + WGS) {
        zs[i] = 0.0;
    }
    workgroupBarrier();
    let qb = 16u * sg * SR;
//OINIT
    fetch_kv(false, kmin, kmax, tab, kvh, li);
    for (var k0 = kmin; k0 <= kmax; k0 = k0 + BK) {
        put_kv(false, li);
        if li == 0u {
            raised = vec4<u32>();
        }
        fetch_kv(true, k0, kmax, tab, kvh, li);
        workgroupBarrier();
//QK
        workgroupBarrier();
        // The next tile's keys on their way; the values replace the keys (all read now)
        // while the weights are taken; the uniform load's barrier makes both visible to
        // the products.
        fetch_kv(false, k0 + BK, kmax, tab, kvh, li);
        put_kv(true, li);
        softmax_rows(k0, tb, so, po, ro, sgi, sgn);
        if workgroupUniformLoad(&raised).x != 0u {
//RESCALE
        }
//PV
        workgroupBarrier();
    }
//OUT
    // The output quantized for the next matmul, a word an invocation (a quantization
    // block is eight neighbouring invocations: HD / 4 and WGS are multiples of 8).
    let nw = BQ * HD / 4u;
    for (var i = 0u; i < nw; i = i + WGS) {
        let idx = i + li;
        let t = t0 + idx / (HD / 4u);
        let w = (min(t, n_tok - 1u) * n_head + h) * (HD / 4u) + idx % (HD / 4u);
        attn_tail(w, idx < nw && t < n_tok, li);
    }
}
