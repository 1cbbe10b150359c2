// The gated activation of value i of `len`, as the CPU's: act 0 SiLU with ggml's expf in
// whole groups of 16 values and exp() in the tail, 1 GELU-tanh looked up by the input's
// f16 bits in the CPU's table (ggml's; computing tanh here rounds differently at times).
@group(0) @binding(GT) var<storage, read> gelu_t: array<u32>;

// ggml's vector expf (the CPU's backend/cpu/vexp.rs): exp(x) = j * 2^n, j a degree-5
// polynomial of the reduced argument, every step a fused multiply-add as on the CPU.
fn expf_ggml(x: f32) -> f32 {
    // n = fma(x, log2e, 1.5 * 2^23) - 1.5 * 2^23: x log2e rounded to the nearest integer
    // (ties to even), taken from the exact product p + e.
    let pe = two_prod(x, bitcast<f32>(0x3fb8aa3bu));
    var n = round(pe.x);
    let d = nc(pe.x - n);
    if d == 0.5 && pe.y > 0.0 {
        n = n + 1.0;
    } else if d == -0.5 && pe.y < 0.0 {
        n = n - 1.0;
    }
    let b = fma_x(-n, bitcast<f32>(0x35bfbe8eu), fma_x(-n, bitcast<f32>(0x3f317200u), x));
    let u = nc(b * b);
    let j = fma_x(fma_x(fma_x(bitcast<f32>(0x3c072010u), b, bitcast<f32>(0x3d2b9f17u)), u,
                        fma_x(bitcast<f32>(0x3e2aaf33u), b, bitcast<f32>(0x3efffedbu))), u,
                  fma_x(bitcast<f32>(0x3f7ffff6u), b, 1.0));
    if abs(n) > 192.0 {
        return select(bitcast<f32>(0x7f800000u), 0.0, n <= 0.0);
    }
    // j * 2^n rounded once: the first factor is exact, the second rounds.
    let ni = i32(n);
    let n1 = ni / 2;
    return j * pow2i(n1) * pow2i(ni - n1);
}

fn glu_value(g: f32, u: f32, i: u32, len: u32, act: u32) -> f32 {
    if act == 0u {
        // Only the tail pays for exp_acc (its tables, indexed at run time, may be copied
        // per call: computing it for every value cost smollm2's decode 1% on an H200).
        var e: f32;
        if i < len / 16u * 16u {
            e = expf_ggml(-g);
        } else {
            e = exp_acc(-g);
        }
        return (g / (1.0 + e)) * u;
    }
    if g <= -10.0 {
        return 0.0;
    } else if g >= 10.0 {
        return g * u;
    }
    let h = pack2x16float(vec2<f32>(g, 0.0)) & 0xffffu;
    let w = gelu_t[h >> 1u] >> (16u * (h & 1u));
    return unpack2x16float(w).x * u;
}
