// out[t, col0 + r] = dot(w[r], x[t]) with 64 invocations per weight row (hardware GPUs),
// RG rows per workgroup (fewer, larger workgroups launch faster): a row's invocations
// compute the exact integer parts of 64 units (blocks or sub-blocks) at a time in
// parallel, then a few walk the float chains in the CPU's order (dot.wgsl), so the
// result is bit-identical to the CPU's and independent of the batch.
// prm: n_rows, k, n_tok, row_size, out_stride, col0, x scales word, x sums word, first row
// in the weight buffer, output row boundaries (kernels.rs matmul_store).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> xq: array<u32>;
@group(0) @binding(3) var<storage, read_write> ys: array<f32>;

const TT: u32 = 8u;

// RG (kernels.rs EXACT_ROWS) rows per workgroup.
var<workgroup> u_d: array<f32, 64 * RG>;
var<workgroup> u_m: array<f32, 64 * RG>;
var<workgroup> u_l: array<f32, 512 * RG>;
var<workgroup> u_i: array<vec2<i32>, 64 * RG>;
// This invocation's row slot in the arrays above.
var<private> s64: u32;
var<private> s512: u32;

fn dot_wg(base: u32, t: u32, k: u32, lid: u32) -> f32 {
    if CLASS == 0u {
        let nb = k / 32u;
        var acc = 0.0;
        var summs = 0.0;
        for (var c0 = 0u; c0 < nb; c0 = c0 + WG) {
            let b = c0 + lid;
            if b < nb {
                unit_a(base + b * BB, t * k / 4u + 8u * b);
                u_d[s64 + lid] = udw * xd(t * nb + b);
                for (var l = 0u; l < 8u; l = l + 1u) {
                    u_l[s512 + 8u * lid + l] = f32(ls[l]);
                }
                if HAS_MIN {
                    u_m[s64 + lid] = nc(umw * xs1(t * nb + b));
                }
            }
            workgroupBarrier();
            let n = min(WG, nb - c0);
            if lid < 8u {
                // Operands of eight steps loaded before their chain: the loads overlap.
                var u = 0u;
                for (; u + 8u <= n; u = u + 8u) {
                    var d: array<f32, 8>;
                    var l: array<f32, 8>;
                    for (var j = 0u; j < 8u; j = j + 1u) {
                        d[j] = u_d[s64 + u + j];
                        l[j] = u_l[s512 + 8u * (u + j) + lid];
                    }
                    for (var j = 0u; j < 8u; j = j + 1u) {
                        acc = chain(d[j], l[j], acc);
                    }
                }
                for (; u < n; u = u + 1u) {
                    acc = chain(u_d[s64 + u], u_l[s512 + 8u * u + lid], acc);
                }
            } else if lid == 8u && HAS_MIN {
                for (var u = 0u; u < n; u = u + 1u) {
                    summs = summs + u_m[s64 + u];
                }
            }
            workgroupBarrier();
        }
        if lid < 8u {
            u_l[s512 + lid] = acc;
        } else if lid == 8u {
            u_m[s64 + 0] = summs;
        }
        workgroupBarrier();
        var a: array<f32, 8>;
        for (var l = 0u; l < 8u; l = l + 1u) {
            a[l] = u_l[s512 + l];
        }
        let v = hsum8(a) + u_m[s64 + 0];
        workgroupBarrier();
        return v;
    }
    if CLASS == 1u && KMODE == 2u {
        // Eight invocations per superblock, one per i32 lane; invocation l < 8 then runs
        // lane l's fma chain over the stage's superblocks.
        let nb = k / 256u;
        var acc = 0.0;
        for (var c0 = 0u; c0 < nb; c0 = c0 + 8u) {
            let b = c0 + lid / 8u;
            var li = 0;
            if b < nb {
                li = q6_lane(base + b * BB, lid % 8u, t * k / 4u + 64u * b);
                if lid % 8u == 0u {
                    u_d[s64 + lid / 8u] = nc(xd(t * nb + b) * kscale(base + b * BB).x);
                }
            }
            u_i[s64 + lid] = vec2<i32>(li, 0);
            workgroupBarrier();
            if lid < 8u {
                for (var u = 0u; u < min(8u, nb - c0); u = u + 1u) {
                    acc = fma_x(u_d[s64 + u], f32(u_i[s64 + 8u * u + lid].x), acc);
                }
            }
            workgroupBarrier();
        }
        if lid < 8u {
            u_l[s512 + lid] = acc;
        }
        workgroupBarrier();
        var a: array<f32, 8>;
        for (var l = 0u; l < 8u; l = l + 1u) {
            a[l] = u_l[s512 + l];
        }
        let v = hsum8(a);
        workgroupBarrier();
        return v;
    }
    if CLASS == 1u {
        // Eight invocations per superblock (one per 32-value sub-block).
        let nb = k / 256u;
        var sum = 0.0;
        var mins = 0.0;
        for (var c0 = 0u; c0 < nb; c0 = c0 + 8u) {
            let b = c0 + lid / 8u;
            var im = vec2<i32>(0);
            if b < nb {
                im = sub_k(base + b * BB, lid % 8u, t * k / 4u + 64u * b);
            }
            u_i[s64 + lid] = im;
            workgroupBarrier();
            if lid < 8u && c0 + lid < nb {
                var s = vec2<i32>(0);
                for (var j = 0u; j < 8u; j = j + 1u) {
                    s = s + u_i[s64 + 8u * lid + j];
                }
                let dy = xd(t * nb + c0 + lid);
                let ds = kscale(base + (c0 + lid) * BB);
                if KMODE == 1u {
                    u_d[s64 + lid] = f32(s.x);
                    u_m[s64 + lid] = f32(s.y);
                    u_l[s512 + lid] = nc(ds.x * dy);
                    u_l[s512 + 8u + lid] = nc(ds.y * dy);
                } else {
                    u_d[s64 + lid] = nc((dy * ds.x) * f32(s.x));
                    u_m[s64 + lid] = nc((dy * ds.y) * f32(s.y));
                }
            }
            workgroupBarrier();
            if lid == 0u {
                for (var u = 0u; u < min(8u, nb - c0); u = u + 1u) {
                    if KMODE == 1u {
                        sum = fma_x(u_d[s64 + u], u_l[s512 + u], sum);
                        mins = fma_x(u_m[s64 + u], u_l[s512 + 8u + u], mins);
                    } else {
                        sum = sum + u_d[s64 + u];
                        mins = mins + u_m[s64 + u];
                    }
                }
            }
        }
        workgroupBarrier();
        if lid == 0u {
            u_d[s64 + 0] = sum - mins;
        }
        workgroupBarrier();
        let v = u_d[s64 + 0];
        workgroupBarrier();
        return v;
    }
    // F16/F32: invocation l < float_chains() runs chain l.
    let n = float_chains();
    if lid < n {
        var c = 0.0;
        for (var i = lid; i < k; i = i + n) {
            c = fma_x(wfloat(base, i), bitcast<f32>(xq[t * k + i]), c);
        }
        u_l[s512 + lid] = c;
    }
    workgroupBarrier();
    var c: array<f32, 32>;
    for (var l = 0u; l < n; l = l + 1u) {
        c[l] = u_l[s512 + l];
    }
    let v = float_chains_sum(c);
    workgroupBarrier();
    return v;
}

// An invocation's place in a workgroup of RG rows, 64 invocations each: its row, that row
// clamped into the matrix (every invocation reaches every barrier: rows past the end
// compute the last row again), and its lane within the row.
struct WgRow {
    r: u32,
    rr: u32,
    lid: u32,
}

// Invocation `li`'s row (and its slot of the workgroup memory, s64 and s512).
fn wg_row(wid: vec3<u32>, nwg: vec3<u32>, li: u32) -> WgRow {
    let slot = li / 64u;
    s64 = 64u * slot;
    s512 = 512u * slot;
    let r = (wid.y * nwg.x + wid.x) * RG + slot;
    return WgRow(r, min(r, prm[0] - 1u), li % 64u);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = wg_row(wid, nwg, li);
    let t0 = wid.z * TT;
    let tt = min(TT, prm[2] - t0);
    for (var t = t0; t < t0 + tt; t = t + 1u) {
        let v = dot_wg((prm[8] + row.rr) * prm[3], t, prm[1], row.lid);
        if row.lid == 0u && row.r < prm[0] {
            store(t, row.r, v);
        }
    }
}
