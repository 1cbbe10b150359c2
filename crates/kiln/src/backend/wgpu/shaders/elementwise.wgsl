// Element-wise ops over f32 buffers, one invocation per value. prm[0] is the length.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> xa: array<f32>;
@group(0) @binding(2) var<storage, read> xb: array<f32>;

// ggml's vector expf (the CPU's backend/cpu/vexp.rs): exp(x) = j * 2^n, j a polynomial.
fn expf_ggml(x: f32) -> f32 {
    // ggml rounds with fma(x, log2e, 1.5 * 2^23) - 1.5 * 2^23, which shader compilers may
    // fold away; round() gives the same integer but at exact half-way products.
    let n = round(x * bitcast<f32>(0x3fb8aa3bu));
    let b = fma(-n, bitcast<f32>(0x35bfbe8eu), fma(-n, bitcast<f32>(0x3f317200u), x));
    let u = b * b;
    let j = fma(fma(fma(bitcast<f32>(0x3c072010u), b, bitcast<f32>(0x3d2b9f17u)), u,
                    fma(bitcast<f32>(0x3e2aaf33u), b, bitcast<f32>(0x3efffedbu))), u,
                fma(bitcast<f32>(0x3f7ffff6u), b, 1.0));
    if abs(n) > 192.0 {
        return select(bitcast<f32>(0x7f800000u), 0.0, n <= 0.0);
    }
    return ldexp(j, i32(n));
}

// glu: xa = act(xa) * xb; prm[1]: 0 SiLU, 1 GELU-tanh on f16-rounded inputs (ggml's table).
// SiLU takes ggml's expf in whole groups of 16 values and exp() in the tail, as the CPU.
@compute @workgroup_size(64)
fn glu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    if i >= prm[0] {
        return;
    }
    let g = xa[i];
    let u = xb[i];
    if prm[1] == 0u {
        var e = exp(-g);
        if i < prm[0] / 16u * 16u {
            e = expf_ggml(-g);
        }
        xa[i] = g / (1.0 + e) * u;
        return;
    }
    if g <= -10.0 {
        xa[i] = 0.0;
    } else if g >= 10.0 {
        xa[i] = g * u;
    } else {
        let x = f16r(g);
        let y = 0.5 * x * (1.0 + tanh(0.7978846 * x * (1.0 + 0.044715 * x * x)));
        xa[i] = f16r(y) * u;
    }
}

// add: xa += xb * scale (prm[1]).
@compute @workgroup_size(64)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    if i >= prm[0] {
        return;
    }
    let s = pf(1u);
    if s == 1.0 {
        xa[i] = xa[i] + xb[i];
    } else {
        xa[i] = xa[i] + xb[i] * s;
    }
}

// add_bias: xa[i] += xb[i % prm[1]].
@compute @workgroup_size(64)
fn add_bias(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    if i >= prm[0] {
        return;
    }
    xa[i] = xa[i] + xb[i % prm[1]];
}

// scale: xa *= prm[1].
@compute @workgroup_size(64)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    if i >= prm[0] {
        return;
    }
    xa[i] = xa[i] * pf(1u);
}

// gather: xa[j * dim + e] = xb[rows[j] * dim + e]; prm: len, dim, rows...
@compute @workgroup_size(64)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    if i >= prm[0] {
        return;
    }
    let dim = prm[1];
    xa[i] = xb[prm[2u + i / dim] * dim + i % dim];
}
