// out[t, col0 + r] = dot(w[r], x[t]), mul_mat_vec style, for hardware GPUs: a workgroup
// takes RG weight rows, NPR invocations each, and TT tokens (kernels.rs); invocation i sums units i,
// i + NPR, ... of its row (a unit is a 32-value block, a 32-value K sub-block, 8 floats,
// or dot_vec.wgsl's wide units) in f32, and `row_sum` (kernels.rs: subgroup sums, else a fixed tree) adds the
// NPR partials in a fixed order. The integer parts are dot.wgsl's exact sums; the float sums are regrouped,
// so results differ from the CPU's in the last bits (NMSE ~1e-14), but a (row, token)
// pair's arithmetic never depends on the other rows or tokens: batch invariant.
// Which rows and tokens a workgroup takes (kernels.rs VEC_DENSE): `first_token` of the
// grid's z, `first_row` (the weight row its rows count from), `x_row` (a token's
// activation row) and `in_row` (the row a prologue makes them from); matmul_id_vec.wgsl's
// make a token an expert slot.
// prm: n_rows, k, n_tok, row_size, out_stride, col0, x scales word, x sums word, first row
// in the weight buffer, output row boundaries (kernels.rs matmul_store); with ROPE, those of
// rope_epilogue.wgsl after them.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(3) var<storage, read_write> ys: array<f32>;

var<workgroup> part: array<f32, NPR * RG>;

// The fallback sum of a row's partials: a fixed halving tree.
fn row_sum_tree(acc: f32, so: u32, lid: u32) -> f32 {
    part[so + lid] = acc;
    workgroupBarrier();
    for (var s = NPR / 2u; s > 0u; s = s >> 1u) {
        if lid < s {
            part[so + lid] = part[so + lid] + part[so + lid + s];
        }
        workgroupBarrier();
    }
    let v = part[so];
    workgroupBarrier();
    return v;
}

// Unit u of the row at byte `base`, with token t.
fn unit_dot(base: u32, u: u32, t: u32, k: u32) -> f32 {
    if CLASS == 0u {
        let nb = k / 32u;
        unit_a(base + u * BB, t * k / 4u + 8u * u);
        let s = ((ls[0] + ls[1]) + (ls[2] + ls[3])) + ((ls[4] + ls[5]) + (ls[6] + ls[7]));
        var v = (udw * xd(t * nb + u)) * f32(s);
        if HAS_MIN {
            v = v + umw * xs1(t * nb + u);
        }
        return v;
    }
    if CLASS == 1u {
        let nb = k / 256u;
        let b = u / 8u;
        let o = base + b * BB;
        let im = sub_k(o, u % 8u, t * k / 4u + 64u * b);
        let ds = kscale(o);
        return xd(t * nb + b) * (ds.x * f32(im.x) - ds.y * f32(im.y));
    }
    var s = 0.0;
    for (var i = 8u * u; i < 8u * u + 8u; i = i + 1u) {
        s = fma(wfloat(base, i), bitcast<f32>(xq[t * k + i]), s);
    }
    return s;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32 /*SG*/) {
    /*SGI*/
    let by_subgroup = rows_by_subgroup(li);
    // The activations `xq` (kernels.rs Input): bound, or made here first from the input
    // row of the workgroup's token (or slot).
    prologue(li, wid.x == 0u && wid.y == 0u, in_row(first_token(wid.z)));
    // Parameters loaded together, then a branch-free body per step, so each invocation
    // has all its loads in flight at once (decode is latency-bound, not just bandwidth).
    let n_rows = prm[0];
    let k = prm[1];
    let n_tok = prm[2];
    let row_size = prm[3];
    let slot = li / NPR;
    let lid = li % NPR;
    let so = slot * NPR;
    // The workgroup's TT tokens (1 for a decode step).
    let t0 = first_token(wid.z);
    let tt = min(TT, n_tok - t0);
    let row0 = first_row(t0);
    // Every invocation reaches every barrier: rows past the end compute the last row again.
    // Slot s takes the workgroup's rows s, s + RG, ... (RR of them: kernels.rs VecShape).
    let l0 = (wid.y * nwg.x + wid.x) * RG * RR + slot;
    var rs: array<u32, RR>;
    var bases: array<u32, RR>;
    var fs: array<u32, RR>;
    for (var q = 0u; q < RR; q = q + 1u) {
        let r = rope_row(l0 + q * RG);
        let rr = min(r, n_rows - 1u);
        rs[q] = r;
        bases[q] = (row0 + rr) * row_size;
        fs[q] = FAST;
        // The last output's rows in a format of their own (kernels.rs Outs::tail) start at
        // the first row of theirs at or past the others' end in the buffer (mod.rs
        // upload_together). (No tail where RR > 1: its rows' units read other activations.)
        if TAIL != 0u && rr >= prm[TAIL_AT] {
            let rsz = row_bytes(TAIL, k);
            bases[q] = (((row0 + prm[TAIL_AT]) * row_size + rsz - 1u) / rsz + rr - prm[TAIL_AT]) * rsz;
            fs[q] = TAIL;
        }
    }
    var nu = k / 32u;
    if CLASS == 2u {
        nu = k / 8u;
    }
    if FAST >= 2u {
        nu = k / 64u;
    }
    // Each unit's weights loaded once for all the workgroup's tokens, each token's
    // activations once for the slot's RR rows; past the last token the last is computed
    // again (no branch in the loop), its sums not stored. Each (row, token) sum takes its
    // units in the same order whatever TT and RR are.
    var acc: array<f32, RR * TT>;
    // A unit per step for prompts (half the live weight registers: Q4_K pp512 +24% on the
    // H200), two for a decode step (twice the loads in flight), in the same order. Each
    // unit's product is kept from being fused into the sum (`nc`): fused, the H200's
    // compiler rounded the two loops differently, and a token's sums must be the same bits
    // alone or in a batch (tests/gpu_ops.rs).
    if FAST != 0u && TT > 1u {
        for (var u = lid; u < nu; u = u + NPR) {
            var w: array<WUnit, RR>;
            for (var q = 0u; q < RR; q = q + 1u) {
                w[q] = fast_w(fs[q], bases[q], u);
            }
            for (var j = 0u; j < TT; j = j + 1u) {
                let t = t0 + min(j, tt - 1u);
                let x = fast_xl(fs[0], u, x_row(t), k);
                for (var q = 0u; q < RR; q = q + 1u) {
                    let i = q * TT + j;
                    acc[i] = acc[i] + nc(fast_dot(fs[q], w[q], x));
                }
            }
        }
    } else {
        // (Here RR and TT are 1 wherever FAST is set. The loops over them stay: written for
        // one row and one token, the H200's decode measured +1.3% on Q4_0, -2.7% on Q4_K.)
        for (var u0 = lid; u0 < nu; u0 = u0 + 2u * NPR) {
            // Two units per step; the second is clamped and masked past the row's end.
            let u1 = min(u0 + NPR, nu - 1u);
            let m1 = select(0.0, 1.0, u0 + NPR < nu);
            if FAST != 0u {
                var w0: array<WUnit, RR>;
                var w1: array<WUnit, RR>;
                for (var q = 0u; q < RR; q = q + 1u) {
                    w0[q] = fast_w(fs[q], bases[q], u0);
                    w1[q] = fast_w(fs[q], bases[q], u1);
                }
                for (var j = 0u; j < TT; j = j + 1u) {
                    let t = t0 + min(j, tt - 1u);
                    let x0 = fast_xl(fs[0], u0, x_row(t), k);
                    let x1 = fast_xl(fs[0], u1, x_row(t), k);
                    for (var q = 0u; q < RR; q = q + 1u) {
                        let i = q * TT + j;
                        acc[i] = acc[i] + nc(fast_dot(fs[q], w0[q], x0)) + m1 * nc(fast_dot(fs[q], w1[q], x1));
                    }
                }
            } else {
                for (var j = 0u; j < TT; j = j + 1u) {
                    let t = t0 + min(j, tt - 1u);
                    let x = x_row(t);
                    acc[j] = acc[j] + unit_dot(bases[0], u0, x, k) + m1 * unit_dot(bases[0], u1, x, k);
                }
            }
        }
    }
    for (var q = 0u; q < RR; q = q + 1u) {
        for (var j = 0u; j < tt; j = j + 1u) {
            let t = t0 + j;
            let v = row_sum(acc[q * TT + j], so, lid, by_subgroup);
            if ROPE {
                rope_store(t, l0 - slot + q * RG, slot, lid, biased(rs[q], v), n_rows);
            } else if lid == 0u && rs[q] < n_rows {
                store(t, rs[q], v);
            }
        }
    }
    // (A router's: its tokens routed by the last workgroup to finish, kernels.rs Outs; a
    // down projection's of experts: the weighted sum, SUM_TAIL.)
    matmul_tail(wid, nwg, li, t0, tt);
}
