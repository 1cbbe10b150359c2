//! Mixture-of-experts ops on the GPU (moe.wgsl, route.wgsl, matmul_id.wgsl,
//! matmul_id_vec.wgsl), each with the CPU backend's arithmetic (the experts' matmuls on the
//! vec path: the dense vec matmul's): the router's top-k (on the vec path done by the
//! router's matmul as it finishes), the experts' matmuls (each slot's expert read from the
//! ids on the device: no host round trip; a slot's dot is the dense matmul's, so it does
//! not depend on the slots sharing its expert), their weighted sum and a shared expert's
//! sigmoid gate.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ::wgpu;

use super::kernels::{self, IdTail, Input, Kernel};
use super::{grid, matrix_data, Dispatch, GpuBackend, GpuBuf, GpuWeight, MatmulPath, Pending, Prologue};
use crate::backend::{ExpertInput, Gating, Routing};
use crate::error::{KilnError, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::GgmlType;

/// The most experts a router may score (route.wgsl's MAX_EXPERTS: a workgroup's invocations).
const MAX_EXPERTS: usize = 256;

/// Slots per dispatch (the grid's z dimension, one slot each).
const MAX_SLOTS: usize = 65535;

/// Whole experts of a 3-D tensor in one buffer: the buffer, its first expert, how many.
pub(super) struct ExpertBuf {
    pub(super) buf: wgpu::Buffer,
    pub(super) e0: usize,
    pub(super) n: usize,
}

/// A stack of expert matrices of `rows × cols` on the device: rows `start..start + rows`
/// of every expert of a 3-D tensor (`stride` rows per expert: one matrix, or a fused gate
/// and up), in its GGUF block format (F16 where no kernel reads that format).
#[derive(Clone)]
pub struct GpuExperts {
    pub(super) bufs: Arc<Vec<ExpertBuf>>,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub(super) row_size: usize,
    pub(super) stride: usize,
    pub(super) start: usize,
}

impl GpuBackend {
    pub(super) fn load_experts_impl(
        &self,
        gguf: &Arc<GgufFile>,
        t: &TensorInfo,
        n_expert: usize,
        parts: &[usize],
    ) -> Result<Vec<GpuExperts>> {
        let err = |msg: String| KilnError::Tensor { name: t.name.clone(), msg };
        if !t.ty.is_supported() {
            return Err(err(format!("unsupported tensor type {}", t.ty.name())));
        }
        let (rows, cols) = t.rows_cols();
        let stride: usize = parts.iter().sum();
        if n_expert == 0 || rows != n_expert * stride {
            return Err(err(format!("{rows} rows, expected {n_expert} experts of {stride}")));
        }
        if n_expert > MAX_EXPERTS {
            return Err(err(format!("{n_expert} experts: the GPU router takes at most {MAX_EXPERTS}")));
        }
        if !cols.is_multiple_of(32) {
            return Err(err(format!("row length {cols} is not a multiple of 32")));
        }
        let (ty, data) = matrix_data(t.ty, cols, gguf.tensor_data(t))?;
        self.upload_experts(&data, ty, cols, n_expert, parts, &t.name)
    }

    /// Expert tensors of one type and width (gate and up) in one buffer, each expert's rows
    /// of every tensor in turn, as a fused `ffn_gate_up_exps` lays them out: the expert
    /// matmul takes them in one kernel. Others load one by one.
    pub(super) fn load_experts_together_impl(
        &self,
        gguf: &Arc<GgufFile>,
        ts: &[&TensorInfo],
        n_expert: usize,
    ) -> Result<Vec<GpuExperts>> {
        let one = |t: &TensorInfo| self.load_experts_impl(gguf, t, n_expert, &[t.rows_cols().0 / n_expert]);
        let cols = ts[0].rows_cols().1;
        // (Where a tensor on its own would fail a check, it does.)
        let joint = ts.len() > 1
            && (1..=MAX_EXPERTS).contains(&n_expert)
            && cols.is_multiple_of(32)
            && ts.iter().all(|t| {
                t.ty == ts[0].ty
                    && kernels::gpu_weight_type(t.ty)
                    && t.rows_cols().1 == cols
                    && t.rows_cols().0.is_multiple_of(n_expert)
            });
        if !joint {
            return ts.iter().map(|t| one(t).map(|mut v| v.remove(0))).collect();
        }
        let row_size = ts[0].ty.row_size(cols)?;
        let parts: Vec<usize> = ts.iter().map(|t| t.rows_cols().0 / n_expert).collect();
        let mut data = Vec::with_capacity(ts.iter().map(|t| t.size as usize).sum());
        for e in 0..n_expert {
            for (t, &rows) in ts.iter().zip(&parts) {
                let raw = gguf.tensor_data(t);
                data.extend_from_slice(&raw[e * rows * row_size..(e + 1) * rows * row_size]);
            }
        }
        let names: Vec<&str> = ts.iter().map(|t| t.name.as_str()).collect();
        self.upload_experts(&data, ts[0].ty, cols, n_expert, &parts, &names.join("+"))
    }

    /// Stacks of `n_expert` experts of `parts` rows each (`data`: each expert's parts in
    /// turn) on the device.
    fn upload_experts(
        &self,
        data: &[u8],
        ty: GgmlType,
        cols: usize,
        n_expert: usize,
        parts: &[usize],
        name: &str,
    ) -> Result<Vec<GpuExperts>> {
        let stride: usize = parts.iter().sum();
        let row_size = ty.row_size(cols)?;
        // Whole experts per buffer.
        let bufs = self.upload_split(data, stride * row_size, n_expert, name)?;
        let bufs: Arc<Vec<_>> =
            Arc::new(bufs.into_iter().map(|(buf, e0, n)| ExpertBuf { buf, e0, n }).collect());
        let mut start = 0;
        Ok(parts
            .iter()
            .map(|&rows| {
                let x = GpuExperts { bufs: bufs.clone(), ty, rows, cols, row_size, stride, start };
                start += rows;
                x
            })
            .collect())
    }

    /// The router (`Backend::moe_router`). Where it reads `x` as f32 and the norm (or other
    /// op) that writes `x` is held back, that op also quantizes `x` for `experts` as it
    /// writes it, into the activation scratch, where the expert matmul finds it: one
    /// dispatch instead of a quantize of its own before the experts, the same bits. In a
    /// decode step whose route the matmul takes, a held residual add and norm runs in the
    /// router's own prologue instead (`Input::ExpertNorm`): one dispatch fewer again.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_router_impl(
        &self,
        router: &GpuWeight,
        experts: &GpuExperts,
        x: &GpuBuf,
        rows: usize,
        r: &Routing,
        bias: Option<&[f32]>,
        (logits, ids, weights): (&mut GpuBuf, &mut GpuBuf, &mut GpuBuf),
    ) {
        self.op();
        let n = rows * experts.cols;
        let f32_router = super::dot_mode(router.ty).is_none()
            && self.coop_shape(router.ty, rows, router.rows, router.cols).is_none();
        // (An f32 router's dispatches leave what is held as it is: built before the norm runs.)
        self.counts.ops.fetch_add(1, Ordering::Relaxed);
        let mut ds = self.matmul_dispatches(&[router], &[], x, rows, &[&logits.buf]);
        // On the vec path the matmul routes its tokens as its last workgroup finishes (one
        // dispatch): its workgroups of MAX_EXPERTS invocations (the route's), with as many
        // rows as that takes (rows per workgroup leave each row's sums as they are). A
        // selection bias is routed by the route kernel, which reads it as parameters.
        // (Its vec shape where it does.)
        let route_shape = match ds.as_slice() {
            [Dispatch { kernel: Kernel::MatmulVec(_, outs, input, shape), .. }]
                if bias.is_none()
                    && r.n_expert <= MAX_EXPERTS
                    && outs.n == 1
                    && !outs.bias
                    && !outs.rope
                    && MAX_EXPERTS.is_multiple_of(shape.npr)
                    && (*input == Input::Quantized
                        || self.prologue_fits(router.cols, MAX_EXPERTS, false)) =>
            {
                Some(*shape)
            }
            _ => None,
        };
        let mut norm_in = None;
        if let (true, Some((mode, bs))) = (f32_router, self.expert_mode(experts, rows, r.k)) {
            if let Some(taken) = self.take_writer(x, n, bs) {
                let act = self.act_buf(n);
                if let Some(shape) = route_shape {
                    let n_groups = router.rows.div_ceil(MAX_EXPERTS / shape.npr);
                    norm_in = self.expert_norm(&taken, router, mode, &act, n_groups);
                }
                if norm_in.is_none() {
                    self.run_quantize(Some(taken), x, mode, rows, experts.cols, &act);
                }
                *self.act_src.lock().unwrap_or_else(|e| e.into_inner()) = Some((x.buf.clone(), mode, n));
            }
        }
        // (The router's f32 input leaves the activation scratch as it is.)
        if route_shape.is_none() {
            self.run_all(ds);
            self.route(logits, rows, r, bias, ids, weights);
            return;
        }
        let mut d = ds.remove(0);
        let Kernel::MatmulVec(ty, outs, mut input, shape) = d.kernel else { unreachable!("matched above") };
        let shape = kernels::VecShape { rg: MAX_EXPERTS / shape.npr, ..shape };
        let z = d.groups[2];
        d.groups = grid(router.rows, shape.rg * shape.rr);
        d.groups[2] = z;
        // The route's words go at 11 (kernels.rs ROUTE_TAIL), the prologue's after them.
        let mut prologue = d.prm.split_off(11);
        d.prm.extend(self.route_prm(r, false));
        if let Some((i, prm, mut bufs)) = norm_in {
            // The norm's input row at 2 in place of `x`, its other buffers after the logits.
            input = i;
            prologue = prm;
            d.bufs[1] = bufs.remove(0);
            d.bufs.extend(bufs);
        }
        d.prm.extend(prologue);
        d.kernel = Kernel::MatmulVec(ty, kernels::Outs { route: true, ..outs }, input, shape);
        let counts = self.scratch(&self.route_counts, z as usize, "kiln route counts");
        d.bufs.extend([ids.buf.clone(), weights.buf.clone(), counts]);
        self.run_dispatch(d);
    }

    /// The held residual add and norm that writes an f32 router's input, as the prologue of
    /// the router's decode step (`Input::ExpertNorm`, its workgroups of MAX_EXPERTS
    /// invocations, `n_groups` of them; the first quantizes the norm in `mode` into `act`
    /// for the experts): the prologue's words and buffers (the norm's input row first), or
    /// none where that does not apply: a norm of several tokens, batch invariance (as for
    /// every prologue, mod.rs `prologue`), a row the workgroup memory or `prologue_bytes`
    /// does not take.
    fn expert_norm(
        &self,
        taken: &Pending,
        router: &GpuWeight,
        mode: u32,
        act: &wgpu::Buffer,
        n_groups: usize,
    ) -> Option<Prologue> {
        let k = router.cols;
        let ok = !self.batch_invariant
            && k.is_multiple_of(32)
            && self.prologue_fits(k, MAX_EXPERTS, true)
            && n_groups * k * 8 <= self.prologue_bytes;
        match taken {
            Pending::Norm { w, wlen, x, add: Some((y, scale, x_new)), eps, rows: 1, dim, out }
                if ok && *dim == k =>
            {
                Some((
                    Input::ExpertNorm(k as u32),
                    vec![mode, super::f(*eps), *wlen, super::f(*scale)],
                    vec![x.clone(), w.clone(), out.clone(), y.clone(), x_new.clone(), act.clone()],
                ))
            }
            _ => None,
        }
    }

    /// `Backend::moe_route`, with or without a selection bias.
    pub(super) fn moe_route_impl(
        &self,
        logits: &GpuBuf,
        rows: usize,
        r: &Routing,
        bias: Option<&[f32]>,
        ids: &mut GpuBuf,
        weights: &mut GpuBuf,
    ) {
        self.op();
        self.route(logits, rows, r, bias, ids, weights);
    }

    /// route.wgsl's parameters (its route_prm): `biased` where a selection bias follows.
    fn route_prm(&self, r: &Routing, biased: bool) -> [u32; kernels::ROUTE_WORDS] {
        let gating = match r.gating {
            Gating::Softmax => 0,
            Gating::Sigmoid => 1,
        };
        [r.n_expert as u32, r.k as u32, gating, r.norm as u32, r.scale.to_bits(), biased as u32]
    }

    fn route(
        &self,
        logits: &GpuBuf,
        rows: usize,
        r: &Routing,
        bias: Option<&[f32]>,
        ids: &mut GpuBuf,
        weights: &mut GpuBuf,
    ) {
        let mut prm = vec![rows as u32];
        prm.extend(self.route_prm(r, bias.is_some()));
        if let Some(b) = bias {
            prm.extend(b[..r.n_expert].iter().map(|v| v.to_bits()));
        }
        // A workgroup per token.
        self.run(Kernel::MoeRoute, &prm, &[&logits.buf, &ids.buf, &weights.buf], grid(rows, 1));
    }

    /// `x` (`rows` rows of `k`) as the matmul of `w` reads it: quantized to its dot type
    /// into the activation scratch (with the op that writes `x`, where it is held back; not
    /// again where `held`, what the scratch holds, says it is there), or `x` itself: the
    /// kernel's input, and the words where the block scales and sums start. (A decode
    /// step's down projection could make each slot's GLU in a prologue, as a dense matmul
    /// does; every workgroup of a slot would repeat it, and on an H200 the GLU's own
    /// kernel is faster.)
    fn expert_input(
        &self,
        x: &GpuBuf,
        w: &GpuExperts,
        rows: usize,
        held: Option<&(wgpu::Buffer, u32, usize)>,
    ) -> (wgpu::Buffer, u32, u32) {
        let k = w.cols;
        let Some((mode, bs)) = super::dot_mode(w.ty) else {
            return (x.buf.clone(), 0, 0);
        };
        let mut act = self.act_buf(rows * k);
        if held.is_none_or(|(b, m, n)| *b != x.buf || *m != mode || *n != rows * k) {
            let taken = self.take_writer(x, rows * k, bs);
            if let Some(Pending::Glu { gate_up: Some(d), .. }) = &taken {
                if d.bufs.contains(&act) {
                    act = self.scratch(&self.act_glu, rows * k, "kiln act glu");
                }
            }
            self.run_quantize(taken, x, mode, rows, k, &act);
        }
        let (xd, xs) = super::act_words(rows, k, bs);
        (act, xd, xs)
    }

    pub(super) fn matmul_id_impl(
        &self,
        ws: &[&GpuExperts],
        input: ExpertInput<GpuBuf>,
        outs: &mut [&mut GpuBuf],
    ) {
        let ExpertInput { x, per_slot, ids, rows, k } = input;
        // What the activation scratch holds (the router may have left `x` there), then
        // forgotten: the scratch is reused.
        let held = self.act_src.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.op();
        // Prompts on tiles, tokens grouped by expert (moe_coop.rs), where taken.
        if self.matmul_id_tiles(ws, input, outs, held.as_ref()) {
            return;
        }
        let n_slots = rows * k;
        let x_rows = if per_slot { n_slots } else { rows };
        let path = self.matmul;
        // The input as the last weight read it, and its dot type.
        let mut input = None;
        let mut input_mode = None;
        // The vec path takes two stacks of one buffer, one after the other in each expert
        // (gate and up: fused in the file, or loaded together), in one kernel with two
        // outputs; each row's sums are those of its own dispatch (the shape is by one
        // stack's rows, as each alone has it).
        let joint = path == MatmulPath::Vec
            && ws.len() == 2
            && Arc::ptr_eq(&ws[0].bufs, &ws[1].bufs)
            && ws[0].ty == ws[1].ty
            && ws[0].rows == ws[1].rows
            && ws[1].start == ws[0].start + ws[0].rows;
        let (both, both_ws);
        let (ws, out_sets): (&[&GpuExperts], Vec<Vec<&wgpu::Buffer>>) = if joint {
            both = GpuExperts { rows: 2 * ws[0].rows, ..ws[0].clone() };
            both_ws = [&both];
            (&both_ws[..], vec![outs.iter().map(|o| &o.buf).collect()])
        } else {
            (ws, outs.iter().map(|o| vec![&o.buf]).collect())
        };
        for (w, outs) in ws.iter().zip(out_sets) {
            // Each output's rows (its stride).
            let out_rows = w.rows / outs.len();
            // By the weight alone (a slot's sums are the same in any batch).
            let shape = kernels::vec_shape_for(w.ty, out_rows, w.cols, self.npr_min);
            // Quantized once for weights of one dot type (gate and up).
            let mode = super::dot_mode(w.ty);
            if input.is_none() || input_mode != mode {
                input = Some(self.expert_input(x, w, x_rows, held.as_ref()));
                input_mode = mode;
            }
            let (xbuf, xd, xs) = input.as_ref().expect("set above");
            for b in w.bufs.iter() {
                for s0 in (0..n_slots).step_by(MAX_SLOTS) {
                    let prm: [u32; kernels::EXPERT_WORDS] = [
                        w.rows as u32,
                        w.cols as u32,
                        n_slots as u32,
                        w.row_size as u32,
                        out_rows as u32,
                        0,
                        *xd,
                        *xs,
                        w.start as u32,
                        w.stride as u32,
                        k as u32,
                        per_slot as u32,
                        b.e0 as u32,
                        (b.e0 + b.n) as u32,
                        s0 as u32,
                    ];
                    let (kernel, mut g) = match path {
                        MatmulPath::Rows => (Kernel::MatmulId(w.ty, false), grid(w.rows, 64)),
                        MatmulPath::Exact => {
                            (Kernel::MatmulId(w.ty, true), grid(w.rows, super::kernels::EXACT_ROWS))
                        }
                        MatmulPath::Vec => (
                            Kernel::MatmulIdVec(w.ty, outs.len() as u8, IdTail::Off, shape),
                            grid(w.rows, shape.rg),
                        ),
                    };
                    g[2] = MAX_SLOTS.min(n_slots - s0) as u32;
                    if let Kernel::MatmulIdVec(..) = kernel {
                        // Bindings (kernels.rs): as the dense vec matmul's (the weights, the
                        // activations, the outputs, for wide units the activations and the
                        // weights again as 16-byte words), then the ids.
                        let mut bufs = vec![&b.buf, xbuf];
                        bufs.extend(&outs);
                        if kernels::vec_fast(w.ty) != 0 {
                            bufs.extend([xbuf, &b.buf]);
                        }
                        bufs.push(&ids.buf);
                        // A down projection in one dispatch is held: the weighted sum after
                        // it may run in its tail. So is a gate and up in one dispatch whose
                        // workgroups' rows lie in blocks of 256 of one of them: the GLU after
                        // it, and its quantize for the down, may run in its tail.
                        let whole = w.bufs.len() == 1 && n_slots <= MAX_SLOTS;
                        let dispatch = || Dispatch {
                            kernel,
                            prm: prm.to_vec(),
                            bufs: bufs.iter().map(|&b| b.clone()).collect(),
                            groups: g,
                        };
                        if outs.len() == 1 && per_slot && whole {
                            self.defer(Pending::Down { d: dispatch(), rows, k, dim: out_rows });
                        } else if outs.len() == 2
                            && whole
                            && out_rows.is_multiple_of(256)
                            && 256 % (shape.rg * shape.rr) == 0
                            && shape.rg * shape.npr >= 64
                        {
                            self.defer(Pending::GateUp { d: dispatch(), len: n_slots * out_rows });
                        } else {
                            self.run(kernel, &prm, &bufs, g);
                        }
                    } else {
                        self.run(kernel, &prm, &[&b.buf, xbuf, outs[0], &ids.buf], g);
                    }
                }
            }
        }
    }

    pub(super) fn moe_sum_impl(
        &self,
        y: &GpuBuf,
        weights: &GpuBuf,
        rows: usize,
        k: usize,
        dim: usize,
        out: &mut GpuBuf,
    ) {
        self.op();
        // After the down projection held for it: in its tail, the last of a token's slots
        // to finish a block of rows summing them (kernels.rs SUM_TAIL).
        let down = self.take_pending_if(|p| {
            matches!(p, Pending::Down { d, rows: r, k: kk, dim: dd }
                if d.bufs[2] == y.buf && (*r, *kk, *dd) == (rows, k, dim))
        });
        if let Some(Pending::Down { mut d, .. }) = down {
            let Kernel::MatmulIdVec(ty, n, IdTail::Off, shape) = d.kernel else {
                unreachable!("a down projection is held unsummed");
            };
            d.kernel = Kernel::MatmulIdVec(ty, n, IdTail::Sum, shape);
            let blocks = (d.groups[0] * d.groups[1]) as usize;
            let counts = self.scratch(&self.sum_counts, rows * blocks, "kiln expert sum counts");
            d.bufs.extend([weights.buf.clone(), out.buf.clone(), counts]);
            self.run_dispatch(d);
            return;
        }
        let prm = [(rows * dim) as u32, dim as u32, k as u32];
        self.run(Kernel::MoeSum, &prm, &[&y.buf, &weights.buf, &out.buf], grid(rows * dim, 64));
    }

    pub(super) fn add_sigmoid_gated_impl(
        &self,
        x: &mut GpuBuf,
        y: &GpuBuf,
        g: &GpuBuf,
        rows: usize,
        dim: usize,
    ) {
        self.op();
        let prm = [(rows * dim) as u32, dim as u32];
        self.run(Kernel::MoeGatedAdd, &prm, &[&x.buf, &y.buf, &g.buf], grid(rows * dim, 64));
    }
}
