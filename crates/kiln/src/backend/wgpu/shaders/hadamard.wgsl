// The orthonormal Walsh-Hadamard transform of each group of n values (n a power of two) of
// the workgroup's values `wh`, in ggml's arithmetic as crate::kv::hadamard computes it: the
// values scaled by `scale` (1/sqrt(n), from the host) first, then butterflies of growing
// span, each stage's n/2 butterflies spread over the workgroup (a value's sums are the
// serial transform's: a butterfly reads only its two values). Its own inverse: the
// rotation a quantized KV cache applies to its rows, to the query and to the attention's
// output (crate::kv::types).
var<workgroup> wh: array<f32, 256>;

// The first `count` values of wh (a multiple of n, at most 256), each lane having written
// wh[lid + 64 j] itself (or after a barrier); every lane of the workgroup calls it (it has barriers), and finds
// the transformed values in wh after it.
fn hadamard(n: u32, count: u32, scale: f32, lid: u32) {
    for (var i = lid; i < count; i = i + WG) {
        wh[i] = nc(wh[i] * scale);
    }
    for (var len = 1u; len < n; len = len << 1u) {
        workgroupBarrier();
        for (var b = lid; b < count / 2u; b = b + WG) {
            let k = (b / len) * 2u * len + b % len;
            let u = wh[k];
            let v = wh[k + len];
            wh[k] = u + v;
            wh[k + len] = u - v;
        }
    }
    workgroupBarrier();
}
