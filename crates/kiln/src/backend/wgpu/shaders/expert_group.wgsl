// A prompt's expert slots grouped by expert (a counting sort), for the expert tile matmul
// (matmul_id_coop.wgsl): one workgroup, an expert per invocation (at most 256 experts).
// Writes, in words of `grp`: each expert's slot count (0..n_expert) and the start of its
// slots in the list (n_expert..), the list of slots (from 2 * n_expert: each expert's slots
// together, in no particular order within it), then the tile table (after the list): per
// tile of up to `bm` slots of one expert (expert, first list entry, end of the expert's
// entries), the experts in order, and 0xffffffff past the last tile.
// prm: n_slots, n_expert, bm (slots per tile), the table's length in tiles.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<f32>;
@group(0) @binding(2) var<storage, read_write> grp: array<u32>;

const NE: u32 = 256u;
var<workgroup> counts: array<atomic<u32>, NE>;
var<workgroup> placed: array<atomic<u32>, NE>;
// Inclusive sums of the slot counts and of the tile counts, then each expert's first list
// entry.
var<workgroup> sums: array<u32, NE>;
var<workgroup> tsums: array<u32, NE>;
var<workgroup> starts: array<u32, NE>;

fn expert_of(s: u32) -> u32 {
    return min(u32(ids[s]), NE - 1u);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
    let ns = prm[0];
    let ne = prm[1];
    let bm = prm[2];
    atomicStore(&counts[li], 0u);
    atomicStore(&placed[li], 0u);
    workgroupBarrier();
    for (var s = li; s < ns; s = s + NE) {
        atomicAdd(&counts[expert_of(s)], 1u);
    }
    workgroupBarrier();
    let c = atomicLoad(&counts[li]);
    let nt = (c + bm - 1u) / bm;
    sums[li] = c;
    tsums[li] = nt;
    workgroupBarrier();
    for (var d = 1u; d < NE; d = d * 2u) {
        var a = 0u;
        var b = 0u;
        if li >= d {
            a = sums[li - d];
            b = tsums[li - d];
        }
        workgroupBarrier();
        sums[li] = sums[li] + a;
        tsums[li] = tsums[li] + b;
        workgroupBarrier();
    }
    let first = sums[li] - c;
    let t0 = tsums[li] - nt;
    starts[li] = first;
    let list = 2u * ne;
    let table = list + ns;
    if li < ne {
        grp[li] = c;
        grp[ne + li] = first;
    }
    for (var j = 0u; j < nt && t0 + j < prm[3]; j = j + 1u) {
        let at = table + 3u * (t0 + j);
        grp[at] = li;
        grp[at + 1u] = first + j * bm;
        grp[at + 2u] = first + c;
    }
    for (var i = tsums[NE - 1u] + li; i < prm[3]; i = i + NE) {
        grp[table + 3u * i] = 0xffffffffu;
    }
    workgroupBarrier();
    for (var s = li; s < ns; s = s + NE) {
        let e = expert_of(s);
        grp[list + starts[e] + atomicAdd(&placed[e], 1u)] = s;
    }
}
