// The split attention's merge (attention_split.wgsl): a workgroup per (token, head) weighs
// each chunk's sums by exp(chunk max - head max), in chunk order. `attn_tail` as the
// exact kernel's (attention.wgsl). prm as attention_split.wgsl's.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> ys: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32 /*SG*/) {
    /*SGI*/
    let th = wid.y * nwg.x + wid.x;
    if th >= prm[0] * prm[1] {
        return;
    }
    let hd = prm[3];
    let nc = prm[9];
    let row = th * nc * (hd + 2u);
    var m = bitcast<f32>(0xff800000u);
    for (var c = 0u; c < nc; c = c + 1u) {
        m = max(m, part[row + c * (hd + 2u)]);
    }
    var l = 0.0;
    var a = vec4<f32>(0.0);
    for (var c = 0u; c < nc; c = c + 1u) {
        let o = row + c * (hd + 2u);
        let mc = part[o];
        if mc > bitcast<f32>(0xff800000u) {
            let w = exp(mc - m);
            l = fma(part[o + 1u], w, l);
            for (var i = 0u; i < 4u; i = i + 1u) {
                let d = lid + 64u * i;
                if d < hd {
                    a[i] = fma(part[o + 2u + d], w, a[i]);
                }
            }
        }
    }
    let inv = select(0.0, 1.0 / l, l != 0.0);
    for (var i = 0u; i < 4u; i = i + 1u) {
        let d = lid + 64u * i;
        if d < hd {
            ys[th * hd + d] = a[i] * inv;
        }
    }
    attn_tail(th * hd / 4u + min(lid, hd / 4u - 1u), lid < hd / 4u, lid);
}
