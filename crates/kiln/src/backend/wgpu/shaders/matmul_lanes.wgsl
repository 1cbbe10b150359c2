// Decode/prefill matmul for the 32-value block formats on hardware GPUs: a workgroup takes
// RW weight rows; each invocation owns one lane chain of one row, exactly the CPU's
// (dot.wgsl): acc_l = fma(d_w * d_x, lane sum, acc_l) block after block, then hsum8.
// The rows' blocks are staged CB at a time into workgroup memory with coalesced word
// loads, so the chains run on data already at hand and many rows are in flight.
// prm: n_rows, k, n_tok, row_size, out_stride, col0, x scales word, x sums word.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> xq: array<u32>;
@group(0) @binding(3) var<storage, read_write> ys: array<f32>;

const RW: u32 = 16u;
const TT: u32 = 4u;
// Words of one row's chunk (CB blocks of BB bytes; CB * BB is a multiple of 4).
const CW: u32 = CB * BB / 4u;
// Words each of the 128 invocations stages per chunk.
const PER: u32 = (RW * CW + 127u) / 128u;

var<workgroup> sw: array<u32, RW * CW>;
var<workgroup> racc: array<f32, 128>;
// The chunk's activation words and block scales (and Q8_1 sums) of the tile's tokens.
var<workgroup> sx: array<u32, 8u * CB * TT>;
var<workgroup> sxd: array<f32, CB * TT>;
var<workgroup> sxs: array<f32, CB * TT>;
var<workgroup> rsum: array<f32, RW>;

fn sbyte_at(o: u32) -> u32 {
    return (sw[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

fn s16(o: u32) -> f32 {
    return unpack2x16float(sw[o >> 2u] >> ((o & 2u) * 8u)).x;
}

fn s32(o: u32) -> u32 {
    let s = (o & 3u) * 8u;
    if s == 0u {
        return sw[o >> 2u];
    }
    return (sw[o >> 2u] >> s) | (sw[(o >> 2u) + 1u] << (32u - s));
}

// Lane l's integer sum of the block at shared byte `o` with activation word x.
fn lane_sum(o: u32, l: u32, x: u32) -> i32 {
    if QTYPE == 8u {
        return dot4i8(s32(o + 2u + 4u * l), x);
    }
    let hi = l >> 2u;
    let w = (s32(o + QS + 4u * (l & 3u)) >> (4u * hi)) & 0x0f0f0f0fu;
    if QTYPE == 1u {
        return dot4i8(w, x);
    }
    if QTYPE == 5u {
        let qh = s32(o + 2u);
        let q = w | spread4((qh >> (16u * hi + 4u * (l & 3u))) & 15u);
        return dot4i8(q, x) - 16 * xsum4(x);
    }
    return dot4i8(w, x) - 8 * xsum4(x);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let n_rows = prm[0];
    let k = prm[1];
    let row_size = prm[3];
    let r0 = (wid.y * nwg.x + wid.x) * RW;
    if r0 >= n_rows {
        return;
    }
    let rl = lid / 8u;
    let l = lid % 8u;
    let r = r0 + rl;
    let live = r < n_rows;
    let t0 = wid.z * TT;
    let tt = min(TT, prm[2] - t0);
    let nb = k / 32u;
    let n_words = arrayLength(&wq);
    var acc: array<f32, TT>;
    var summs: array<f32, TT>;
    for (var c0 = 0u; c0 < nb; c0 = c0 + CB) {
        // Stage RW rows x CB blocks (coalesced: neighbouring invocations, neighbouring words).
        // All of an invocation's loads are issued before its stores (latency overlapped).
        var tmp: array<u32, PER>;
        for (var q = 0u; q < PER; q = q + 1u) {
            let i = lid + 128u * q;
            let row = r0 + i / CW;
            let g = ((row * row_size + c0 * BB) >> 2u) + i % CW;
            if i < RW * CW && row < n_rows && g < n_words {
                tmp[q] = wq[g];
            }
        }
        for (var q = 0u; q < PER; q = q + 1u) {
            let i = lid + 128u * q;
            if i < RW * CW {
                sw[i] = tmp[q];
            }
        }
        for (var i = lid; i < 8u * CB * TT; i = i + 128u) {
            let t = i / (8u * CB);
            let w = i % (8u * CB);
            if t < tt && c0 + w / 8u < nb {
                sx[i] = xq[(t0 + t) * k / 4u + 8u * c0 + w];
            }
        }
        for (var i = lid; i < CB * TT; i = i + 128u) {
            let t = i / CB;
            let b = i % CB;
            if t < tt && c0 + b < nb {
                sxd[i] = xd((t0 + t) * nb + c0 + b);
                if HAS_MIN {
                    sxs[i] = xs1((t0 + t) * nb + c0 + b);
                }
            }
        }
        workgroupBarrier();
        let n = min(CB, nb - c0);
        if live {
            for (var b = 0u; b < n; b = b + 1u) {
                let o = rl * CW * 4u + b * BB;
                let dw = s16(o);
                for (var t = 0u; t < TT; t = t + 1u) {
                    if t >= tt {
                        break;
                    }
                    let x = sx[t * 8u * CB + 8u * b + l];
                    let d = dw * sxd[t * CB + b];
                    acc[t] = fma_x(d, f32(lane_sum(o, l, x)), acc[t]);
                    if HAS_MIN && l == 0u {
                        summs[t] = summs[t] + nc(s16(o + 2u) * sxs[t * CB + b]);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    for (var t = 0u; t < tt; t = t + 1u) {
        racc[lid] = acc[t];
        workgroupBarrier();
        if live && l == 0u {
            var a: array<f32, 8>;
            for (var i = 0u; i < 8u; i = i + 1u) {
                a[i] = racc[lid + i];
            }
            var v = hsum8(a);
            if HAS_MIN {
                v = v + summs[t];
            }
            ys[(t0 + t) * prm[4] + prm[5] + r] = v;
        }
        workgroupBarrier();
    }
}
