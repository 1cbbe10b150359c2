//! The device layer: adapter choice, device and limits, and the recorder that batches
//! every op of a forward into one command submission (flushed by a read-back).

use ::wgpu;

use super::coop::CoopCaps;
use crate::error::{KilnError, Result};

/// Which adapters may be chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterPolicy {
    /// A hardware GPU, else a software Vulkan one (lavapipe): `--device gpu`.
    AnyGpu,
    /// Hardware only, never a CPU-type adapter: `--device auto`.
    HardwareOnly,
}

/// A wgpu device with the limits and features the kernels were built for (cloned: the same
/// device and queue).
#[derive(Clone)]
pub struct Context {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    /// Subgroup reductions in use (false: the portable fallback).
    pub subgroups: bool,
    /// Largest storage binding in bytes (weights larger than this are split by rows).
    pub max_binding: u64,
    pub max_buffer: u64,
    /// Storage-buffer offset alignment for the per-op parameter words.
    pub align: u64,
    /// Workgroup memory a kernel may use, in bytes (the vec matmul's prologue needs it).
    pub max_workgroup_storage: u32,
    /// Whether the driver's fma() rounds once, as the CPU's FMA does (probed at start).
    pub fused_fma: bool,
    /// The tile matmul's needs where the adapter meets them (coop.rs): 16x16x16 f16
    /// products into f32 on cooperative matrices, f16 in shaders, subgroups.
    pub coop: Option<CoopCaps>,
    /// f16 in shaders with subgroups (what the tile kernels need besides the matrices).
    f16: bool,
    /// The driver's compiled pipelines, kept on disk across runs where the adapter can
    /// (`PIPELINE_CACHE`; Vulkan), and where they are kept.
    pub pipeline_cache: Option<(wgpu::PipelineCache, std::path::PathBuf)>,
}

fn rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// Linux exposes every GPU a hardware Vulkan driver can drive as a device node (DRM render
/// nodes, NVIDIA's nodes, WSL's dxg). Without one, enumerating adapters would only load the
/// software drivers (lavapipe's LLVM: ~46 MiB resident) for `auto` to reject them.
#[cfg(target_os = "linux")]
fn may_have_hardware_gpu() -> bool {
    let node = |name: &str| name == "dri" || name == "dxg" || name.starts_with("nvidia");
    match std::fs::read_dir("/dev") {
        Ok(dir) => dir.flatten().any(|e| node(&e.file_name().to_string_lossy())),
        Err(_) => true,
    }
}

#[cfg(not(target_os = "linux"))]
fn may_have_hardware_gpu() -> bool {
    true
}

impl Context {
    /// Opens the best adapter the policy allows; `force_fallback` disables subgroups.
    pub fn new(policy: AdapterPolicy, force_fallback: bool) -> Result<Context> {
        if policy == AdapterPolicy::HardwareOnly && !may_have_hardware_gpu() {
            return Err(KilnError::Backend("no hardware GPU adapter found".into()));
        }
        // Vulkan on Linux and Windows, Metal on Apple, DX12 on Windows; never GL.
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
        let instance = wgpu::Instance::new(desc);
        let mut adapters = pollster::block_on(instance.enumerate_adapters(desc_backends()));
        adapters
            .retain(|a| policy == AdapterPolicy::AnyGpu || a.get_info().device_type != wgpu::DeviceType::Cpu);
        adapters.sort_by_key(|a| rank(a.get_info().device_type));
        let adapter = adapters.into_iter().next().ok_or_else(|| {
            KilnError::Backend(match policy {
                AdapterPolicy::AnyGpu => "no GPU adapter found (Vulkan, Metal or DX12)".into(),
                AdapterPolicy::HardwareOnly => "no hardware GPU adapter found".into(),
            })
        })?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let subgroups = !force_fallback && adapter.features().contains(wgpu::Features::SUBGROUP);
        let mut features = if subgroups { wgpu::Features::SUBGROUP } else { wgpu::Features::empty() };
        // The tile matmul: chosen by what the adapter reports, never by its name.
        let f16 = subgroups && adapter.features().contains(wgpu::Features::SHADER_F16);
        let coop_matrix = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        let tiles = f16
            && adapter.features().contains(coop_matrix)
            && adapter.cooperative_matrix_properties().iter().any(|p| {
                use wgpu::CooperativeScalarType::{F16, F32};
                (p.m_size, p.n_size, p.k_size) == (16, 16, 16) && p.ab_type == F16 && p.cr_type == F32
            });
        if f16 {
            features |= wgpu::Features::SHADER_F16;
        }
        if tiles {
            features |= coop_matrix;
        }
        let cache_file = adapter
            .features()
            .contains(wgpu::Features::PIPELINE_CACHE)
            .then(|| wgpu::util::pipeline_cache_key(&info))
            .flatten()
            .map(|key| crate::hub::kiln_home().join("gpu").join(format!("{key}.bin")));
        if cache_file.is_some() {
            features |= wgpu::Features::PIPELINE_CACHE;
        }
        // Timestamps for the per-kernel profile (`GpuBackend::set_profile`), where offered.
        let stamps = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        if adapter.features().contains(stamps) {
            features |= stamps;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("kiln"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: if tiles {
                // SAFETY: cooperative matrices are used by the tile kernels alone, as
                // WGSL's wgpu_cooperative_matrix extension defines them (coop.rs).
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            ..Default::default()
        }))
        .map_err(|e| KilnError::Backend(format!("cannot open {}: {e}", info.name)))?;
        let mut ctx = Context {
            device,
            queue,
            info,
            subgroups,
            max_binding: limits.max_storage_buffer_binding_size as u64,
            max_workgroup_storage: limits.max_compute_workgroup_storage_size,
            max_buffer: limits.max_buffer_size,
            align: (limits.min_storage_buffer_offset_alignment as u64).max(4),
            fused_fma: false,
            coop: None,
            f16,
            pipeline_cache: None,
        };
        ctx.coop = tiles.then(|| ctx.coop_caps(false));
        ctx.pipeline_cache = cache_file.map(|file| {
            let data = std::fs::read(&file).ok();
            // SAFETY: the data is what `get_data` wrote for this adapter (its key names
            // vendor and device; the driver checks its own version and ignores data it
            // does not accept: `fallback`).
            let cache = unsafe {
                ctx.device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                    label: Some("kiln pipelines"),
                    data: data.as_deref(),
                    fallback: true,
                })
            };
            (cache, file)
        });
        ctx.fused_fma = ctx.probe_fma()?;
        Ok(ctx)
    }

    fn coop_caps(&self, emulated: bool) -> CoopCaps {
        let limits = self.device.limits();
        CoopCaps {
            max_subgroup: self.info.subgroup_max_size,
            workgroup_storage: limits.max_compute_workgroup_storage_size,
            max_invocations: limits.max_compute_invocations_per_workgroup,
            emulated,
        }
    }

    /// The tile kernels with emulated matrix operations (coop.rs `Ops::Emulated`), where
    /// the adapter has f16 and subgroups (tests).
    pub fn coop_emulation(&self) -> Option<CoopCaps> {
        self.f16.then(|| self.coop_caps(true))
    }

    /// Writes the pipeline cache's data to disk (after the pipelines a model needs are
    /// built), atomically; failures only cost the next start its compile time.
    pub fn save_pipeline_cache(&self) {
        let Some((cache, file)) = &self.pipeline_cache else { return };
        let Some(data) = cache.get_data() else { return };
        if std::fs::read(file).is_ok_and(|old| old == data) {
            return;
        }
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        let written = file.parent().map(std::fs::create_dir_all).transpose().is_ok()
            && std::fs::write(&tmp, &data).is_ok()
            && std::fs::rename(&tmp, file).is_ok();
        if !written {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// Runs fma(1 + 2^-12, 1 + 2^-12, -(1 + 2^-11)): 2^-24 when fused, 0 when the
    /// product is rounded first (Vulkan allows either; lavapipe does the latter).
    fn probe_fma(&self) -> Result<bool> {
        let src = "@group(0) @binding(0) var<storage, read_write> v: array<f32>;
@compute @workgroup_size(1)
fn main() {
    v[3] = fma(v[0], v[1], v[2]);
}";
        let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("kiln fma probe"),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let pipe = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("kiln fma probe"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let a = 1.0 + 2f32.powi(-12);
        let buf =
            self.upload(bytemuck::cast_slice(&[a, a, -(1.0 + 2f32.powi(-11)), 0.0]), "kiln fma probe")?;
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipe.get_bind_group_layout(0),
            entries: &[wgpu::BindGroupEntry { binding: 0, resource: buf.as_entire_binding() }],
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipe);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        self.queue.submit([enc.finish()]);
        let mut rec = Recorder::new(self);
        let mut out = [0f32; 4];
        rec.read(self, &buf, &mut out)?;
        Ok(out[3] != 0.0)
    }

    pub fn storage(&self, bytes: u64, label: &str) -> Result<wgpu::Buffer> {
        // Whole 16-byte words: kernels read weights and activations 16 bytes at a time.
        let size = bytes.max(16).next_multiple_of(16);
        if size > self.max_binding || size > self.max_buffer {
            return Err(KilnError::Backend(format!(
                "{label}: {size} bytes exceed the device's storage binding limit ({} bytes)",
                self.max_binding
            )));
        }
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    }

    /// A storage buffer holding `bytes` (padded to whole words).
    pub fn upload(&self, bytes: &[u8], label: &str) -> Result<wgpu::Buffer> {
        let buf = self.storage(bytes.len() as u64, label)?;
        let whole = bytes.len() / 4 * 4;
        if whole > 0 {
            self.queue.write_buffer(&buf, 0, &bytes[..whole]);
        }
        if whole < bytes.len() {
            let mut tail = [0u8; 4];
            tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.queue.write_buffer(&buf, whole as u64, &tail);
        }
        Ok(buf)
    }
}

fn desc_backends() -> wgpu::Backends {
    wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12
}

/// Size of the per-step parameter arena; a forward needs far less.
const ARENA: u64 = 4 << 20;

/// Dispatches per submission within a step, at most.
const CHUNK: u32 = 64;
/// A step's first submission holds this many dispatches, each next one twice as many up to
/// the chunk: an idle GPU waits only for a short first chunk, and the host, faster per
/// dispatch than the GPU, stays ahead while the chunks grow.
const FIRST_CHUNK: u32 = 8;

/// Commands recorded since the last submission, and the parameter words they read.
pub struct Recorder {
    enc: Option<wgpu::CommandEncoder>,
    /// One compute pass for the dispatches between copies (wgpu orders them with barriers).
    pass: Option<wgpu::ComputePass<'static>>,
    arena: Vec<u8>,
    /// Bytes of `arena` already written for submitted chunks of this step.
    flushed: usize,
    arena_buf: wgpu::Buffer,
    /// Dispatches recorded since the last submission.
    pending: u32,
    /// Submissions made in this step (the next chunk is `FIRST_CHUNK << flushes`).
    flushes: u32,
    /// Read-back buffers: a step's read may still be in flight while the next is recorded.
    readbacks: [Option<wgpu::Buffer>; READS_IN_FLIGHT],
    /// The reads in flight, by read-back slot.
    in_flight: [Option<InFlight>; READS_IN_FLIGHT],
    next_slot: usize,
    /// The index of the last submission.
    last_submission: Option<wgpu::SubmissionIndex>,
    bind_groups: std::collections::HashMap<BindKey, wgpu::BindGroup>,
    /// Profiling (`set_profile`): per read-back (a decode step), what was recorded since the
    /// last.
    profile: Option<Profile>,
}

/// Reads started and not yet finished, at most (a pipelined decode has two: the step
/// being waited for and the one recorded after it).
const READS_IN_FLIGHT: usize = 2;

/// A read whose copy is submitted: its size, submission, and mapping's outcome.
struct InFlight {
    bytes: u64,
    submission: wgpu::SubmissionIndex,
    mapped: std::sync::mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
}

/// Bind groups kept at most (a model's decode and prefill steps need a few thousand).
const MAX_BIND_GROUPS: usize = 16384;

/// What a bind group binds: the pipeline's layout, the parameter range, the buffers.
#[derive(Clone, PartialEq, Eq, Hash)]
struct BindKey {
    pipe: wgpu::ComputePipeline,
    off: u64,
    size: u64,
    bufs: Vec<wgpu::Buffer>,
}

/// Work recorded between two read-backs. Level 2 also writes a GPU timestamp
/// before every dispatch (where the adapter has timestamp queries inside passes) and sums
/// the time to the next one per kernel: the kernel's run plus the barrier after it.
struct Profile {
    level: u8,
    stamps: Option<Stamps>,
    since: std::time::Instant,
    /// Host time spent recording dispatches, and waiting for the GPU at the read-back.
    record: std::time::Duration,
    /// Host time ending passes and submitting (where wgpu validates and encodes).
    submit: std::time::Duration,
    wait: std::time::Duration,
    dispatches: u64,
    bind_groups: u64,
    submissions: u64,
    param_bytes: u64,
}

/// Timestamps of one step's dispatches, and the kernel each one precedes.
struct Stamps {
    set: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    host: wgpu::Buffer,
    names: Vec<String>,
    period_ns: f64,
    per_kernel: std::collections::BTreeMap<String, (u64, f64)>,
}

/// Timestamps kept per step (a 7B decode step writes ~650).
const STAMPS: u32 = 4096;

impl Profile {
    fn new(ctx: &Context, stamps: Option<Stamps>, level: u8) -> Profile {
        let stamps = stamps.or_else(|| {
            let features = ctx.device.features();
            (level == 2 && features.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)).then(|| {
                let buf = |usage| {
                    ctx.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("kiln stamps"),
                        size: STAMPS as u64 * 8,
                        usage,
                        mapped_at_creation: false,
                    })
                };
                Stamps {
                    set: ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                        label: Some("kiln stamps"),
                        ty: wgpu::QueryType::Timestamp,
                        count: STAMPS,
                    }),
                    resolved: buf(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
                    host: buf(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
                    names: Vec::new(),
                    period_ns: ctx.queue.get_timestamp_period() as f64,
                    per_kernel: Default::default(),
                }
            })
        });
        Profile {
            level,
            stamps,
            since: std::time::Instant::now(),
            record: Default::default(),
            submit: Default::default(),
            wait: Default::default(),
            dispatches: 0,
            bind_groups: 0,
            submissions: 0,
            param_bytes: 0,
        }
    }
}

impl Recorder {
    pub fn new(ctx: &Context) -> Recorder {
        let arena_buf = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln params"),
            size: ARENA,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Recorder {
            enc: None,
            pass: None,
            arena: Vec::new(),
            flushed: 0,
            arena_buf,
            pending: 0,
            flushes: 0,
            readbacks: Default::default(),
            in_flight: Default::default(),
            next_slot: 0,
            last_submission: None,
            bind_groups: Default::default(),
            profile: None,
        }
    }

    /// Profiling level: 0 off, 1 per step, 2 per kernel too (GPU timestamps).
    pub fn set_profile(&mut self, ctx: &Context, level: u8) {
        self.profile = (level > 0).then(|| Profile::new(ctx, None, level));
    }

    fn encoder(&mut self, ctx: &Context) -> &mut wgpu::CommandEncoder {
        self.enc.get_or_insert_with(|| ctx.device.create_command_encoder(&Default::default()))
    }

    /// Records one dispatch of `pipe` with `params` at binding 0 and `bufs` after it.
    pub fn dispatch(
        &mut self,
        ctx: &Context,
        pipe: &wgpu::ComputePipeline,
        params: &[u32],
        bufs: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) {
        let bytes: &[u8] = bytemuck::cast_slice(params);
        let off = (self.arena.len() as u64).next_multiple_of(ctx.align);
        if off + bytes.len() as u64 > ARENA {
            self.submit(ctx);
        }
        let off = (self.arena.len() as u64).next_multiple_of(ctx.align);
        self.arena.resize(off as usize, 0);
        self.arena.extend_from_slice(bytes);
        // Bind groups are cached: a decode step repeats the same ops with the same
        // buffers and parameter offsets, so after the first step none is created.
        let key = BindKey {
            pipe: pipe.clone(),
            off,
            size: bytes.len() as u64,
            bufs: bufs.iter().map(|&b| b.clone()).collect(),
        };
        let t0 = self.profile.as_ref().map(|_| std::time::Instant::now());
        let created = !self.bind_groups.contains_key(&key);
        if created {
            if self.bind_groups.len() >= MAX_BIND_GROUPS {
                self.bind_groups.clear();
            }
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &self.arena_buf,
                    offset: off,
                    size: std::num::NonZeroU64::new(bytes.len().max(4) as u64),
                }),
            }];
            for (i, b) in bufs.iter().enumerate() {
                entries.push(wgpu::BindGroupEntry { binding: i as u32 + 1, resource: b.as_entire_binding() });
            }
            let bg = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipe.get_bind_group_layout(0),
                entries: &entries,
            });
            self.bind_groups.insert(key.clone(), bg);
        }
        let bg = self.bind_groups.get(&key).expect("inserted above").clone();
        if self.pass.is_none() {
            let pass = self.encoder(ctx).begin_compute_pass(&Default::default()).forget_lifetime();
            self.pass = Some(pass);
        }
        let pass = self.pass.as_mut().expect("made above");
        pass.set_pipeline(pipe);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        if let (Some(p), Some(t0)) = (&mut self.profile, t0) {
            p.dispatches += 1;
            p.bind_groups += created as u64;
            p.param_bytes += bytes.len() as u64;
            p.record += t0.elapsed();
        }
        self.pending += 1;
        // A step's commands go out in chunks so the GPU starts on the first layers while
        // wgpu still encodes the rest (its per-dispatch host cost is close to the GPU's).
        let limit = CHUNK.min(FIRST_CHUNK.saturating_mul(1 << self.flushes.min(16)));
        // While a read is in flight (a greedy step recorded ahead) the GPU is busy with the
        // step before: the step goes out whole at its read, saving submissions.
        let busy = self.in_flight.iter().any(Option::is_some);
        if self.pending >= limit && !busy {
            self.flush(ctx);
        }
    }

    /// Whether dispatches are timed one by one (profile level 2).
    pub fn timing_each(&self) -> bool {
        self.profile.as_ref().is_some_and(|p| p.stamps.is_some())
    }

    /// Writes a timestamp before the next dispatch (of kernel `name`; "" ends a step).
    pub fn stamp(&mut self, ctx: &Context, name: String) {
        if self.pass.is_none() {
            let pass = self.encoder(ctx).begin_compute_pass(&Default::default()).forget_lifetime();
            self.pass = Some(pass);
        }
        let Some(s) = self.profile.as_mut().and_then(|p| p.stamps.as_mut()) else { return };
        if s.names.len() < STAMPS as usize {
            self.pass.as_mut().expect("begun above").write_timestamp(&s.set, s.names.len() as u32);
            s.names.push(name);
        }
    }

    /// Submits what was recorded (its parameter words first) and keeps the arena's
    /// offsets, so a step's bind groups stay the same however it is chunked.
    fn flush(&mut self, ctx: &Context) {
        self.end_pass();
        let t0 = std::time::Instant::now();
        if let Some(enc) = self.enc.take() {
            if self.arena.len() > self.flushed {
                ctx.queue.write_buffer(&self.arena_buf, self.flushed as u64, &self.arena[self.flushed..]);
            }
            self.last_submission = Some(ctx.queue.submit([enc.finish()]));
            if let Some(p) = &mut self.profile {
                p.submissions += 1;
                p.submit += t0.elapsed();
            }
        }
        self.flushed = self.arena.len();
        self.pending = 0;
        self.flushes += 1;
    }

    /// Ends the compute pass: wgpu validates and encodes its dispatches here.
    fn end_pass(&mut self) {
        let t0 = std::time::Instant::now();
        if self.pass.take().is_some() {
            if let Some(p) = &mut self.profile {
                p.submit += t0.elapsed();
            }
        }
    }

    /// Submits what was recorded; the next dispatch starts a new arena.
    pub fn submit(&mut self, ctx: &Context) {
        self.flush(ctx);
        self.arena.clear();
        self.flushed = 0;
        self.flushes = 0;
    }

    /// Copies `out.len()` f32 values from the start of `buf` after everything recorded.
    pub fn read(&mut self, ctx: &Context, buf: &wgpu::Buffer, out: &mut [f32]) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        let slot = self.read_start(ctx, buf, out.len());
        self.read_finish(ctx, slot, out)
    }

    /// Submits everything recorded with a copy of `n` f32 values from the start of `buf`
    /// after it, and returns the read's slot for `read_finish`; the host may record more
    /// meanwhile. Reads finish in the order they start.
    pub fn read_start(&mut self, ctx: &Context, buf: &wgpu::Buffer, n: usize) -> usize {
        let slot = self.next_slot;
        self.next_slot = (slot + 1) % READS_IN_FLIGHT;
        assert!(self.in_flight[slot].is_none(), "more than {READS_IN_FLIGHT} GPU reads in flight");
        let bytes = (n.max(1) * 4) as u64;
        if self.readbacks[slot].as_ref().is_none_or(|b| b.size() < bytes) {
            self.readbacks[slot] = Some(ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kiln readback"),
                size: bytes.next_power_of_two().max(256),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        let rb = self.readbacks[slot].clone().expect("made above");
        let n_stamps = if self.timing_each() {
            self.stamp(ctx, String::new());
            self.profile.as_ref().and_then(|p| p.stamps.as_ref()).map_or(0, |s| s.names.len() as u32)
        } else {
            0
        };
        self.end_pass();
        if n_stamps > 0 {
            let s = self.profile.as_ref().and_then(|p| p.stamps.as_ref()).expect("counted above");
            let (set, resolved, host) = (s.set.clone(), s.resolved.clone(), s.host.clone());
            let enc = self.encoder(ctx);
            enc.resolve_query_set(&set, 0..n_stamps, &resolved, 0);
            enc.copy_buffer_to_buffer(&resolved, 0, &host, 0, n_stamps as u64 * 8);
        }
        self.encoder(ctx).copy_buffer_to_buffer(buf, 0, &rb, 0, bytes);
        self.submit(ctx);
        let (tx, rx) = std::sync::mpsc::channel();
        rb.map_async(wgpu::MapMode::Read, 0..bytes, move |r| {
            let _ = tx.send(r);
        });
        let submission = self.last_submission.clone().expect("submitted above");
        self.in_flight[slot] = Some(InFlight { bytes, submission, mapped: rx });
        slot
    }

    /// Waits for the read in `slot` (from `read_start`) and copies its values to `out`.
    pub fn read_finish(&mut self, ctx: &Context, slot: usize, out: &mut [f32]) -> Result<()> {
        let InFlight { bytes, submission, mapped } = self.in_flight[slot]
            .take()
            .ok_or_else(|| KilnError::Backend("no GPU read in flight there".into()))?;
        let rb = self.readbacks[slot].clone().expect("made by read_start");
        let t0 = std::time::Instant::now();
        ctx.device
            .poll(wgpu::PollType::Wait { submission_index: Some(submission), timeout: None })
            .map_err(|e| KilnError::Backend(format!("GPU wait failed: {e}")))?;
        if let Some(p) = &mut self.profile {
            p.wait += t0.elapsed();
        }
        mapped
            .recv()
            .map_err(|_| KilnError::Backend("GPU read-back was dropped".into()))?
            .map_err(|e| KilnError::Backend(format!("GPU read-back failed: {e}")))?;
        let n_stamps =
            self.profile.as_ref().and_then(|p| p.stamps.as_ref()).map_or(0, |s| s.names.len() as u32);
        {
            let view = rb
                .get_mapped_range(0..bytes)
                .map_err(|e| KilnError::Backend(format!("GPU read-back failed: {e:?}")))?;
            let k = out.len().min(bytes as usize / 4);
            out[..k].copy_from_slice(&bytemuck::cast_slice(&view)[..k]);
        }
        rb.unmap();
        if let Some(p) = &mut self.profile {
            eprintln!(
                "kiln gpu: {:.3} ms (recording {:.3} ms, submitting {:.3} ms, waiting for the GPU {:.3} ms), \
                 {} dispatches, {} bind groups made, {} submissions, {} param bytes, {} bytes read back",
                p.since.elapsed().as_secs_f64() * 1e3,
                p.record.as_secs_f64() * 1e3,
                p.submit.as_secs_f64() * 1e3,
                p.wait.as_secs_f64() * 1e3,
                p.dispatches,
                p.bind_groups,
                p.submissions,
                p.param_bytes,
                bytes
            );
            if let Some(s) = p.stamps.as_mut() {
                s.host.slice(..).map_async(wgpu::MapMode::Read, |_| ());
                let _ = ctx.device.poll(wgpu::PollType::wait_indefinitely());
                {
                    let view = s.host.get_mapped_range(..n_stamps as u64 * 8).expect("mapped above");
                    let t: &[u64] = bytemuck::cast_slice(&view);
                    for (i, w) in t.windows(2).enumerate() {
                        let e = s.per_kernel.entry(s.names[i].clone()).or_default();
                        e.0 += 1;
                        e.1 += w[1].saturating_sub(w[0]) as f64 * s.period_ns / 1e3;
                    }
                }
                s.host.unmap();
                s.names.clear();
                let total: f64 = s.per_kernel.values().map(|v| v.1).sum();
                eprintln!("  GPU time from the first dispatch to the read-back: {:.3} ms", total / 1e3);
                for (k, (n, us)) in std::mem::take(&mut s.per_kernel) {
                    eprintln!("  {k:<16} {n:>5} x {:8.2} us = {:8.3} ms", us / n as f64, us / 1e3);
                }
            }
            *p = Profile::new(ctx, p.stamps.take(), p.level);
        }
        Ok(())
    }
}
