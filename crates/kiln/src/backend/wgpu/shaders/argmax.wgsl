// ids[r] = the index of the largest of row r's n values by total order (f32 total_cmp:
// -NaN < -inf < ... < inf < NaN), the lowest index on ties. `main` takes a part of a row
// per workgroup (prm[2] parts of equal span), each invocation keeping sixteen loads in
// flight: one part writes the id, several write their best (key, index) pairs to `ids`
// for `combine`, which picks a row's best (a lone workgroup over a 150k vocabulary is
// latency-bound). Greedy decoding reads back these ids instead of the whole vocabulary.
// prm: n_rows, n, n_parts (combine: n_rows, n_parts; its pairs bound as `xs`).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;

const AT: u32 = 256u;

var<workgroup> best_key: array<u32, AT>;
var<workgroup> best_idx: array<u32, AT>;

// An unsigned key ordered as total_cmp orders the floats.
fn total_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// Whether (ka, ia) comes before (kb, ib): the larger key, then the lower index.
fn better(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}

// The workgroup's best (key, index) of every invocation's, by a halving tree.
fn best_of(key: u32, idx: u32, lid: u32) -> vec2<u32> {
    best_key[lid] = key;
    best_idx[lid] = idx;
    workgroupBarrier();
    for (var s = AT / 2u; s > 0u; s = s >> 1u) {
        if lid < s && better(best_key[lid + s], best_idx[lid + s], best_key[lid], best_idx[lid]) {
            best_key[lid] = best_key[lid + s];
            best_idx[lid] = best_idx[lid + s];
        }
        workgroupBarrier();
    }
    return vec2<u32>(best_key[0], best_idx[0]);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let n_parts = prm[2];
    let g = wid.y * nwg.x + wid.x;
    let r = g / n_parts;
    if r >= prm[0] {
        return;
    }
    let n = prm[1];
    let span = (n + n_parts - 1u) / n_parts;
    let part = g % n_parts;
    let end = min(n, (part + 1u) * span);
    var key = 0u;
    var idx = 0xffffffffu;
    // (key, index) pairs are totally ordered, so the visiting order does not matter.
    for (var i0 = part * span + lid; i0 < end; i0 = i0 + 16u * AT) {
        var v: array<f32, 16>;
        for (var j = 0u; j < 16u; j = j + 1u) {
            v[j] = xs[r * n + min(i0 + j * AT, end - 1u)];
        }
        for (var j = 0u; j < 16u; j = j + 1u) {
            let i = i0 + j * AT;
            let k = total_key(v[j]);
            if i < end && better(k, i, key, idx) {
                key = k;
                idx = i;
            }
        }
    }
    let b = best_of(key, idx, lid);
    if lid == 0u {
        if n_parts == 1u {
            ids[r] = b.y;
        } else {
            ids[2u * g] = b.x;
            ids[2u * g + 1u] = b.y;
        }
    }
}

@compute @workgroup_size(256)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let r = wid.y * nwg.x + wid.x;
    if r >= prm[0] {
        return;
    }
    let n_parts = prm[1];
    var key = 0u;
    var idx = 0xffffffffu;
    if lid < n_parts {
        key = bitcast<u32>(xs[2u * (r * n_parts + lid)]);
        idx = bitcast<u32>(xs[2u * (r * n_parts + lid) + 1u]);
    }
    let b = best_of(key, idx, lid);
    if lid == 0u {
        ids[r] = b.y;
    }
}
