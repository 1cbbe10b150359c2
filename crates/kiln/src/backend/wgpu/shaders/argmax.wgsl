// ids[r] = the index of the largest of row r's n values by total order (f32 total_cmp:
// -NaN < -inf < ... < inf < NaN), the lowest index on ties; one workgroup per row, each
// invocation keeping sixteen loads in flight (a lone workgroup over a 150k vocabulary is
// latency-bound). Greedy decoding reads back these ids instead of the whole vocabulary.
// prm: n_rows, n.
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

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let r = wid.y * nwg.x + wid.x;
    if r >= prm[0] {
        return;
    }
    let n = prm[1];
    var key = 0u;
    var idx = 0xffffffffu;
    // (key, index) pairs are totally ordered, so the visiting order does not matter.
    for (var i0 = lid; i0 < n; i0 = i0 + 16u * AT) {
        var v: array<f32, 16>;
        for (var j = 0u; j < 16u; j = j + 1u) {
            v[j] = xs[r * n + min(i0 + j * AT, n - 1u)];
        }
        for (var j = 0u; j < 16u; j = j + 1u) {
            let i = i0 + j * AT;
            let k = total_key(v[j]);
            if i < n && better(k, i, key, idx) {
                key = k;
                idx = i;
            }
        }
    }
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
    if lid == 0u {
        ids[r] = best_idx[0];
    }
}
