//! Prompt attention on cooperative matrices (tensor cores, shaders/attention_coop.wgsl):
//! its shape, the batches it takes, and the WGSL statements of its matrix operations, on
//! cooperative matrices or emulated per invocation (coop.rs `Ops`).

use super::coop::{CoopCaps, Ops};

/// Subgroups per workgroup, each taking 16 query tokens of the workgroup's head.
const NSG: u32 = 4;
/// Key positions per tile (every subgroup's 16 x bk scores, then its weights times the
/// tile's values): 32, or 16 where the adapter's workgroup memory holds no more.
const BKS: [u32; 2] = [32, 16];
/// Padding of a row of scores: four values put the rows four banks apart (the softmax's
/// invocations read their rows at once; unpadded they share one bank); none where the
/// adapter's workgroup memory holds no more.
const PADS: [u32; 2] = [4, 0];
/// The largest head the kernel takes: its accumulators and query tiles (head_dim / 16 of
/// each) stay in registers; larger heads (gemma's 256) keep the portable kernels.
pub const MAX_HEAD_DIM: usize = 128;

/// The kernel's shape: a head of `head_dim` (a multiple of 16), tiles of `bk` keys, rows
/// of scores padded by `pad` values, workgroups of NSG subgroups of up to `sg` invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttnShape {
    pub head_dim: u32,
    pub bk: u32,
    pub pad: u32,
    pub sg: u32,
    pub ops: Ops,
}

impl AttnShape {
    /// Query tokens per workgroup.
    pub fn bq(self) -> u32 {
        16 * NSG
    }
    fn wgs(self) -> u32 {
        NSG * self.sg
    }
    /// Workgroup memory in bytes: the staged rows (head_dim values and 8 of padding: the
    /// queries, a tile's keys or values), per subgroup (one more for subgroups past NSG)
    /// its f32 scores (bk and `pad`), f16 weights (bk and 8 of padding) and three values
    /// per query row, a zero tile and a flag.
    pub fn storage(self) -> u32 {
        let (hd, bk) = (self.head_dim, self.bk);
        (self.bq() + bk) * (hd + 8) * 2
            + (NSG + 1) * 16 * ((bk + self.pad) * 4 + (bk + 8) * 2 + 12)
            + 1024
            + 16
    }
}

/// The shape for heads of `head_dim`: the first tile of keys, with padded rows of scores
/// where they fit, whose workgroup the adapter can hold (memory, invocations; at most 256
/// of them for the quantizing tail, quantize_core.wgsl), else None: the portable kernels.
pub fn shape(caps: &CoopCaps, head_dim: usize) -> Option<AttnShape> {
    if head_dim == 0 || !head_dim.is_multiple_of(16) || head_dim > MAX_HEAD_DIM {
        return None;
    }
    let ops = if caps.emulated { Ops::Emulated } else { Ops::Coop };
    BKS.into_iter()
        .flat_map(|bk| {
            PADS.map(|pad| AttnShape { head_dim: head_dim as u32, bk, pad, sg: caps.max_subgroup, ops })
        })
        .find(|s| s.storage() <= caps.workgroup_storage && s.wgs() <= caps.max_invocations && s.wgs() <= 256)
}

/// The kernel's source after the shared parts: its constants, the emulated operations
/// where asked, and the body with its matrix statements written out.
pub fn source(s: AttnShape, body: &str) -> String {
    let (hd, bk) = (s.head_dim, s.bk);
    let mut out = format!(
        "const HD: u32 = {hd}u;\nconst HT: u32 = {}u;\nconst BK: u32 = {bk}u;\nconst NC: u32 = {}u;\n\
         const NSG: u32 = {NSG}u;\nconst BQ: u32 = {}u;\nconst WGS: u32 = {}u;\nconst SS: u32 = {}u;\n",
        hd / 16,
        bk / 16,
        s.bq(),
        s.wgs(),
        bk + s.pad,
    );
    if s.ops == Ops::Emulated {
        out.push_str(EMULATED);
    }
    let st = match s.ops {
        Ops::Coop => coop_statements(s),
        Ops::Emulated => Statements {
            oinit: EMU_OINIT.into(),
            qk: EMU_QK.into(),
            rescale: EMU_RESCALE.into(),
            pv: EMU_PV.into(),
            out: EMU_OUT.into(),
        },
    };
    let body = body
        .replace("//OINIT\n", &st.oinit)
        .replace("//QK\n", &st.qk)
        .replace("//RESCALE\n", &st.rescale)
        .replace("//PV\n", &st.pv)
        .replace("//OUT\n", &st.out)
        .replace("@workgroup_size(WGS)", &format!("@workgroup_size({})", s.wgs()));
    out.push_str(&body);
    out
}

/// The enable directives the kernel's text starts with.
pub fn enables(s: AttnShape) -> &'static str {
    match s.ops {
        Ops::Coop => "enable f16;\nenable wgpu_cooperative_matrix;\n",
        Ops::Emulated => "enable f16;\n",
    }
}

/// The kernel's matrix statements (attention_coop.wgsl's markers).
struct Statements {
    oinit: String,
    qk: String,
    rescale: String,
    pv: String,
    out: String,
}

/// The statements on cooperative matrices, written out (no arrays of matrices, no loops:
/// every index static): the subgroup's accumulators `o_j` (zeros from `zs`), j over
/// head_dim / 16; per key tile, each 16-key block's scores from the query tiles (row-major:
/// a token's values contiguous, loaded from `qsv` once, to registers) and the keys
/// column-major (a key's values contiguous), stored row-major to the subgroup's scores;
/// the accumulators through `ss` where the rows' weights were rescaled; the weights
/// (row-major) times the values (row-major: a key's values contiguous); and at the end
/// each accumulator to the output.
fn coop_statements(s: AttnShape) -> Statements {
    let (ht, nc) = (s.head_dim / 16, s.bk / 16);
    let mut st = Statements {
        oinit: String::new(),
        qk: String::new(),
        rescale: String::new(),
        pv: String::new(),
        out: String::new(),
    };
    for j in 0..ht {
        st.oinit.push_str(&format!(
            "    var o_{j} = coopLoadT<coop_mat16x16<f32, C>>(&zs[0], 16u);\n    \
             let q_{j} = coopLoadT<coop_mat16x16<f16, A>>(&qsv[qb + {}u], SR);\n",
            4 * j
        ));
        st.rescale.push_str(&format!(
            "            coopStoreT(o_{j}, &ss[so], 16u);\n            workgroupBarrier();\n            \
             rescale_tile(so, ro, sgi, sgn);\n            workgroupBarrier();\n            \
             o_{j} = coopLoadT<coop_mat16x16<f32, C>>(&ss[so], 16u);\n            workgroupBarrier();\n"
        ));
        st.out.push_str(&format!(
            "    coopStoreT(o_{j}, &ss[so], 16u);\n    workgroupBarrier();\n    \
             out_tile({j}u, so, ro, sgi, sgn, live, tb, h);\n    workgroupBarrier();\n"
        ));
    }
    for c in 0..nc {
        st.qk.push_str("        {\n            var s = coopLoadT<coop_mat16x16<f32, C>>(&zs[0], 16u);\n");
        for j in 0..ht {
            st.qk.push_str(&format!(
                "            s = coopMultiplyAdd(q_{j}, coopLoad<coop_mat16x16<f16, B>>(&kvs[{}u], SR), s);\n",
                16 * c * (s.head_dim / 4 + 2) + 4 * j
            ));
        }
        st.qk.push_str(&format!("            coopStoreT(s, &ss[so + {}u], SS);\n        }}\n", 16 * c));
        st.pv.push_str(&format!(
            "        {{\n            let p = coopLoadT<coop_mat16x16<f16, A>>(&ps[po + {}u], PR);\n",
            4 * c
        ));
        for j in 0..ht {
            st.pv.push_str(&format!(
                "            o_{j} = coopMultiplyAdd(p, coopLoadT<coop_mat16x16<f16, B>>(&kvs[{}u], SR), o_{j});\n",
                16 * c * (s.head_dim / 4 + 2) + 4 * j
            ));
        }
        st.pv.push_str("        }\n");
    }
    st
}

/// The emulated statements, in loops (one call site each: quick to compile on software
/// adapters).
const EMU_OINIT: &str = "    for (var j = 0u; j < HT; j = j + 1u) {
        emu_zero_o(j);
    }
";
const EMU_QK: &str = "        for (var c = 0u; c < NC; c = c + 1u) {
            emu_zero_s();
            for (var j = 0u; j < HT; j = j + 1u) {
                emu_mma_qk(qb + 4u * j, 16u * c * SR + 4u * j);
            }
            emu_store_s(so + 16u * c, sgi);
        }
";
const EMU_RESCALE: &str = "            for (var j = 0u; j < HT; j = j + 1u) {
                emu_store_o(j, so, sgi);
                workgroupBarrier();
                rescale_tile(so, ro, sgi, sgn);
                workgroupBarrier();
                emu_load_o(j, so);
                workgroupBarrier();
            }
";
const EMU_PV: &str = "        for (var c = 0u; c < NC; c = c + 1u) {
            emu_load_p(po + 4u * c);
            for (var j = 0u; j < HT; j = j + 1u) {
                emu_mma_pv(j, 16u * c * SR + 4u * j);
            }
        }
";
const EMU_OUT: &str = "    for (var j = 0u; j < HT; j = j + 1u) {
        emu_store_o(j, so, sgi);
        workgroupBarrier();
        out_tile(j, so, ro, sgi, sgn, live, tb, h);
        workgroupBarrier();
    }
";

/// The matrix operations on 16x16 tiles held whole by every invocation, in private arrays
/// (f16 values are exact in f32; each product summed in order of k).
const EMULATED: &str = "var<private> emu_o: array<array<f32, 256>, HT>;
var<private> emu_s: array<f32, 256>;
var<private> emu_p: array<f32, 256>;

fn emu_zero_o(j: u32) {
    for (var e = 0u; e < 256u; e = e + 1u) {
        emu_o[j][e] = 0.0;
    }
}

fn emu_zero_s() {
    for (var e = 0u; e < 256u; e = e + 1u) {
        emu_s[e] = 0.0;
    }
}

// Scores += the query tile at `qat` of `qsv` (a token's values contiguous) times the keys
// from row `at` (a key's values contiguous).
fn emu_mma_qk(qat: u32, at: u32) {
    for (var m = 0u; m < 16u; m = m + 1u) {
        for (var n = 0u; n < 16u; n = n + 1u) {
            var s = emu_s[16u * m + n];
            for (var k = 0u; k < 16u; k = k + 1u) {
                s = s + f32(qsv[qat + m * SR + k / 4u][k % 4u]) * f32(kvs[at + n * SR + k / 4u][k % 4u]);
            }
            emu_s[16u * m + n] = s;
        }
    }
}

fn emu_store_s(at: u32, lane: u32) {
    if lane == 0u {
        for (var e = 0u; e < 256u; e = e + 1u) {
            ss[at + e / 16u * SS + e % 16u] = emu_s[e];
        }
    }
}

fn emu_load_p(at: u32) {
    for (var m = 0u; m < 16u; m = m + 1u) {
        for (var k = 0u; k < 16u; k = k + 1u) {
            emu_p[16u * m + k] = f32(ps[at + m * PR + k / 4u][k % 4u]);
        }
    }
}

// Accumulator j += the weights times the values from row `at` (a key's values contiguous).
fn emu_mma_pv(j: u32, at: u32) {
    for (var m = 0u; m < 16u; m = m + 1u) {
        for (var n = 0u; n < 16u; n = n + 1u) {
            var s = emu_o[j][16u * m + n];
            for (var k = 0u; k < 16u; k = k + 1u) {
                s = s + emu_p[16u * m + k] * f32(kvs[at + k * SR + n / 4u][n % 4u]);
            }
            emu_o[j][16u * m + n] = s;
        }
    }
}

fn emu_store_o(j: u32, at: u32, lane: u32) {
    if lane == 0u {
        for (var e = 0u; e < 256u; e = e + 1u) {
            ss[at + e] = emu_o[j][e];
        }
    }
}

fn emu_load_o(j: u32, at: u32) {
    for (var e = 0u; e < 256u; e = e + 1u) {
        emu_o[j][e] = ss[at + e];
    }
}
";
