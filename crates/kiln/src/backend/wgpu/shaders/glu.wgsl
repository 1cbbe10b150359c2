// The gated activation of value i of `len`, as the CPU's: act 0 SiLU with ggml's expf in
// whole groups of 16 values and exp() in the tail, 1 GELU-tanh looked up by the input's
// f16 bits in the CPU's table (ggml's; computing tanh here rounds differently at times).
@group(0) @binding(GT) var<storage, read> gelu_t: array<u32>;

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
