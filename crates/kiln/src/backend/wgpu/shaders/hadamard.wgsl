// The orthonormal Walsh-Hadamard transform of the first n values of `hv` (n a power of
// two), in ggml's arithmetic as crate::kv::hadamard computes it: the values scaled by
// `scale` (1/sqrt(n), from the host) first, then butterflies of growing span. Its own
// inverse: the rotation a quantized KV cache applies to its rows, to the query and to the
// attention's output (crate::kv::types).
var<private> hv: array<f32, 256>;

fn hadamard(n: u32, scale: f32) {
    for (var i = 0u; i < n; i = i + 1u) {
        hv[i] = nc(hv[i] * scale);
    }
    for (var len = 1u; len < n; len = len << 1u) {
        for (var i = 0u; i < n; i = i + 2u * len) {
            for (var k = i; k < i + len; k = k + 1u) {
                let u = hv[k];
                let v = hv[k + len];
                hv[k] = u + v;
                hv[k + len] = u - v;
            }
        }
    }
}
