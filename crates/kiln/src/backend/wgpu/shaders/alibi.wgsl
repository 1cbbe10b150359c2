// ALiBi's bias of key position p for token t's query on head h (AttnPlan::bias): the
// distance as an f16 value, times the head's slope (computed on the host as the CPU's).
// prm[11]: where the slopes (n_head) and then the query positions (n_tok) start; 0: none.
fn alibi_bias(t: u32, h: u32, p: u32) -> f32 {
    let at = prm[11];
    if at == 0u {
        return 0.0;
    }
    let q = prm[at + prm[1] + t];
    return nc(pf(at + h) * f16r(-f32(max(q, p) - min(q, p))));
}
