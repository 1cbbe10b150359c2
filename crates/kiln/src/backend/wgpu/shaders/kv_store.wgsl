// Rows of k and v (f32) to their KV slots as f16 pairs packed in u32 words.
// prm: n_tok, dim, slots...
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> ks: array<f32>;
@group(0) @binding(2) var<storage, read> vs: array<f32>;
@group(0) @binding(3) var<storage, read_write> kc: array<u32>;
@group(0) @binding(4) var<storage, read_write> vc: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    let half_dim = prm[1] / 2u;
    if g >= prm[0] * half_dim {
        return;
    }
    let t = g / half_dim;
    let j = g % half_dim;
    let src = t * prm[1] + 2u * j;
    let dst = prm[2u + t] * half_dim + j;
    kc[dst] = pack2x16float(vec2<f32>(ks[src], ks[src + 1u]));
    vc[dst] = pack2x16float(vec2<f32>(vs[src], vs[src + 1u]));
}
