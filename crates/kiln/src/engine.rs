//! `Engine`: a loaded model (weights on a backend, tokenizer, chat template, KV pool),
//! shared by the sessions that talk to it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::backend::cpu::{default_threads, AttnArith, CpuBackend};
use crate::chat::ChatTemplate;
use crate::error::{KilnError, Result};
use crate::gguf::GgufFile;
use crate::grammar::{CompiledGrammar, GrammarEnv, GrammarSpec};
use crate::kv::KvTypes;
use crate::model::{Model, ModelConfig, ModelRunner, Runner};
use crate::progress::{ProgressFn, Stage};
use crate::quant::GgmlType;
use crate::session::{Session, SessionOptions};
use crate::spec::SpecOptions;
use crate::tokenizer::Tokenizer;

/// Where the model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// A GPU when one is usable, else the CPU.
    #[default]
    Auto,
    /// The CPU backend (SIMD chosen at run time).
    Cpu,
    /// The GPU backend (wgpu).
    Gpu,
}

impl std::str::FromStr for Device {
    type Err = KilnError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "gpu" => Ok(Device::Gpu),
            _ => Err(KilnError::invalid(format!("unknown device {s:?} (expected auto, cpu or gpu)"))),
        }
    }
}

/// How to load a model. `Default` gives the CLI's defaults.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Context per sequence; default min(trained context, 4096).
    pub n_ctx: Option<usize>,
    /// CPU threads; default the number of cores.
    pub n_threads: Option<usize>,
    /// Most tokens one forward pass takes (llama.cpp's n_ubatch).
    pub n_batch: usize,
    /// Sequences that can hold a full context at once (KV pool = n_ctx × n_seq slots).
    pub n_seq: usize,
    pub device: Device,
    /// Most tokens the prefix cache keeps computed for reuse (rounded down to blocks of
    /// 32). `None` (the default): the whole KV pool, `n_ctx × n_seq` tokens; cached
    /// blocks no sequence uses are evicted, least recently used first, whenever a
    /// sequence needs room, so the cache never costs memory of its own. `Some(0)` turns
    /// it off.
    pub prefix_cache_tokens: Option<usize>,
    /// The CPU attention's arithmetic: by default ggml's f16 accumulators over the first
    /// 256 positions (bit-identical with llama.cpp's CPU there) and f32 ones past them;
    /// ggml's everywhere ([`AttnArith::Ggml`]), or f32 everywhere ([`AttnArith::F32`]: ~1.5x
    /// faster prompt attention, logits within llama.cpp's own flash-attention on/off
    /// spread). The GPU's exact path follows ggml's everywhere.
    pub attn_arith: AttnArith,
    /// Record a greedy step of one sequence ahead, before the current step's token is read
    /// back, where the backend can take that token on the device (the GPU): the device never
    /// waits for the host between steps, at the price of one step of work at the end of each
    /// generation. On by default; off gives one step at a time (for measurements).
    pub greedy_lookahead: bool,
    /// How the KV cache stores keys (`k`) and values (`v`): f16 (the default), or a block
    /// type of [`crate::kv::CACHE_TYPES`] (llama.cpp's `-ctk`/`-ctv`; `q8_0` takes 34/64 of
    /// the memory of f16; see [`crate::kv::KvTypes`]). The CPU backend only.
    pub kv_types: KvTypes,
    /// Speculative decoding: a draft model or prompt lookup, and the drafts' lengths (see
    /// [`crate::spec`]). Off by default.
    pub spec: SpecOptions,
    /// Where progress of downloading, loading and uploading the model goes (none by default).
    pub progress: Option<ProgressFn>,
    /// Keep every sequence on one arithmetic whatever shares its batch: its outputs alone
    /// and inside any batch are then identical. Off by default: where the GPU has
    /// cooperative matrices, prompt chunks and decode batches of 32 tokens or more run on
    /// them (far faster), and a token's sums then depend on its batch's size, as in
    /// llama.cpp and vLLM. The CPU is always batch invariant.
    pub batch_invariant: bool,
    /// GPU profiling printed to stderr after each step: 0 off, 1 the host's time recording,
    /// submitting and waiting, 2 also each kernel's GPU time (timestamps).
    pub gpu_profile: u8,
    /// A multimodal projector file (llama.cpp's mmproj GGUF): the vision encoder that lets
    /// sessions take images. Its output width must be the model's embedding width.
    pub mmproj: Option<PathBuf>,
    /// Encoders' F16 matmuls on the CPU (embedding and reranking models, vision encoders) on
    /// AMX-BF16 tiles where the CPU has them: about twice as fast, each row's result
    /// independent of the batch, the sums in the tile unit's order (within float rounding
    /// of llama.cpp's, not its bits). Off: tinyBLAS's order, as decoders' F16 matmuls and
    /// llama.cpp's CPU take it. On by default.
    pub encoder_amx: bool,
    /// The chat template in place of the model file's (`--chat-template`): a Jinja source
    /// or a built-in name (`chat::builtin`: llama.cpp's formats by their names), for models
    /// whose file has none or a wrong one.
    pub chat_template: Option<String>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_ctx: None,
            n_threads: None,
            n_batch: 512,
            n_seq: 1,
            device: Device::Auto,
            prefix_cache_tokens: None,
            attn_arith: AttnArith::default(),
            greedy_lookahead: true,
            kv_types: KvTypes::default(),
            spec: SpecOptions::default(),
            progress: None,
            batch_invariant: false,
            gpu_profile: 0,
            mmproj: None,
            encoder_amx: true,
            chat_template: None,
        }
    }
}

impl EngineOptions {
    /// The vision encoder's mmproj file.
    pub fn with_mmproj(mut self, path: impl Into<PathBuf>) -> Self {
        self.mmproj = Some(path.into());
        self
    }

    /// Context per sequence.
    pub fn with_n_ctx(mut self, n: usize) -> Self {
        self.n_ctx = Some(n);
        self
    }
    /// CPU threads.
    pub fn with_threads(mut self, n: usize) -> Self {
        self.n_threads = Some(n);
        self
    }
    /// Most tokens per forward pass.
    pub fn with_batch(mut self, n: usize) -> Self {
        self.n_batch = n;
        self
    }
    /// Sequences that can each hold a full context at once.
    pub fn with_n_seq(mut self, n: usize) -> Self {
        self.n_seq = n;
        self
    }
    /// Where the model runs.
    pub fn with_device(mut self, d: Device) -> Self {
        self.device = d;
        self
    }
    /// The chat template in place of the file's (see [`EngineOptions::chat_template`]).
    pub fn with_chat_template(mut self, template: impl Into<String>) -> Self {
        self.chat_template = Some(template.into());
        self
    }
    /// Encoders' F16 matmuls on AMX tiles where present (see [`EngineOptions::encoder_amx`]).
    pub fn with_encoder_amx(mut self, on: bool) -> Self {
        self.encoder_amx = on;
        self
    }
    /// The CPU attention's arithmetic (see [`EngineOptions::attn_arith`]).
    pub fn with_attn_arith(mut self, a: AttnArith) -> Self {
        self.attn_arith = a;
        self
    }
    /// Reports progress of downloading, loading and uploading the model to `f`.
    pub fn with_progress(mut self, f: ProgressFn) -> Self {
        self.progress = Some(f);
        self
    }
    /// Whether greedy steps are recorded ahead (see [`EngineOptions::greedy_lookahead`]).
    pub fn with_greedy_lookahead(mut self, on: bool) -> Self {
        self.greedy_lookahead = on;
        self
    }
    /// One arithmetic for every batch (see [`EngineOptions::batch_invariant`]).
    pub fn with_batch_invariant(mut self, on: bool) -> Self {
        self.batch_invariant = on;
        self
    }
    /// GPU profiling (see [`EngineOptions::gpu_profile`]).
    pub fn with_gpu_profile(mut self, level: u8) -> Self {
        self.gpu_profile = level;
        self
    }
    /// How the KV cache stores keys and values (see [`EngineOptions::kv_types`]).
    pub fn with_kv_types(mut self, k: GgmlType, v: GgmlType) -> Self {
        self.kv_types = KvTypes { k, v };
        self
    }
    /// Speculative decoding settings (see [`EngineOptions::spec`]).
    pub fn with_spec(mut self, spec: SpecOptions) -> Self {
        self.spec = spec;
        self
    }
    /// Bounds the prefix cache (see [`EngineOptions::prefix_cache_tokens`]); 0 disables it.
    pub fn with_prefix_cache_tokens(mut self, n: usize) -> Self {
        self.prefix_cache_tokens = Some(n);
        self
    }
}

pub(crate) struct EngineInner {
    pub path: PathBuf,
    pub gguf: Arc<GgufFile>,
    pub runner: Box<dyn Runner>,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub n_ctx: usize,
    pub load_ms: f64,
    /// The model file's sha256 (hex), computed on first use (session files are bound to it).
    pub sha256: OnceLock<String>,
    /// The vocabulary as the grammar engine sees it, built on first use.
    pub grammar_env: OnceLock<Arc<GrammarEnv>>,
    /// The vision encoder, when an mmproj file was given.
    pub vision: Option<Arc<crate::vision::VisionEncoder>>,
    /// How sessions speculate, and the draft model's runner where one drafts.
    pub spec: SpecOptions,
    pub draft: Option<Box<dyn Runner>>,
    /// A reranker's classification head, read on first use (or why there is none).
    pub classifier: OnceLock<std::result::Result<Arc<crate::embed::Classifier>, String>>,
}

#[cfg(feature = "gpu")]
type GpuBackend = crate::backend::wgpu::GpuBackend;
#[cfg(not(feature = "gpu"))]
type GpuBackend = ();

/// Where an engine's models run: a GPU (each model on a backend of its own), or the CPU
/// (the models' backends sharing one thread pool). One lives while an engine loads.
#[allow(clippy::large_enum_variant)]
enum Backends {
    /// The backend for the first model (given, or found); later models ask for their own.
    #[cfg(feature = "gpu")]
    Gpu(std::cell::Cell<Option<GpuBackend>>),
    Cpu(CpuBackend),
}

impl Backends {
    fn new(opts: &EngineOptions, gpu: Option<GpuBackend>, n_threads: usize) -> Result<Self> {
        let gpu = match gpu {
            Some(g) => Some(g),
            None => gpu_backend(opts)?,
        };
        #[cfg(feature = "gpu")]
        if let Some(gpu) = gpu {
            return Ok(Backends::Gpu(std::cell::Cell::new(Some(gpu))));
        }
        #[cfg(not(feature = "gpu"))]
        let _ = gpu;
        Ok(Backends::Cpu(
            CpuBackend::new(n_threads).with_attn_arith(opts.attn_arith).with_encoder_amx(opts.encoder_amx),
        ))
    }
}

impl Backends {
    /// An mmproj file's vision encoder on the engine's device: on a GPU, a backend beside the
    /// model's on the same device (its pipelines built now on a hardware adapter, as the
    /// model's are); on the CPU, a thread pool of its own. An encoder the GPU's kernels cannot
    /// take (matrix rows not a multiple of 32 values) runs on the CPU instead
    /// (`VisionEncoder::backend_name` says where).
    fn load_vision(
        &self,
        g: Arc<GgufFile>,
        n_threads: usize,
        amx: bool,
    ) -> Result<crate::vision::VisionEncoder> {
        let on_cpu = |g| {
            crate::vision::VisionEncoder::load(g, Arc::new(CpuBackend::new(n_threads).with_encoder_amx(amx)))
        };
        match self {
            #[cfg(feature = "gpu")]
            Backends::Gpu(first) => {
                let model_gpu = first.take();
                let gpu = model_gpu.as_ref().map(GpuBackend::sibling).transpose();
                first.set(model_gpu);
                let gpu = match gpu? {
                    Some(g) => g,
                    None => GpuBackend::new(crate::backend::wgpu::AdapterPolicy::AnyGpu)?,
                };
                let software = gpu.is_software();
                let gpu = Arc::new(gpu);
                let enc = match crate::vision::VisionEncoder::load(g.clone(), gpu.clone()) {
                    Ok(enc) => enc,
                    Err(_) => return on_cpu(g),
                };
                if !software {
                    enc.warm_up()?;
                    gpu.save_pipeline_cache();
                }
                Ok(enc)
            }
            Backends::Cpu(_) => on_cpu(g),
        }
    }
}

/// Loads a model file onto the engine's backends (its label for progress; whether it is
/// a draft model, `Model::into_draft`).
type LoadFn<'a> = dyn Fn(&Arc<GgufFile>, &str, bool) -> Result<Box<dyn Runner>> + 'a;

/// Loads the draft model `name` for an engine of context `n_ctx` with `load`, after
/// checking that its vocabulary and context fit the model's.
fn load_draft(
    name: &str,
    opts: &EngineOptions,
    tokenizer: &Tokenizer,
    n_ctx: usize,
    load: &LoadFn,
) -> Result<Box<dyn Runner>> {
    let path = crate::hub::resolve_model_with(name, opts.progress.as_ref())?;
    let gguf = Arc::new(GgufFile::open(&path)?);
    let cfg = ModelConfig::from_gguf(&gguf)?;
    if cfg.is_recurrent() {
        return Err(KilnError::invalid(format!(
            "the draft model {}: {} keeps a recurrent state, which a rejected draft cannot roll back by token",
            path.display(),
            cfg.arch
        )));
    }
    if cfg.n_ctx_train < n_ctx {
        return Err(KilnError::invalid(format!(
            "the draft model {} was trained for {} tokens of context, less than the context ({n_ctx})",
            path.display(),
            cfg.n_ctx_train
        )));
    }
    let draft_tok = Tokenizer::from_gguf(&gguf)?;
    crate::spec::draft::check_compatible(tokenizer, &draft_tok)
        .map_err(|e| KilnError::invalid(format!("{}: {e}", path.display())))?;
    let label = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    load(&gguf, &label, true)
}

/// The GPU backend the device asks for: `gpu` takes any GPU adapter (a software one too)
/// and fails without one; `auto` takes a hardware GPU only, else the CPU runs the model.
fn gpu_backend(opts: &EngineOptions) -> Result<Option<GpuBackend>> {
    #[cfg(feature = "gpu")]
    {
        use crate::backend::wgpu::AdapterPolicy;
        let gpu = match opts.device {
            Device::Cpu => None,
            Device::Gpu => Some(GpuBackend::new(AdapterPolicy::AnyGpu)?),
            Device::Auto => GpuBackend::new(AdapterPolicy::HardwareOnly).ok(),
        };
        Ok(gpu.map(|mut g| {
            g.set_batch_invariant(opts.batch_invariant);
            g.set_profile(opts.gpu_profile);
            g
        }))
    }
    #[cfg(not(feature = "gpu"))]
    match opts.device {
        Device::Gpu => Err(KilnError::Backend("this kiln was built without the `gpu` feature".into())),
        _ => Ok(None),
    }
}

/// A runner behind the object-safe trait, with its prefix cache bounded to `blocks`.
fn boxed<B: crate::backend::Backend>(
    r: ModelRunner<B>,
    blocks: Option<usize>,
    lookahead: bool,
) -> Box<dyn Runner> {
    let r = r.with_lookahead(lookahead);
    Box::new(match blocks {
        Some(n) => r.with_prefix_cache(n),
        None => r,
    })
}

/// The most CPU threads an engine starts: a bound on input, far above any machine's cores.
pub const MAX_THREADS: usize = 1024;

/// A loaded model. Cloning is cheap (an `Arc`); sessions hold one.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<EngineInner>,
}

impl Engine {
    /// Loads a `.gguf` path or a catalog name (fetched on first use).
    pub fn load(model: impl AsRef<str>, opts: EngineOptions) -> Result<Engine> {
        Self::load_on(model.as_ref(), opts, None)
    }

    /// Loads onto a GPU backend the caller opened and set up (an adapter, a matmul path:
    /// tests and tools); `opts.device` is not consulted.
    #[cfg(feature = "gpu")]
    pub fn load_with_gpu(model: impl AsRef<str>, opts: EngineOptions, gpu: GpuBackend) -> Result<Engine> {
        Self::load_on(model.as_ref(), opts, Some(gpu))
    }

    fn load_on(model: &str, opts: EngineOptions, gpu: Option<GpuBackend>) -> Result<Engine> {
        let t0 = Instant::now();
        let path = crate::hub::resolve_model_with(model, opts.progress.as_ref())?;
        let gguf = Arc::new(GgufFile::open(&path)?);
        let cfg = ModelConfig::from_gguf(&gguf)?;
        let n_ctx = opts.n_ctx.unwrap_or(cfg.n_ctx_train.min(4096));
        if n_ctx == 0 || n_ctx > cfg.n_ctx_train {
            return Err(KilnError::invalid(format!(
                "context size {n_ctx} is beyond the model's trained context ({})",
                cfg.n_ctx_train
            )));
        }
        if opts.n_batch == 0 || opts.n_seq == 0 {
            return Err(KilnError::invalid("batch size and sequence count must be at least 1"));
        }
        if opts.n_threads.is_some_and(|n| n > MAX_THREADS) {
            return Err(KilnError::invalid(format!("at most {MAX_THREADS} threads")));
        }
        let n_slots = n_ctx.checked_mul(opts.n_seq).filter(|&n| n <= u32::MAX as usize).ok_or_else(|| {
            KilnError::invalid(format!("{} sequences of {n_ctx} tokens are too many", opts.n_seq))
        })?;
        let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf)?);
        if tokenizer.n_vocab() != cfg.n_vocab {
            return Err(KilnError::Metadata(format!(
                "the tokenizer has {} tokens but the model {}",
                tokenizer.n_vocab(),
                cfg.n_vocab
            )));
        }
        let template = match &opts.chat_template {
            Some(spec) => Some(ChatTemplate::from_spec(&gguf, spec)?),
            None => ChatTemplate::from_gguf(&gguf)?,
        };
        opts.spec.validate(n_ctx)?;
        if opts.spec.enabled() && cfg.is_recurrent() {
            // A rejected draft rolls the state back token by token; a recurrent model's
            // convolution state only survives at whole blocks, so the accepted tokens would go.
            return Err(KilnError::invalid(format!(
                "speculative decoding needs a model whose state rolls back by token; {} keeps a recurrent state",
                cfg.arch
            )));
        }
        let n_threads = opts.n_threads.unwrap_or_else(default_threads).max(1);
        // An encoder's micro-batch holds any input whole (every position sees the others).
        let n_ubatch = if cfg.causal { opts.n_batch.min(n_ctx) } else { opts.n_batch.max(n_ctx) };
        let prefix_blocks = opts.prefix_cache_tokens.map(|n| n / crate::kv::BLOCK_SIZE);
        let backends = Backends::new(&opts, gpu, n_threads)?;
        let vision = match &opts.mmproj {
            Some(p) => {
                let g = Arc::new(GgufFile::open(p)?);
                let enc = backends
                    .load_vision(g, n_threads, opts.encoder_amx)
                    .map_err(|e| KilnError::invalid(format!("{}: {e}", p.display())))?;
                if enc.config().n_embd_out != cfg.n_embd {
                    return Err(KilnError::invalid(format!(
                        "{}: the projector's output is {} wide but the model's embeddings are {}: not this model's mmproj",
                        p.display(),
                        enc.config().n_embd_out,
                        cfg.n_embd
                    )));
                }
                Some(Arc::new(enc))
            }
            None => None,
        };
        // An image's rows attend to each other whole where the family's language model reads
        // images so (gemma3); a draft model, loaded alike, never reads image rows.
        let bidirectional_embd =
            vision.as_ref().is_some_and(|v| v.config().projector.rows_attend_bidirectionally());
        let load = |gguf: &Arc<GgufFile>, label: &str, draft: bool| -> Result<Box<dyn Runner>> {
            let progress = |stage| opts.progress.as_ref().map(|f| (f, stage, label));
            let runner: Box<dyn Runner> = match &backends {
                #[cfg(feature = "gpu")]
                Backends::Gpu(first) => {
                    let gpu = match first.take() {
                        Some(g) => g,
                        None => {
                            gpu_backend(&opts)?.ok_or_else(|| KilnError::Backend("no GPU adapter".into()))?
                        }
                    };
                    let model = Model::load_with(gguf, gpu, progress(Stage::Upload))?.with_n_ctx(n_ctx);
                    let model = if draft { model.into_draft(gguf)? } else { model };
                    let runner = ModelRunner::with_kv_types(model, n_slots, n_ubatch, opts.kv_types)?;
                    // Every pipeline the model's steps use is built now, not in the first
                    // request (and kept in the driver's pipeline cache for the next start).
                    // (Software adapters skip it: no driver compile to hide, and slow steps.)
                    if !runner.backend().is_software() {
                        runner.warm_up()?;
                        runner.backend().save_pipeline_cache();
                    }
                    boxed(
                        runner.with_bidirectional_embd(bidirectional_embd),
                        prefix_blocks,
                        opts.greedy_lookahead,
                    )
                }
                Backends::Cpu(cpu) => {
                    let model = Model::load_with(gguf, cpu.sharing_threads(), progress(Stage::Load))?
                        .with_n_ctx(n_ctx);
                    let model = if draft { model.into_draft(gguf)? } else { model };
                    let runner = ModelRunner::with_kv_types(model, n_slots, n_ubatch, opts.kv_types)?;
                    boxed(
                        runner.with_bidirectional_embd(bidirectional_embd),
                        prefix_blocks,
                        opts.greedy_lookahead,
                    )
                }
            };
            Ok(runner)
        };
        let label = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let runner = load(&gguf, &label, false)?;
        let draft = match &opts.spec.draft_model {
            Some(name) => Some(load_draft(name, &opts, &tokenizer, n_ctx, &load)?),
            None => None,
        };
        let load_ms = t0.elapsed().as_secs_f64() * 1e3;
        Ok(Engine {
            inner: Arc::new(EngineInner {
                path,
                gguf,
                runner,
                tokenizer,
                template,
                n_ctx,
                load_ms,
                sha256: OnceLock::new(),
                grammar_env: OnceLock::new(),
                vision,
                spec: opts.spec.clone(),
                draft,
                classifier: OnceLock::new(),
            }),
        })
    }

    /// The vision encoder (from [`EngineOptions::with_mmproj`]), if any.
    pub fn vision(&self) -> Option<&crate::vision::VisionEncoder> {
        self.inner.vision.as_deref()
    }

    /// A new conversation on this engine.
    pub fn session(&self, opts: SessionOptions) -> Result<Session> {
        Session::new(self.clone(), opts)
    }

    /// The model file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
    /// The parsed GGUF file.
    pub fn gguf(&self) -> &GgufFile {
        &self.inner.gguf
    }
    /// The model's hyperparameters.
    pub fn config(&self) -> &ModelConfig {
        self.inner.runner.config()
    }
    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.inner.tokenizer
    }
    /// The model's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.inner.template.as_ref()
    }
    /// The model on its backend with the KV pool (for batch-level callers: eval, server).
    pub fn runner(&self) -> &dyn Runner {
        &*self.inner.runner
    }
    /// Context size of each sequence.
    pub fn n_ctx(&self) -> usize {
        self.inner.n_ctx
    }
    /// Milliseconds spent in `load`.
    pub fn load_ms(&self) -> f64 {
        self.inner.load_ms
    }
    /// A description of the device the model runs on.
    pub fn backend_name(&self) -> String {
        self.inner.runner.backend_name()
    }
    /// How sessions on this engine speculate.
    pub fn spec(&self) -> &SpecOptions {
        &self.inner.spec
    }
    /// The draft model's runner, where one drafts.
    pub fn draft_runner(&self) -> Option<&dyn Runner> {
        self.inner.draft.as_deref()
    }

    /// The sha256 of the model file, lowercase hex (hashed once, then remembered).
    pub fn model_sha256(&self) -> Result<String> {
        if let Some(h) = self.inner.sha256.get() {
            return Ok(h.clone());
        }
        let h = sha256_files(&self.inner.gguf.paths())?;
        Ok(self.inner.sha256.get_or_init(|| h).clone())
    }

    /// The grammar engine's view of the vocabulary (built on first use, then shared by
    /// every constraint on this engine).
    pub fn grammar_env(&self) -> Result<Arc<GrammarEnv>> {
        if let Some(env) = self.inner.grammar_env.get() {
            return Ok(env.clone());
        }
        let env = Arc::new(GrammarEnv::new(self.tokenizer().clone())?);
        Ok(self.inner.grammar_env.get_or_init(|| env).clone())
    }

    /// Compiles a grammar for this model's vocabulary (see [`crate::grammar`]); start a
    /// sequence's constraint with [`CompiledGrammar::constraint`].
    pub fn compile_grammar(&self, spec: &GrammarSpec) -> Result<CompiledGrammar> {
        self.grammar_env()?.compile(spec)
    }

    /// Embeds `text` (tokenized as `kiln tokenize` does: BOS per the model, special tokens
    /// parsed): hidden states after the final norm, pooled. See [`crate::embed`].
    pub fn embed(&self, text: &str, pooling: crate::embed::Pooling) -> Result<Vec<Vec<f32>>> {
        let ids = self.tokenizer().encode(text, true, true)?;
        crate::embed::embed_tokens(self, &ids, pooling)
    }

    /// The model's classification head (rerankers: `pooling_type` rank), or an error
    /// saying why it has none.
    pub fn classifier(&self) -> Result<Arc<crate::embed::Classifier>> {
        let c = self.inner.classifier.get_or_init(|| {
            let cfg = self.config();
            crate::embed::Classifier::load(&self.inner.gguf, cfg.n_embd, cfg.pooling)
                .map(Arc::new)
                .map_err(|e| e.to_string())
        });
        c.clone().map_err(KilnError::invalid)
    }
}

/// The sha256 of the model's bytes: its file's, or a split model's parts' in order.
fn sha256_files(paths: &[&Path]) -> Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for path in paths {
        let mut f = std::fs::File::open(path).map_err(|e| KilnError::io(path, e))?;
        loop {
            let n = f.read(&mut buf).map_err(|e| KilnError::io(path, e))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
