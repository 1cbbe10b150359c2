//! A prompt's expert matmuls on cooperative-matrix tiles, tokens grouped by expert (as
//! llama.cpp's mul_mat_id does): a kernel groups the slots by expert from the router's ids
//! on the device (expert_group.wgsl: counts, each expert's run of the slot list, a table of
//! tiles of up to BM slots of one expert), then the tile matmul (matmul_coop.wgsl through
//! matmul_id_coop.wgsl) takes one expert's tile of slots per workgroup against that expert's
//! weight rows, gathering the slots' f16 activation rows and storing each result row to its
//! slot. An expert's weights are read once per tile of its slots instead of once per slot.
//!
//! Taken where the dense tile matmul would be (cooperative matrices, batch invariance off,
//! the vec path, a format the tiles read) for steps of `coop::MIN_TOKENS` tokens or more,
//! the dense matmul's threshold: at that size each expert of a wide mixture already has a
//! few slots a tile on average, and the tiles read each used expert's weights once where the
//! vec path reads them once per slot. Smaller steps (decode) keep `matmul_id_vec.wgsl`.
//!
//! A slot's sums are its expert row's over f16 operands in the tiles' order, whichever
//! slots share its tile; they depend on the batch only as the dense tiles' do, through the
//! shape the step's size picks (k is never split here). So `batch_invariant` keeps every
//! expert matmul on the vec kernel.

use std::sync::Arc;

use ::wgpu;

use super::coop::{self, CoopShape};
use super::kernels::Kernel;
use super::moe::GpuExperts;
use super::{GpuBackend, GpuBuf, MatmulPath};
use crate::backend::ExpertInput;

/// The experts the grouping kernel's workgroup takes (an invocation each; expert_group.wgsl).
const MAX_GROUP_EXPERTS: usize = 256;

/// The most tiles of a matmul (the grid's x).
const MAX_TILES: usize = 65535;

/// Where a grouping's parts lie in its buffer (expert_group.wgsl), in words.
#[derive(Clone, Copy, Debug)]
struct Groups {
    /// The slot list: each expert's slots together.
    list: usize,
    /// The tile table: (expert, first list entry, end of the expert's entries) per tile.
    table: usize,
    /// The table's length: the most tiles the slots can make.
    tiles: usize,
    /// Words in all.
    words: usize,
}

impl Groups {
    fn new(n_slots: usize, n_expert: usize, bm: usize) -> Groups {
        let list = 2 * n_expert;
        let table = list + n_slots;
        // Each expert's last tile may be partial: at most one more tile per expert.
        let tiles = n_slots.div_ceil(bm) + n_expert.min(n_slots);
        Groups { list, table, tiles, words: table + 3 * tiles }
    }
}

impl GpuBackend {
    /// The tile shape of the expert matmul of `w` for `tokens` tokens of `k` slots each, None
    /// where it stays on the other kernels (see the module's doc). The shape is the dense
    /// tile matmul's for the slots an expert has on average; k is never split.
    pub(super) fn expert_tiles(&self, w: &GpuExperts, tokens: usize, k: usize) -> Option<CoopShape> {
        let caps = self.coop.as_ref()?;
        let n_expert = w.n_expert();
        let on = !self.batch_invariant
            && self.matmul == MatmulPath::Vec
            && coop::coop_type(w.ty)
            && tokens >= coop::MIN_TOKENS
            && n_expert <= MAX_GROUP_EXPERTS;
        let per_expert = (tokens * k).div_ceil(n_expert).max(1);
        let s = on.then(|| coop::shape(caps, per_expert, w.rows, w.cols)).flatten()?;
        let s = CoopShape { ks: 1, ..s };
        (Groups::new(tokens * k, n_expert, s.bm() as usize).tiles <= MAX_TILES).then_some(s)
    }

    /// The activations' rounding for the experts of `w` at `tokens` tokens of `k` slots:
    /// f16 (quantize mode 4) where the tiles take them, else the weight's dot type.
    pub(super) fn expert_mode(&self, w: &GpuExperts, tokens: usize, k: usize) -> Option<(u32, usize)> {
        match self.expert_tiles(w, tokens, k) {
            Some(_) => Some((4, 32)),
            None => super::dot_mode(w.ty),
        }
    }

    /// The expert matmul on tiles where every weight of `ws` takes them (`expert_tiles`);
    /// false, having run nothing, where not. `held`: what the activation scratch holds.
    pub(super) fn matmul_id_tiles(
        &self,
        ws: &[&GpuExperts],
        input: ExpertInput<GpuBuf>,
        outs: &mut [&mut GpuBuf],
        held: Option<&(wgpu::Buffer, u32, usize)>,
    ) -> bool {
        let ExpertInput { x, per_slot, ids, rows, k } = input;
        let Some(shapes) = ws.iter().map(|w| self.expert_tiles(w, rows, k)).collect::<Option<Vec<_>>>()
        else {
            return false;
        };
        let n_slots = rows * k;
        let x_rows = if per_slot { n_slots } else { rows };
        let cols = ws[0].cols;
        // The activations rounded to f16 once for all (unless the router's norm left them).
        let n = x_rows * cols;
        let act = self.act_buf(n);
        if held.is_none_or(|(b, m, len)| *b != x.buf || *m != 4 || *len != n) {
            self.run_quantize(self.take_writer(x, n, 32), x, 4, x_rows, cols, &act);
        }
        // Two stacks of one buffer, one after the other in each expert (gate and up), run as
        // one matmul with two outputs.
        let joint = ws.len() == 2
            && ws[0].same_buffer(ws[1])
            && ws[0].ty == ws[1].ty
            && ws[0].rows == ws[1].rows
            && ws[1].start == ws[0].start + ws[0].rows
            && shapes[0] == shapes[1];
        let both;
        let jobs: Vec<(&GpuExperts, CoopShape, Vec<&wgpu::Buffer>)> = if joint {
            both = ws[0].joined(ws[1]);
            vec![(&both, shapes[0], outs.iter().map(|o| &o.buf).collect())]
        } else {
            ws.iter().zip(&shapes).zip(outs.iter()).map(|((w, &s), o)| (*w, s, vec![&o.buf])).collect()
        };
        let mut grouped: Option<(u32, Groups, wgpu::Buffer)> = None;
        for (w, s, outs) in jobs {
            let bm = s.bm();
            if grouped.as_ref().is_none_or(|g| g.0 != bm) {
                let (g, buf) = self.group_experts(&ids.buf, n_slots, w.n_expert(), bm as usize);
                grouped = Some((bm, g, buf));
            }
            let (_, g, grp) = grouped.as_ref().expect("set above");
            let out_rows = w.rows / outs.len();
            let kernel = Kernel::MatmulIdCoop(w.ty, outs.len() as u8, s);
            for (buf, e0, n) in w.buffers() {
                let prm = [
                    w.rows as u32,
                    w.cols as u32,
                    rows as u32,
                    w.row_size as u32,
                    out_rows as u32,
                    0,
                    0,
                    0,
                    w.start as u32,
                    out_rows as u32,
                    0,
                    w.stride as u32,
                    k as u32,
                    per_slot as u32,
                    e0 as u32,
                    (e0 + n) as u32,
                    g.list as u32,
                    g.table as u32,
                ];
                let mut bufs = vec![buf, &act];
                bufs.extend(&outs);
                bufs.push(grp);
                let groups = [g.tiles as u32, w.rows.div_ceil(s.bn() as usize) as u32, 1];
                self.run(kernel, &prm, &bufs, groups);
            }
        }
        true
    }

    /// The slots of `ids` (`n_slots` expert ids, as f32) grouped by expert for tiles of `bm`
    /// slots (expert_group.wgsl), into the groups' scratch buffer.
    fn group_experts(
        &self,
        ids: &wgpu::Buffer,
        n_slots: usize,
        n_expert: usize,
        bm: usize,
    ) -> (Groups, wgpu::Buffer) {
        let g = Groups::new(n_slots, n_expert, bm);
        let buf = self.scratch(&self.expert_groups_buf, g.words, "kiln expert groups");
        let prm = [n_slots as u32, n_expert as u32, bm as u32, g.tiles as u32];
        self.run(Kernel::ExpertGroup, &prm, &[ids, &buf], [1, 1, 1]);
        (g, buf)
    }

    /// `expert_group.wgsl`'s output for `ids` (tests): each expert's count, its first list
    /// entry, the slot list, and the tile table, as the kernel writes them.
    #[doc(hidden)]
    pub fn expert_groups(&self, ids: &GpuBuf, n_slots: usize, n_expert: usize, bm: usize) -> Vec<u32> {
        self.flush();
        let (g, buf) = self.group_experts(&ids.buf, n_slots, n_expert, bm);
        let mut out = vec![0f32; g.words];
        let view = GpuBuf { buf, len: g.words, alt: None };
        crate::backend::Backend::read(self, &view, &mut out);
        out.iter().map(|v| v.to_bits()).collect()
    }

    /// Whether `w`'s expert matmul at `tokens` tokens of `k` slots runs on the tiles (tests).
    #[doc(hidden)]
    pub fn experts_on_tiles(&self, w: &GpuExperts, tokens: usize, k: usize) -> bool {
        self.expert_tiles(w, tokens, k).is_some()
    }
}

impl GpuExperts {
    /// Experts in the stack.
    fn n_expert(&self) -> usize {
        self.bufs.iter().map(|b| b.n).sum()
    }

    fn same_buffer(&self, other: &GpuExperts) -> bool {
        Arc::ptr_eq(&self.bufs, &other.bufs)
    }

    /// `self` and the stack after it in each expert, as one of both's rows.
    fn joined(&self, next: &GpuExperts) -> GpuExperts {
        GpuExperts { rows: self.rows + next.rows, ..self.clone() }
    }

    /// The buffers holding whole experts: each with its first expert and how many.
    fn buffers(&self) -> impl Iterator<Item = (&wgpu::Buffer, usize, usize)> {
        self.bufs.iter().map(|b| (&b.buf, b.e0, b.n))
    }
}
