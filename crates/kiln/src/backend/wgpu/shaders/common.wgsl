// Helpers shared by every kernel: parameter words, f16 rounding, workgroup reductions.
// Every kernel runs 64 invocations per workgroup; the subgroup size is never assumed.
const WG: u32 = 64u;
var<workgroup> red: array<f32, 64>;
var<private> g_sgi: u32;

fn pf(i: u32) -> f32 {
    return bitcast<f32>(prm[i]);
}

// Rounds to the nearest f16 (ties to even), as the CPU's f16 conversions do.
fn f16r(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

// Flat invocation index over a 2-D grid of workgroups (grids wider than 65535).
fn gidx(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * WG + lid;
}

fn wg_max(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if lid < s {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// Sum over the workgroup in a fixed order (the same for every batch: batch invariance).
fn wg_sum(v: f32, lid: u32) -> f32 {
//REDUCE
}
