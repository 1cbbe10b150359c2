// Element-wise ops over f32 buffers, one invocation per value. prm[0] is the length.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> xa: array<f32>;
@group(0) @binding(2) var<storage, read> xb: array<f32>;
@group(0) @binding(3) var<storage, read_write> xo: array<f32>;

// glu: xo = act(xa) * xb (out of place: kernels.rs Input); prm[1]: 0 SiLU, 1 GELU-tanh (glu.wgsl).
@compute @workgroup_size(64)
fn glu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    if i >= prm[0] {
        return;
    }
    xo[i] = glu_value(xa[i], xb[i], i, prm[0], prm[1]);
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

// softcap: xa = cap · tanh(xa · (1 / cap)), cap = prm[1], 1 / cap = prm[2].
@compute @workgroup_size(64)
fn softcap(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    if i >= prm[0] {
        return;
    }
    xa[i] = softcap_score(xa[i] * pf(2u), pf(1u));
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
