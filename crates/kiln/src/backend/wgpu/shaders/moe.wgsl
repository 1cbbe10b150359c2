// Mixture-of-experts ops with the CPU backend's arithmetic (backend/cpu/moe.rs): the
// router's top-k, the weighted sum of the experts' outputs, a shared expert's gated add.
// Each entry point's three buffers are bound at 1, 2, 3.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<f32>;

// route: a token per workgroup (route.wgsl's route_token). prm: rows, then route_prm's
// six, then the expert-selection bias (n_expert f32 bits) where route_prm(5) says so.
// b1 the router's logits, b2 the chosen ids (as f32), b3 their weights.
fn route_prm(j: u32) -> u32 {
    return prm[1u + j];
}

fn route_bias(i: u32) -> f32 {
    return bitcast<f32>(prm[7u + i]);
}

fn route_logit(i: u32) -> f32 {
    return b1[i];
}

fn route_out(o: u32, id: f32, w: f32) {
    b2[o] = id;
    b3[o] = w;
}

@compute @workgroup_size(256)
fn route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) i: u32) {
    let t = wid.y * nwg.x + wid.x;
    if t >= prm[0] {
        return;
    }
    route_token(t, i);
}

// sum: out[t] = sum over j of w[t, j] * y[t * k + j], each product rounded, added in slot
// order. prm: rows * dim, dim, k. b1 y, b2 the weights, b3 out.
@compute @workgroup_size(64)
fn sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    if i >= prm[0] {
        return;
    }
    let dim = prm[1];
    let k = prm[2];
    let t = i / dim;
    let c = i % dim;
    var o = nc(b1[t * k * dim + c] * b2[t * k]);
    for (var j = 1u; j < k; j = j + 1u) {
        o = o + nc(b1[(t * k + j) * dim + c] * b2[t * k + j]);
    }
    b3[i] = o;
}

// gated_add: x[t] += y[t] * sigmoid(g[t]), the sigmoid as ggml's silu(g) / g.
// prm: rows * dim, dim. b1 x, b2 y, b3 g.
@compute @workgroup_size(64)
fn gated_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    if i >= prm[0] {
        return;
    }
    let g = b3[i / prm[1]];
    let gate = (g / (1.0 + exp_acc(-g))) / g;
    b1[i] = b1[i] + nc(b2[i] * gate);
}
