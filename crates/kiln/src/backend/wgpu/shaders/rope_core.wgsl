// Rotates pair `g` of the heads in `xa` (token, head, pair order) in place: n_head heads of
// hd values, the first n_rot rotated, NEOX (halves) or NORM (adjacent) pairs, the cos/sin
// of each token's position at parameter word `cs0` on (n_rot values per token), by
// rope_rot.wgsl.
fn rope_pair(g: u32, n_head: u32, hd: u32, n_rot: u32, neox: bool, cs0: u32) {
    let half_rot = n_rot / 2u;
    let pair = g % half_rot;
    let th = g / half_rot;
    let t = th / n_head;
    let cs = pf(cs0 + t * n_rot + 2u * pair);
    let sn = pf(cs0 + t * n_rot + 2u * pair + 1u);
    let base = th * hd;
    var i0 = base + 2u * pair;
    var i1 = i0 + 1u;
    if neox {
        i0 = base + pair;
        i1 = i0 + half_rot;
    }
    let r = rope_rot(xa[i0], xa[i1], cs, sn);
    xa[i0] = r.x;
    xa[i1] = r.y;
}
