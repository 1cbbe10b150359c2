// Rows into and out of one KV cache of any cache type (kq_ of kv_blocks.wgsl; KT its type,
// 6: F16), as the CPU's kv_rows.rs moves them, a workgroup per chunk of a row (whole
// rotation groups, 32 to 256 values):
// `store` writes rows of f32 values to their slots: the chunk rotated by the cache's
// Walsh-Hadamard transform where it has one (hadamard.wgsl), then quantized block by block
// (kv_quant.wgsl); F16 rounded. `load` reads slots back as f32 rows, dequantized and
// rotated back (a context shift's keys). `copy` copies rows between slots as they are, a
// half word an invocation.
// Blocks lie at even byte offsets: a chunk whose bytes are whole words (a chunk of 64
// values or more) is stored a word a lane; otherwise two workgroups may write the halves
// of one word, and writes go a half at a time with atomic and/or.
// prm: n_rows, dim, group, rotated, rotation scale (f32 bits), chunk, then the slots (copy:
// the source slots, then the destination slots).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> kq: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> xs: array<f32>;

const SLOTS: u32 = 6u;

// Bytes a slot's row of `dim` values takes.
fn row_bytes(dim: u32) -> u32 {
    return dim / 32u * kq_BB;
}

// Writes the low 16 bits of v at byte o (even).
fn put16(o: u32, v: u32) {
    let sh = (o & 2u) * 8u;
    atomicAnd(&kq[o >> 2u], ~(0xffffu << sh));
    atomicOr(&kq[o >> 2u], (v & 0xffffu) << sh);
}

// A workgroup's chunk: whether it is one, its first value in xs, its first byte in kq.
struct Chunk {
    live: bool,
    x0: u32,
    o: u32,
}

fn chunk_of(wid: vec3<u32>, nwg: vec3<u32>) -> Chunk {
    let g = wid.y * nwg.x + wid.x;
    let dim = prm[1];
    let n = prm[5];
    let per = dim / n;
    let i = g / per;
    let c = g % per;
    return Chunk(g < prm[0] * per, i * dim + c * n, prm[SLOTS + i] * row_bytes(dim) + c * n / 32u * kq_BB);
}

@compute @workgroup_size(64)
fn store(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let ch = chunk_of(wid, nwg);
    if !ch.live {
        return;
    }
    let n = prm[5];
    for (var i = lid; i < n; i = i + WG) {
        wh[i] = xs[ch.x0 + i];
    }
    if prm[3] != 0u {
        hadamard(prm[2], n, pf(4u), lid);
    } else {
        workgroupBarrier();
    }
    kv_quantize(KT, n, lid);
    let nbytes = n / 32u * kq_BB;
    if (ch.o & 3u) == 0u && nbytes % 4u == 0u {
        for (var w = lid; w < nbytes / 4u; w = w + WG) {
            atomicStore(&kq[(ch.o >> 2u) + w], kv_word_at(KT, 4u * w));
        }
    } else {
        for (var h = lid; h < nbytes / 2u; h = h + WG) {
            put16(ch.o + 2u * h, kv_byte(KT, 2u * h) | (kv_byte(KT, 2u * h + 1u) << 8u));
        }
    }
}

@compute @workgroup_size(64)
fn load(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let ch = chunk_of(wid, nwg);
    if !ch.live {
        return;
    }
    let n = prm[5];
    for (var j = 2u * lid; j < n; j = j + 2u * WG) {
        var v: vec2<f32>;
        if KT == 6u {
            v = unpack2x16float(kq_word((ch.o + 2u * j) >> 2u));
        } else {
            v = kq_pair(ch.o, j);
        }
        wh[j] = v.x;
        wh[j + 1u] = v.y;
    }
    workgroupBarrier();
    if prm[3] != 0u {
        hadamard(prm[2], n, pf(4u), lid);
    }
    for (var i = lid; i < n; i = i + WG) {
        xs[ch.x0 + i] = wh[i];
    }
}

@compute @workgroup_size(64)
fn copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    let n = prm[0];
    let halves = row_bytes(prm[1]) / 2u;
    if g >= n * halves {
        return;
    }
    let i = g / halves;
    let h = 2u * (g % halves);
    let s = prm[SLOTS + i] * row_bytes(prm[1]) + h;
    let d = prm[SLOTS + n + i] * row_bytes(prm[1]) + h;
    put16(d, kq_word(s >> 2u) >> ((s & 2u) * 8u));
}
