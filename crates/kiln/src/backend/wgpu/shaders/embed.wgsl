// out[t] = table[ids[t]] * scale for the ids that fall in this part of the table.
// prm: n_tok, cols, row_size, row0, n_rows, scale, ids... (`token_id`, kernels.rs: these
// ids, or a device buffer's).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read_write> ys: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    let cols = prm[1];
    let nc = cols / 32u;
    if g >= prm[0] * nc {
        return;
    }
    let t = g / nc;
    let c = g % nc;
    let id = token_id(t);
    if id < prm[3] || id >= prm[3] + prm[4] {
        return;
    }
    load_chunk((id - prm[3]) * prm[2], c);
    let scale = pf(5u);
    for (var i = 0u; i < 32u; i = i + 1u) {
        var v = wv[i] + wmin;
        if scale != 1.0 {
            v = v * scale;
        }
        ys[t * cols + c * 32u + i] = v;
    }
}
