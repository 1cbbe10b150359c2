// Word j of a row normalized: the CPU's `x * scale` rounded, then times the weight
// (`wlen` values: the row's, or one head's for per-head norms), which the includer binds
// as `wn`.
fn rms_apply(v: vec4<f32>, scale: f32, j: u32, wlen: u32) -> vec4<f32> {
    var y: vec4<f32>;
    for (var i = 0u; i < 4u; i = i + 1u) {
        y[i] = nc(v[i] * scale) * wn[(4u * j + i) % wlen];
    }
    return y;
}
