// Matmul for the K superblock formats on hardware GPUs: a workgroup takes RW weight rows,
// stages CB superblocks of each into workgroup memory with coalesced word loads; eight
// invocations per row take the eight 32-value sub-blocks' exact integer sums, and one per
// row then walks the CPU's float chain (dot.wgsl): sum += (d_x * d_w) * f32(int).
// prm: n_rows, k, n_tok, row_size, out_stride, col0, x scales word, x sums word.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> xq: array<u32>;
@group(0) @binding(3) var<storage, read_write> ys: array<f32>;

const RW: u32 = 16u;
const CB: u32 = 4u;
const TT: u32 = 8u;
const CW: u32 = CB * BB / 4u;
// Words each of the 128 invocations stages per chunk.
const PER: u32 = (RW * CW + 127u) / 128u;

var<workgroup> sw: array<u32, RW * CW>;
var<workgroup> ki: array<vec2<i32>, 512>;

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

//SHARED_SUBS

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
    let j = lid % 8u;
    let r = r0 + rl;
    let live = r < n_rows;
    let t0 = wid.z * TT;
    let tt = min(TT, prm[2] - t0);
    let nb = k / 256u;
    let n_words = arrayLength(&wq);
    var sum: array<f32, 8>;
    var mins: array<f32, 8>;
    for (var c0 = 0u; c0 < nb; c0 = c0 + CB) {
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
        workgroupBarrier();
        let n = min(CB, nb - c0);
        for (var t = 0u; t < TT; t = t + 1u) {
            if t >= tt {
                break;
            }
            let tok = t0 + t;
            if live {
                for (var b = 0u; b < n; b = b + 1u) {
                    ki[(rl * CB + b) * 8u + j] = ssub_k(rl * CW * 4u + b * BB, j, tok * k / 4u + 64u * (c0 + b));
                }
            }
            workgroupBarrier();
            if live && j == 0u {
                for (var b = 0u; b < n; b = b + 1u) {
                    var s = vec2<i32>(0);
                    for (var q = 0u; q < 8u; q = q + 1u) {
                        s = s + ki[(rl * CB + b) * 8u + q];
                    }
                    let dy = xd(tok * nb + c0 + b);
                    let ds = skscale(rl * CW * 4u + b * BB);
                    sum[t] = sum[t] + nc((dy * ds.x) * f32(s.x));
                    mins[t] = mins[t] + nc((dy * ds.y) * f32(s.y));
                }
            }
            workgroupBarrier();
        }
    }
    if live && j == 0u {
        for (var t = 0u; t < TT; t = t + 1u) {
            if t >= tt {
                break;
            }
            ys[(t0 + t) * prm[4] + prm[5] + r] = sum[t] - mins[t];
        }
    }
}
