// Causal attention over the f16 KV cache (GQA, sliding window, block tables): one
// workgroup per (token, head), keys in tiles of 64 with an online softmax (flash style).
// The arithmetic is the CPU backend's, step for step: queries rounded to f16, q·k in the
// CPU's 32-chain f32 dot order, libm-faithful exp, products rounded before sums.
// head_dim <= 256, a multiple of 8.
// prm: n_tok, n_head, n_head_kv, head_dim, scale, block_size, tok_off, tab_off;
// per token at tok_off: pos, first_pos, table offset (into tab_off) of its sequence.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> qs: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<u32>;
@group(0) @binding(3) var<storage, read> vc: array<u32>;
@group(0) @binding(4) var<storage, read_write> ys: array<f32>;

var<workgroup> q16: array<f32, 256>;
var<workgroup> pj: array<f32, 64>;
var<workgroup> bj: array<u32, 64>;

fn kv_at(buf_is_v: bool, e: u32) -> f32 {
    var w: u32;
    if buf_is_v {
        w = vc[e >> 1u];
    } else {
        w = kc[e >> 1u];
    }
    return unpack2x16float(w >> ((e & 1u) * 16u)).x;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32 /*SG*/) {
    /*SGI*/
    let th = wid.y * nwg.x + wid.x;
    let n_head = prm[1];
    if th >= prm[0] * n_head {
        return;
    }
    let t = th / n_head;
    let h = th % n_head;
    let hd = prm[3];
    let kvh = h / (n_head / prm[2]);
    let kv_dim = prm[2] * hd;
    let scale = pf(4u);
    let bs = prm[5];
    let ti = prm[6] + 3u * t;
    let pos = prm[ti];
    let first = prm[ti + 1u];
    let tab = prm[7] + prm[ti + 2u];
    for (var d = lid; d < hd; d = d + WG) {
        q16[d] = f16r(qs[th * hd + d]);
    }
    workgroupBarrier();
    // Scores are computed a tile at a time (one key per invocation); the softmax update
    // then walks the tile's keys in order with an f32 accumulator, as kiln's CPU
    // backend does (same order for every batch: batch invariance).
    var m = bitcast<f32>(0xff800000u);
    var ssum = 0.0;
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var p0 = first; p0 <= pos; p0 = p0 + WG) {
        let p = p0 + lid;
        if p <= pos {
            let slot = prm[tab + p / bs] * bs + p % bs;
            let base = slot * kv_dim + kvh * hd;
            // The CPU's dot_f32: chain c takes elements i with i % 32 == c (a tail of
            // whole eights goes on chains 0..7), then the 4x8 registers are combined.
            var c: array<f32, 32>;
            let n32 = hd / 32u * 32u;
            for (var i = 0u; i < n32; i = i + 32u) {
                for (var l = 0u; l < 32u; l = l + 2u) {
                    let kk = unpack2x16float(kc[(base + i + l) >> 1u]);
                    c[l] = fma_x(q16[i + l], kk.x, c[l]);
                    c[l + 1u] = fma_x(q16[i + l + 1u], kk.y, c[l + 1u]);
                }
            }
            for (var i = n32; i + 8u <= hd; i = i + 8u) {
                for (var l = 0u; l < 8u; l = l + 2u) {
                    let kk = unpack2x16float(kc[(base + i + l) >> 1u]);
                    c[l] = fma_x(q16[i + l], kk.x, c[l]);
                    c[l + 1u] = fma_x(q16[i + l + 1u], kk.y, c[l + 1u]);
                }
            }
            var s8: array<f32, 8>;
            for (var l = 0u; l < 8u; l = l + 1u) {
                s8[l] = (c[l] + c[8u + l]) + (c[16u + l] + c[24u + l]);
            }
            pj[lid] = hsum8(s8) * scale;
            bj[lid] = base;
        }
        workgroupBarrier();
        let nv = min(WG, pos - p0 + 1u);
        for (var j = 0u; j < nv; j = j + 1u) {
            let sc = pj[j];
            var ms = 1.0;
            var vs = 1.0;
            if sc > m {
                ms = exp_acc(m - sc);
                m = sc;
                for (var i = 0u; i < 4u; i = i + 1u) {
                    acc[i] = nc(acc[i] * ms);
                }
            } else {
                vs = exp_acc(sc - m);
            }
            for (var i = 0u; i < 4u; i = i + 1u) {
                let d = lid + i * WG;
                if d < hd {
                    acc[i] = acc[i] + nc(kv_at(true, bj[j] + d) * vs);
                }
            }
            ssum = nc(ssum * ms) + vs;
        }
        workgroupBarrier();
    }
    let inv = select(0.0, 1.0 / ssum, ssum != 0.0);
    for (var i = 0u; i < 4u; i = i + 1u) {
        let d = lid + i * WG;
        if d < hd {
            ys[th * hd + d] = acc[i] * inv;
        }
    }
}
