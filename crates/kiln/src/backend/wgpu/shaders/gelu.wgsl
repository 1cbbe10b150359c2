// x = gelu(x) in place (BERT's feed-forward): GELU-tanh by the CPU's table, as the GLU's
// gate (glu.wgsl) with an up value of 1. prm[0] is the length.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> xa: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    if i >= prm[0] {
        return;
    }
    xa[i] = glu_value(xa[i], 1.0, i, prm[0], 1u);
}
