//! The tile (cooperative-matrix) kernel tests' shared pieces: a GPU on the vec path, one
//! whose tile kernels run (on real cooperative matrices where the adapter has them, else
//! emulated), which of the tests' tiers runs, and the check that a kernel's WGSL validates
//! and writes as SPIR-V, which is what an adapter with real cooperative matrices compiles.
#![allow(dead_code)]

use kiln::backend::wgpu::{AdapterPolicy, GpuBackend, MatmulPath};
use kiln::backend::Backend;

pub fn gpu() -> GpuBackend {
    let mut g = GpuBackend::with_fallback(AdapterPolicy::AnyGpu, false)
        .expect("no Vulkan adapter: install mesa-vulkan-drivers (lavapipe) to run the GPU tests");
    g.set_matmul_path(MatmulPath::Vec);
    g
}

/// A GPU whose tile kernels run where the engine chooses them.
pub fn tile_gpu() -> GpuBackend {
    let mut g = gpu();
    assert!(g.emulate_coop(), "{}: no f16 with subgroups, so no tile kernels to test", g.name());
    eprintln!(
        "tiles on {} ({}): {:?}",
        g.name(),
        if g.has_coop_hardware() { "cooperative matrices" } else { "emulated" },
        g.coop_caps()
    );
    g
}

/// The slow tier of the tile tests: on real cooperative matrices (quick there), or with
/// `KILN_FULL=1` (emulated tiles are slow on software adapters).
pub fn full_tier(gpu: &GpuBackend) -> bool {
    gpu.has_coop_hardware() || std::env::var("KILN_FULL").is_ok_and(|v| v == "1")
}

/// Panics, naming `what`, unless `src` parses, validates with subgroups and cooperative
/// matrices, and writes as SPIR-V 1.5.
pub fn compiles_to_spirv(src: &str, what: &str) {
    let module =
        naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(src)));
    let mut v =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    v.subgroup_stages(naga::valid::ShaderStages::COMPUTE);
    v.subgroup_operations(naga::valid::SubgroupOperationSet::all());
    let info = v.validate(&module).unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(src)));
    // The tile loads and stores take 16-byte aligned rows: with every workgroup variable a
    // multiple of 16 bytes, no layout a driver picks moves an array off that alignment.
    for (_, var) in module.global_variables.iter() {
        if var.space == naga::AddressSpace::WorkGroup {
            let size = module.types[var.ty].inner.size(module.to_ctx());
            assert!(size.is_multiple_of(16), "{what}: workgroup variable {:?} takes {size} bytes", var.name);
        }
    }
    let opts = naga::back::spv::Options {
        lang_version: (1, 5),
        flags: naga::back::spv::WriterFlags::empty(),
        ..Default::default()
    };
    naga::back::spv::write_vec(&module, &info, &opts, None).unwrap_or_else(|e| panic!("{what}: {e}"));
}
