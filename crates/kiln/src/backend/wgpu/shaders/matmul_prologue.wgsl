// The vec matmul's activations made by every workgroup itself in a decode step (one token)
// instead of by a dispatch before it: on small models a step's time is mostly the
// dispatches' fixed cost, not their work (kernels.rs `Input`). The op that feeds the matmul
// (RMSNorm with the residual add, the GLU, or none: an f32 input) runs here on the whole
// row, quantized into workgroup memory `xq` in quantize.wgsl's layout (`in_put`, kernels.rs;
// an f32 router's row in f32), so the dot functions read it unchanged and the bits are
// those of the two dispatches. The row is
// input row `row`, a decode step's one token. The first workgroup (`first`)
// also stores what the op stores (the new residual, the norm's or the GLU's output), for
// any later reader. The op's parts (kernels.rs: `in_a` ... `in_out`) take an invocation's
// NC words of the row, which starts at word `in_w0` of the op's buffers; prm[PP]: the quantize
// mode, then the op's parameters.
var<workgroup> xq: array<u32, XQW>;

const NT: u32 = NPR * RG;
const NC: u32 = NCW;

var<private> in_w0: u32;

fn prologue(li: u32, first: bool, row: u32) {
    let k = prm[1];
    let nw = k / 4u;
    in_w0 = row * nw;
    // Every load first, all in flight at once: the prologue is latency, not work.
    var a: array<vec4<f32>, NC>;
    var b: array<vec4<f32>, NC>;
    for (var c = 0u; c < NC; c = c + 1u) {
        let j = min(c * NT + li, nw - 1u);
        a[c] = in_a(j);
        b[c] = in_b(j);
    }
    // (The row sums' subgroup check before this reused workgroup memory the norm's reuses.)
    workgroupBarrier();
    var v: array<vec4<f32>, NC>;
    for (var c = 0u; c < NC; c = c + 1u) {
        v[c] = in_value(min(c * NT + li, nw - 1u), a[c], b[c]);
    }
    let scale = in_scale(v, li, nw);
    for (var c = 0u; c < NC; c = c + 1u) {
        let live = c * NT + li < nw;
        let j = min(c * NT + li, nw - 1u);
        in_put(j, in_out(j, v[c], scale, live && first), live, li, first, k);
    }
    workgroupBarrier();
}
