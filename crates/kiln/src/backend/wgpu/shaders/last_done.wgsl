// The fused tails' hand-over to the last workgroup to finish (the router's top-k, a
// mixture's weighted sum, the attention's block quantize): each workgroup releases what
// it stored (a storage barrier) and counts itself done in counter `i` (bound at DC); the
// last of the `n` that count there acquires the others' stores (a second barrier) and
// leaves the counter at zero for the next dispatch. Every invocation calls it; the result
// is the same for the whole workgroup.
@group(0) @binding(DC) var<storage, read_write> done_count: array<atomic<u32>>;
var<workgroup> done_last: u32;

fn last_done(i: u32, n: u32, li: u32) -> bool {
    storageBarrier();
    if li == 0u {
        done_last = u32(atomicAdd(&done_count[i], 1u) == n - 1u);
    }
    if workgroupUniformLoad(&done_last) == 0u {
        return false;
    }
    storageBarrier();
    if li == 0u {
        atomicStore(&done_count[i], 0u);
    }
    return true;
}
