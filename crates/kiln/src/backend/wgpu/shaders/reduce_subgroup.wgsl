    // One partial per subgroup, whatever its size; the leaders' partials are then added
    // in invocation order (zeros elsewhere), so the result is deterministic.
    let s = subgroupAdd(v);
    red[lid] = select(0.0, s, g_sgi == 0u);
    workgroupBarrier();
    var r = 0.0;
    for (var i = 0u; i < WG; i = i + 1u) {
        r = r + red[i];
    }
    workgroupBarrier();
    return r;
