// A RoPE pair (x0, x1) rotated by (cos, sin): one product fused into an fma, as the CPU
// (and GCC's build of ggml) does. Shared by every kernel that rotates (rope_core.wgsl,
// rope_store.wgsl, rope_epilogue.wgsl, norm_rope_tail.wgsl), so all give the same bits.
fn rope_rot(x0: f32, x1: f32, cs: f32, sn: f32) -> vec2<f32> {
    return vec2<f32>(fma_x(x0, cs, -nc(x1 * sn)), fma_x(x0, sn, nc(x1 * cs)));
}
