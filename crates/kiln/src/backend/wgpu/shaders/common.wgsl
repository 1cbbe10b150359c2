// Helpers shared by every kernel: parameter words, f16 rounding, workgroup reductions,
// and the arithmetic that keeps results identical to the CPU backend's.
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

// An opaque copy of `x`: a product passed through it is not fused with a following add
// into an fma (SPIR-V lets drivers contract; the CPU rounds the product and the sum).
// The flag is false at run time but unknown to the compiler; every entry point sets it
// first (kernels.rs inserts the line), so it is a register, not a load per use.
var<private> g_opaque: bool;

fn nc(x: f32) -> f32 {
    return select(x, 0.0, g_opaque);
}

// Error-free sum: a + b = s + e exactly (Knuth), each step kept from reassociation.
fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = nc(a + b);
    let bb = nc(s - a);
    let e = nc(a - nc(s - bb)) + nc(b - bb);
    return vec2<f32>(s, e);
}

// Flat invocation index over a 2-D grid of workgroups (grids wider than 65535).
fn gidx(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * WG + lid;
}

// The CPU's horizontal sum of eight lanes (`hsum_ps`): ((0+4)+(2+6)) + ((1+5)+(3+7)).
fn hsum8(a: array<f32, 8>) -> f32 {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
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

// Veltkamp split of a into 12-bit halves (their products are exact in f32).
fn split12(a: f32) -> vec2<f32> {
    let c = nc(4097.0 * a);
    let hi = nc(c - nc(c - a));
    return vec2<f32>(hi, nc(a - hi));
}

// Error-free product: a * b = p + e exactly (Dekker; no fma needed).
fn two_prod(a: f32, b: f32) -> vec2<f32> {
    let p = nc(a * b);
    let sa = split12(a);
    let sb = split12(b);
    let e = nc(nc(nc(nc(sa.x * sb.x) - p) + nc(sa.x * sb.y)) + nc(sa.y * sb.x)) + nc(sa.y * sb.y);
    return vec2<f32>(p, e);
}

// a * b + c with one rounding, from exact parts (Boldo & Melquiond: the small parts are
// summed with rounding to odd, then one round to nearest). For drivers whose fma() is a
// separate multiply and add (lavapipe's; Vulkan allows it).
fn fma_soft(a: f32, b: f32, c: f32) -> f32 {
    let u = two_prod(a, b);
    let t = two_sum(c, u.x);
    let s = two_sum(t.y, u.y);
    var v = s.x;
    let vb = bitcast<u32>(v);
    if s.y != 0.0 && (vb & 1u) == 0u {
        // Round to odd: step to the neighbour on the side of the lost part.
        v = bitcast<f32>(select(vb - 1u, vb + 1u, (v > 0.0) == (s.y > 0.0)));
    }
    return nc(t.x + v);
}

// The fused multiply-add the CPU's kernels use.
fn fma_x(a: f32, b: f32, c: f32) -> f32 {
//FMA
}
