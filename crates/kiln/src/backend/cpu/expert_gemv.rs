//! The experts' matmuls where each expert has few tokens (decode): every part of every
//! such expert in one pool dispatch, each distinct input row prepared once per activation
//! form. A decode step of a mixture of experts otherwise issues a matmul per expert and
//! part (OLMoE: 24 a layer), each waiting for its slowest thread and quantizing the same
//! row again. Each `(slot, row)` output is the call of the same kernel as the dense
//! matmul's on that expert alone, so the values are those of `ops::matmul`.

#[cfg(target_arch = "x86_64")]
use super::interleaved::GroupDots;
use super::moe::CpuExperts;
use super::ops::{quantize_rows, rows_per_task, PlainDot, SyncPtr};
use super::pool::ThreadPool;
use super::CpuWeight;
use crate::quant::{GgmlType, Interleave};

/// How one expert's weight meets its tokens: the plain rows' GEMV, or the interleaved
/// groups' kernels, with the weight's bytes.
#[derive(Clone, Copy)]
enum Rows<'w> {
    Plain(PlainDot, &'w [u8]),
    #[cfg(target_arch = "x86_64")]
    Grouped(Interleave, GroupDots, &'w [u8]),
}

impl<'w> Rows<'w> {
    fn of(w: &'w CpuWeight) -> Self {
        #[cfg(target_arch = "x86_64")]
        if let Some((layout, packed)) = w.interleaved() {
            return Rows::Grouped(layout, GroupDots::of(layout, w.cols), packed);
        }
        Rows::Plain(PlainDot::of(w), w.bytes().expect("only interleaved weights lack plain bytes"))
    }

    /// The activations' form: weights of one form read the same prepared rows.
    fn form(&self) -> Form {
        match self {
            Rows::Plain(p, _) => Form::Plain(p.act_type, p.w_ty == GgmlType::F16),
            #[cfg(target_arch = "x86_64")]
            Rows::Grouped(layout, ..) => Form::Grouped(*layout),
        }
    }

    fn act_row(&self) -> usize {
        match self {
            Rows::Plain(p, _) => p.act_row,
            #[cfg(target_arch = "x86_64")]
            Rows::Grouped(_, g, _) => g.act_row,
        }
    }

    fn prepare(&self, src: &[f32], dst: &mut [u8]) {
        match self {
            Rows::Plain(p, _) => p.prepare(src, dst),
            #[cfg(target_arch = "x86_64")]
            Rows::Grouped(_, g, _) => g.prepare(src, dst),
        }
    }

    /// Rows a task takes of an `n`-row weight: the dense matmul's share of the whole
    /// dispatch's `total` rows, at most the weight, whole groups. Each matrix's own share
    /// would be many short tasks (OLMoE: 64 rows of 1024, 256 tasks a dispatch), where a
    /// claim passes a cache line between cores and each run of rows starts a new stream;
    /// the dispatch's share decodes markedly faster (docs/benchmarks.md).
    fn chunk(&self, n: usize, total: usize, n_threads: usize) -> usize {
        let rows = rows_per_task(total, n_threads).min(n);
        match self {
            Rows::Plain(..) => rows,
            #[cfg(target_arch = "x86_64")]
            Rows::Grouped(_, g, _) => rows.next_multiple_of(g.group),
        }
    }

    /// `put(t, r, ·)` for `rows` of the weight (`rs` bytes a row, `k` columns) and the
    /// `n_tok` activation rows `act`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        rs: usize,
        k: usize,
        rows: std::ops::Range<usize>,
        act: &[u8],
        n_tok: usize,
        put: &impl Fn(usize, usize, f32),
    ) {
        match self {
            Rows::Plain(p, wb) => p.gemv(wb, rs, k, rows, act, n_tok, put),
            #[cfg(target_arch = "x86_64")]
            Rows::Grouped(_, g, packed) => g.rows(packed, rs, rows, act, n_tok, put),
        }
    }
}

/// An activation form: the plain kernels' (their activation type; F16 weights' rows are
/// F16-rounded f32) or an interleaved layout's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    Plain(GgmlType, bool),
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Grouped(Interleave),
}

/// One part's matmul for one expert.
struct Job<'w> {
    part: usize,
    /// Index into `experts`.
    expert: usize,
    rows: Rows<'w>,
    /// Index into the forms' activation regions.
    form: usize,
    /// Bytes a weight row, rows a task.
    rs: usize,
    chunk: usize,
}

/// For each `(e, slots)` of `experts` and each part `p` of `ws`: `outs[p][slot]` =
/// `ws[p].experts[e]` times the slot's input row (`x` row `slot` where `per_slot`, else
/// `slot / k`), all in one pool dispatch.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
    pool: &ThreadPool,
    ws: &[&CpuExperts],
    x: &[f32],
    per_slot: bool,
    k: usize,
    experts: &[(usize, &[usize])],
    outs: &mut [&mut Vec<f32>],
    act_buf: &mut Vec<u8>,
) {
    let Some(first) = ws.first() else { return };
    let cols = first.cols;
    let n_threads = pool.n_threads();
    // The slots in expert order; expert j's are positions start[j]..start[j + 1].
    let positions: Vec<usize> = experts.iter().flat_map(|(_, s)| s.iter().copied()).collect();
    let mut start = vec![0];
    start.extend(experts.iter().scan(0, |n, (_, s)| {
        *n += s.len();
        Some(*n)
    }));
    // Each distinct input row once, in order of first use; `uses[i]`: position i's.
    let src = |slot: usize| if per_slot { slot } else { slot / k };
    let mut index = vec![usize::MAX; positions.iter().map(|&s| src(s) + 1).max().unwrap_or(0)];
    let mut distinct: Vec<usize> = Vec::new();
    let uses: Vec<usize> = positions
        .iter()
        .map(|&slot| {
            let r = src(slot);
            if index[r] == usize::MAX {
                index[r] = distinct.len();
                distinct.push(r);
            }
            index[r]
        })
        .collect();
    let gathered: Vec<f32>;
    let xs: &[f32] = if distinct.iter().enumerate().all(|(i, &r)| i == r) {
        &x[..distinct.len() * cols]
    } else {
        gathered = distinct.iter().flat_map(|&r| &x[r * cols..(r + 1) * cols]).copied().collect();
        &gathered
    };

    // The jobs, and the activation forms they read (one region of all positions each).
    let mut forms: Vec<(Form, Rows)> = Vec::new();
    let mut jobs = Vec::with_capacity(ws.len() * experts.len());
    let total = experts.len() * ws.iter().map(|w| w.rows).sum::<usize>();
    for (part, w) in ws.iter().enumerate() {
        for (j, &(e, _)) in experts.iter().enumerate() {
            let weight = &w.experts[e];
            let rows = Rows::of(weight);
            let f = rows.form();
            let form = forms.iter().position(|(g, _)| *g == f).unwrap_or_else(|| {
                forms.push((f, rows));
                forms.len() - 1
            });
            let (rs, chunk) = (weight.row_size, rows.chunk(w.rows, total, n_threads));
            jobs.push(Job { part, expert: j, rows, form, rs, chunk });
        }
    }
    let region: Vec<usize> = forms.iter().map(|(_, r)| positions.len() * r.act_row()).collect();
    let total: usize = region.iter().sum();
    if act_buf.len() < total {
        act_buf.resize(total, 0);
    }
    let mut staged = Vec::new();
    let mut rest = &mut act_buf[..total];
    let mut acts: Vec<&[u8]> = Vec::with_capacity(forms.len());
    for ((_, rows), &len) in forms.iter().zip(&region) {
        let act_row = rows.act_row();
        let q =
            quantize_rows(pool, xs, distinct.len(), cols, act_row, &mut staged, &|s, d| rows.prepare(s, d));
        let (dst, tail) = std::mem::take(&mut rest).split_at_mut(len);
        for (d, &u) in dst.chunks_exact_mut(act_row).zip(&uses) {
            d.copy_from_slice(&q[u * act_row..(u + 1) * act_row]);
        }
        acts.push(dst);
        rest = tail;
    }

    // Tasks: each job's row chunks, jobs in order (an expert's rows stream in sequence).
    let mut task_start = vec![0];
    task_start.extend(jobs.iter().scan(0, |n, j| {
        *n += ws[j.part].rows.div_ceil(j.chunk);
        Some(*n)
    }));
    let ptrs: Vec<SyncPtr<f32>> = outs.iter_mut().map(|o| SyncPtr(o.as_mut_ptr())).collect();
    let n_tasks = *task_start.last().expect("starts at 0");
    pool.run(n_tasks, &|task| {
        let ji = task_start.partition_point(|&s| s <= task) - 1;
        let job = &jobs[ji];
        let n = ws[job.part].rows;
        let c = task - task_start[ji];
        let rows = c * job.chunk..((c + 1) * job.chunk).min(n);
        let (a, b) = (start[job.expert], start[job.expert + 1]);
        let act_row = job.rows.act_row();
        let act = &acts[job.form][a * act_row..b * act_row];
        let slots = &positions[a..b];
        let op = ptrs[job.part];
        // SAFETY: output (slot, r) of a part is written by the task owning row r of the
        // slot's expert only (a slot has one expert).
        let put = |t: usize, r: usize, v: f32| unsafe { *op.get().add(slots[t] * n + r) = v };
        job.rows.run(job.rs, cols, rows, act, b - a, &put);
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::cpu::{moe, ops};
    use crate::gguf::{GgufFile, GgufWriter};

    /// `n_expert` experts of `parts` (rows each) × `cols`, random values quantized to `ty`.
    fn experts(ty: GgmlType, n_expert: usize, parts: &[usize], cols: usize, seed: u64) -> Vec<CpuExperts> {
        let rows: usize = parts.iter().sum::<usize>() * n_expert;
        let mut rng = seed;
        let mut data = Vec::new();
        let mut row = vec![0u8; ty.row_size(cols).unwrap()];
        for _ in 0..rows {
            let vals: Vec<f32> = (0..cols).map(|_| uniform(&mut rng) * 0.5).collect();
            crate::quant::quantize_row(ty, &vals, &mut row).unwrap();
            data.extend_from_slice(&row);
        }
        let mut w = GgufWriter::new();
        let per_expert: usize = parts.iter().sum();
        w.add_tensor("exps", ty, &[cols as u64, per_expert as u64, n_expert as u64], data).unwrap();
        let gguf = Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap());
        let t = gguf.tensor("exps").unwrap().clone();
        moe::load(&gguf, None, &t, n_expert, parts).unwrap()
    }

    fn uniform(state: &mut u64) -> f32 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// The experts' outputs as the dense matmul gives them, one expert at a time.
    fn per_expert(
        pool: &ThreadPool,
        ws: &[&CpuExperts],
        x: &[f32],
        per_slot: bool,
        k: usize,
        chosen: &[(usize, &[usize])],
        outs: &mut [Vec<f32>],
    ) {
        let cols = ws[0].cols;
        let mut act = Vec::new();
        for &(e, slots) in chosen {
            let xin: Vec<f32> = slots
                .iter()
                .flat_map(|&s| {
                    let r = if per_slot { s } else { s / k };
                    x[r * cols..(r + 1) * cols].iter().copied()
                })
                .collect();
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                let n = w.rows;
                let mut y = vec![0f32; slots.len() * n];
                ops::matmul(pool, &w.experts[e], &xin, slots.len(), &mut y, &mut act);
                for (i, &s) in slots.iter().enumerate() {
                    out[s * n..(s + 1) * n].copy_from_slice(&y[i * n..(i + 1) * n]);
                }
            }
        }
    }

    /// One dispatch for every expert gives the bits of a dense matmul per expert, for the
    /// plain (tile and `vec_dot`) and interleaved kinds, 1 to 5 tokens (experts with 1 to 5
    /// slots: the GEMV and GEMM ranges of the dense matmul), inputs per token and per slot;
    /// and `matmul_id`, splitting experts between both paths, the same.
    #[test]
    fn one_dispatch_equals_a_matmul_per_expert() {
        let pool = ThreadPool::new(3);
        let (n_expert, k, cols) = (6, 3, 256);
        let types =
            [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q6_K, GgmlType::F16, GgmlType::Q5_0, GgmlType::Q4_1];
        for (ti, ty) in types.into_iter().enumerate() {
            let parts = experts(ty, n_expert, &[48, 32], cols, ti as u64 + 1);
            #[cfg(target_arch = "x86_64")]
            if ty == GgmlType::Q4_K && crate::quant::q4_k_x8_kernels().is_some() {
                assert!(parts[0].experts[0].interleaved().is_some(), "Q4_K experts are interleaved");
            }
            let ws: Vec<&CpuExperts> = parts.iter().collect();
            let mut rng = 99 + ti as u64;
            for n_tok in 1..=5 {
                // Each token's k distinct experts.
                let mut ids = Vec::new();
                for _ in 0..n_tok {
                    let mut order: Vec<usize> = (0..n_expert).collect();
                    for i in (1..n_expert).rev() {
                        order.swap(i, ((uniform(&mut rng) + 1.0) * 0.5 * (i + 1) as f32) as usize % (i + 1));
                    }
                    ids.extend(order[..k].iter().map(|&e| e as f32));
                }
                let mut slots = vec![Vec::new(); n_expert];
                ids.iter().enumerate().for_each(|(s, &e)| slots[e as usize].push(s));
                let chosen: Vec<(usize, &[usize])> = slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !s.is_empty())
                    .map(|(e, s)| (e, &s[..]))
                    .collect();
                for per_slot in [false, true] {
                    let n_in = if per_slot { n_tok * k } else { n_tok };
                    let x: Vec<f32> = (0..n_in * cols).map(|_| uniform(&mut rng)).collect();
                    let fresh =
                        || parts.iter().map(|w| vec![f32::NAN; n_tok * k * w.rows]).collect::<Vec<_>>();
                    let mut want = fresh();
                    per_expert(&pool, &ws, &x, per_slot, k, &chosen, &mut want);
                    let mut got = fresh();
                    let mut outs: Vec<&mut Vec<f32>> = got.iter_mut().collect();
                    matmul(&pool, &ws, &x, per_slot, k, &chosen, &mut outs, &mut Vec::new());
                    let mut via_id = fresh();
                    let mut outs: Vec<&mut Vec<f32>> = via_id.iter_mut().collect();
                    let input = crate::backend::ExpertInput { x: &x, per_slot, ids: &ids, rows: n_tok, k };
                    moe::matmul_id(&pool, &ws, input, &mut outs, &mut Vec::new());
                    let bits = |v: &[Vec<f32>]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let what = format!("{ty:?}, {n_tok} tokens, per_slot {per_slot}");
                    assert!(want.iter().flatten().all(|v| v.is_finite()), "{what}");
                    assert_eq!(bits(&got), bits(&want), "{what}: one dispatch");
                    assert_eq!(bits(&via_id), bits(&want), "{what}: matmul_id");
                }
            }
        }
    }
}
