// matmul_vec's store for a q/k/v matmul with RoPE and the KV store fused in (RopeStore's
// work, one dispatch less per layer): a workgroup's rows in groups of four, a NEOX head's
// rows permuted (`rope_row`) so that a group holds rows j, j + 1, j + h/2, j + 1 + h/2
// (two rotation pairs, two f16 words); q rows rotated into `ys`, k rows rotated and v rows
// stored to their KV slots as f16 words, with rope_store.wgsl's expressions.
// prm[11..]: q rows, k rows (of this dispatch), head_dim, neox, KV words per token (k's and
// v's alike), rope words at, slots at; then per token head_dim values (cos, sin)..., the
// slots.
@group(0) @binding(KC) var<storage, read_write> kc: array<u32>;
@group(0) @binding(VC) var<storage, read_write> vc: array<u32>;

var<workgroup> rv: array<f32, RG>;

// The weight row that dispatch row l computes.
fn rope_row(l: u32) -> u32 {
    let hd = prm[13];
    if prm[14] == 0u || l >= prm[11] + prm[12] {
        return l;
    }
    let i = l % hd;
    return l - i + 2u * (i / 4u) + i % 2u + hd / 2u * ((i / 2u) % 2u);
}

fn rot(x0: f32, x1: f32, t: u32, p: u32) -> vec2<f32> {
    let cs = pf(prm[16] + t * prm[13] + 2u * p);
    let sn = pf(prm[16] + t * prm[13] + 2u * p + 1u);
    return rope_rot(x0, x1, cs, sn);
}

// Every invocation calls it (barriers): value v of the row of slot `slot` (dispatch rows
// from l0), token t.
fn rope_store(t: u32, l0: u32, slot: u32, lid: u32, v: f32, n_rows: u32) {
    if lid == 0u {
        rv[slot] = v;
    }
    workgroupBarrier();
    if lid == 0u && slot % 4u == 0u && l0 + slot < n_rows {
        let a = vec4<f32>(rv[slot], rv[slot + 1u], rv[slot + 2u], rv[slot + 3u]);
        let r = rope_row(l0 + slot);
        let nq = prm[11];
        let nqk = nq + prm[12];
        let hd = prm[13];
        let slot_t = prm[prm[17] + t];
        if r >= nqk {
            let o = slot_t * prm[15] + (r - nqk) / 2u;
            vc[o] = pack2x16float(a.xy);
            vc[o + 1u] = pack2x16float(a.zw);
        } else {
            // Rows (in order) r, r + 1 and their pairs' second rows r2, r2 + 1.
            var o: vec4<f32>;
            var r2 = r + 2u;
            let i = r % hd;
            if prm[14] == 0u {
                let x = rot(a.x, a.y, t, i / 2u);
                let y = rot(a.z, a.w, t, i / 2u + 1u);
                o = vec4<f32>(x.x, x.y, y.x, y.y);
            } else {
                let x = rot(a.x, a.z, t, i);
                let y = rot(a.y, a.w, t, i + 1u);
                o = vec4<f32>(x.x, y.x, x.y, y.y);
                r2 = r + hd / 2u;
            }
            if r < nq {
                ys[t * nq + r] = o.x;
                ys[t * nq + r + 1u] = o.y;
                ys[t * nq + r2] = o.z;
                ys[t * nq + r2 + 1u] = o.w;
            } else {
                let base = slot_t * prm[15];
                kc[base + (r - nq) / 2u] = pack2x16float(o.xy);
                kc[base + (r2 - nq) / 2u] = pack2x16float(o.zw);
            }
        }
    }
    workgroupBarrier();
}
