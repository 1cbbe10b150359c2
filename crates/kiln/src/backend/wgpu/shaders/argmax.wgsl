// ids[r] = the index of the largest of row r's n values by total order (f32 total_cmp:
// -NaN < -inf < ... < inf < NaN), the lowest index on ties; one workgroup per row.
// Greedy decoding reads back these ids instead of the whole vocabulary.
// prm: n_rows, n.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;

var<workgroup> best_key: array<u32, 64>;
var<workgroup> best_idx: array<u32, 64>;

// An unsigned key ordered as total_cmp orders the floats.
fn total_key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// Whether (ka, ia) comes before (kb, ib): the larger key, then the lower index.
fn better(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let r = wid.y * nwg.x + wid.x;
    if r >= prm[0] {
        return;
    }
    let n = prm[1];
    var key = 0u;
    var idx = 0xffffffffu;
    for (var i = lid; i < n; i = i + WG) {
        let k = total_key(xs[r * n + i]);
        if better(k, i, key, idx) {
            key = k;
            idx = i;
        }
    }
    best_key[lid] = key;
    best_idx[lid] = idx;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if lid < s && better(best_key[lid + s], best_idx[lid + s], best_key[lid], best_idx[lid]) {
            best_key[lid] = best_key[lid + s];
            best_idx[lid] = best_idx[lid + s];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        ids[r] = best_idx[0];
    }
}
