// LFM2's short convolution (Backend::short_conv): `conv` takes a (token, channel) per
// invocation, `out = C · Σ_j w[c, j] · window_j` with the window's values oldest first,
// each `B·x` rounded and taken by a fused multiply-add (the CPU's `mul_add` chain), and
// copies the new state rows of the tokens that write one to `tmp`; `state` then stores
// them to their slots (a token's window may read the slot another token's state goes to,
// so no state is written until every window has been read).
// prm: n tokens, dim, l_cache, tokens writing a state; from 4, per token its l_cache
// window words (a token of the batch; 2^31 + a state row, slot · (l_cache - 1) + row;
// or 0xffffffff: zero); then per token its index among the state writers (or
// 0xffffffff); then each writer's state slot.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> tmp: array<f32>;
@group(0) @binding(2) var<storage, read_write> st: array<f32>;
@group(0) @binding(3) var<storage, read> bcx: array<f32>;
@group(0) @binding(4) var<storage, read> cw: array<f32>;
@group(0) @binding(5) var<storage, read_write> ys: array<f32>;

// Channel c of a window value.
fn window(code: u32, c: u32, dim: u32) -> f32 {
    if code == 0xffffffffu {
        return 0.0;
    }
    if code >= 0x80000000u {
        return st[(code & 0x7fffffffu) * dim + c];
    }
    let b = code * 3u * dim + c;
    return nc(bcx[b] * bcx[b + 2u * dim]);
}

@compute @workgroup_size(64)
fn conv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = gidx(wid, nwg, lid);
    let n = prm[0];
    let dim = prm[1];
    let l = prm[2];
    if idx >= n * dim {
        return;
    }
    let i = idx / dim;
    let c = idx % dim;
    let src = 4u + i * l;
    var sum = 0.0;
    for (var j = 0u; j < l; j = j + 1u) {
        sum = fma_x(window(prm[src + j], c, dim), cw[c * l + j], sum);
    }
    ys[idx] = bcx[i * 3u * dim + dim + c] * sum;
    let k = prm[4u + n * l + i];
    if k != 0xffffffffu {
        for (var r = 0u; r + 1u < l; r = r + 1u) {
            tmp[(k * (l - 1u) + r) * dim + c] = window(prm[src + r + 1u], c, dim);
        }
    }
}

@compute @workgroup_size(64)
fn state(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let idx = gidx(wid, nwg, lid);
    let n = prm[0];
    let dim = prm[1];
    let l = prm[2];
    if idx >= prm[3] * (l - 1u) * dim {
        return;
    }
    let row = idx / dim;
    let slot = prm[4u + n * l + n + row / (l - 1u)];
    st[(slot * (l - 1u) + row % (l - 1u)) * dim + idx % dim] = tmp[idx];
}
