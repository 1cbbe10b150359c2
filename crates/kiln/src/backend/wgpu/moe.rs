//! Mixture-of-experts ops on the GPU.

use std::sync::Arc;

use super::{GpuBackend, GpuBuf};
use crate::backend::Routing;
use crate::error::{KilnError, Result};
use crate::gguf::{GgufFile, TensorInfo};

/// A stack of expert matrices on the device.
pub struct GpuExperts {
    _private: (),
}

impl GpuBackend {
    pub(super) fn load_experts_impl(
        &self,
        _gguf: &Arc<GgufFile>,
        t: &TensorInfo,
        _n_expert: usize,
        _parts: &[usize],
    ) -> Result<Vec<GpuExperts>> {
        Err(KilnError::Tensor {
            name: t.name.clone(),
            msg: "mixture-of-experts layers do not run on the GPU yet".into(),
        })
    }

    pub(super) fn moe_route_impl(&self, _: &GpuBuf, _: usize, _: &Routing, _: &mut GpuBuf, _: &mut GpuBuf) {
        unreachable!("no experts load on the GPU")
    }
}

impl GpuBackend {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_id_impl(
        &self,
        _: &[&GpuExperts],
        _: &GpuBuf,
        _: bool,
        _: &GpuBuf,
        _: usize,
        _: usize,
        _: &mut [&mut GpuBuf],
    ) {
        unreachable!("no experts load on the GPU")
    }

    pub(super) fn moe_sum_impl(&self, _: &GpuBuf, _: &GpuBuf, _: usize, _: usize, _: usize, _: &mut GpuBuf) {
        unreachable!("no experts load on the GPU")
    }

    pub(super) fn add_sigmoid_gated_impl(&self, _: &mut GpuBuf, _: &GpuBuf, _: &GpuBuf, _: usize, _: usize) {
        unreachable!("no experts load on the GPU")
    }
}
