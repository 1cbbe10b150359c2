//! Flags and helpers shared by the commands that load a model.

use std::io::Read;

use kiln::engine::{Device, Engine, EngineOptions};
use kiln::KilnError;

/// `-m/-hf/-t/-c/-b/--device`, as every computing command takes them (docs/cli.md).
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// A .gguf path, a catalog name or a Hub name (hf://ORG/REPO[:QUANT], hf://ORG/REPO/PATH.gguf).
    #[arg(short = 'm', long, default_value = kiln::hub::DEFAULT_MODEL)]
    pub model: String,
    #[arg(help = HF_REPO_HELP, long = "hf-repo", value_name = "REPO[:QUANT]", conflicts_with = "model")]
    pub hf_repo: Option<String>,
    /// Threads (default: the number of cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Context size (default: min(trained context, 4096)).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Most tokens per forward pass.
    #[arg(short = 'b', long = "batch-size")]
    pub batch_size: Option<usize>,
    /// auto, cpu or gpu (env KILN_DEVICE; the flag wins).
    #[arg(long)]
    pub device: Option<String>,
    /// One arithmetic for every batch: a sequence's outputs never depend on what shares
    /// its batch (the GPU then leaves its tensor-core matmul unused).
    #[arg(long)]
    pub batch_invariant: bool,
    /// A vision encoder for the model (llama.cpp's mmproj GGUF): images in run, chat, serve.
    #[arg(long, value_name = "FILE")]
    pub mmproj: Option<String>,
    /// The chat template in place of the model's: a Jinja template, or one of llama.cpp's
    /// built-in names (chatml, llama2, llama3, mistral-v7, gemma, vicuna, deepseek, smolvlm, ...).
    #[arg(long = "chat-template", value_name = "NAME|JINJA", conflicts_with = "chat_template_file")]
    pub chat_template: Option<String>,
    /// The chat template in place of the model's, read from a Jinja file.
    #[arg(long = "chat-template-file", value_name = "FILE")]
    pub chat_template_file: Option<String>,
    /// KV cache type of keys: f16, q8_0, q5_1, q5_0, q4_1, q4_0 or iq4_nl (also -ctk).
    #[arg(long = "cache-type-k", value_name = "TYPE", default_value = "f16", value_parser = kv_type)]
    pub cache_type_k: kiln::quant::GgmlType,
    /// KV cache type of values, as --cache-type-k (also -ctv).
    #[arg(long = "cache-type-v", value_name = "TYPE", default_value = "f16", value_parser = kv_type)]
    pub cache_type_v: kiln::quant::GgmlType,
}

/// Speculative decoding flags (`run`, `chat`, `serve`; docs/cli.md).
#[derive(clap::Args, Clone, Debug)]
pub struct SpecArgs {
    /// A draft model of the same vocabulary for speculative decoding (also -md).
    #[arg(long = "model-draft", value_name = "MODEL", conflicts_with = "lookup_ngram")]
    pub model_draft: Option<String>,
    /// Prompt lookup: draft what followed an earlier occurrence of the context's last N tokens (the one that matches the longest run), as many tokens as matched.
    #[arg(long = "lookup-ngram", value_name = "N")]
    pub lookup_ngram: Option<usize>,
    /// Most tokens per draft.
    #[arg(long = "draft-max", value_name = "N", default_value_t = 16)]
    pub draft_max: usize,
    /// Drafts shorter than this are not verified.
    #[arg(long = "draft-min", value_name = "N", default_value_t = 0)]
    pub draft_min: usize,
    /// A draft model stops drafting at a token it gives less than this probability.
    #[arg(long = "draft-p-min", value_name = "P", default_value_t = 0.75)]
    pub draft_p_min: f32,
}

impl SpecArgs {
    pub fn options(&self) -> kiln::spec::SpecOptions {
        let mut o = kiln::spec::SpecOptions::default();
        o.draft_model = self.model_draft.clone();
        o.lookup_ngram = self.lookup_ngram;
        o.draft_max = self.draft_max;
        o.draft_min = self.draft_min;
        o.draft_p_min = self.draft_p_min;
        o
    }
}

/// A KV cache type name (`--cache-type-k/-v`).
fn kv_type(s: &str) -> Result<kiln::quant::GgmlType, String> {
    kiln::kv::cache_type(s).map_err(|e| e.to_string())
}

/// The help of `-hf, --hf-repo` wherever a model is taken.
pub const HF_REPO_HELP: &str =
    "A Hugging Face repository, ORG/REPO[:QUANT] (the quant tag picks the file; default Q4_K_M); also -hf";

/// The file of a model name, fetched (with progress bars) if need be.
pub fn resolve(name: &str) -> kiln::Result<std::path::PathBuf> {
    kiln::hub::resolve_model_with(name, crate::bars::sink().as_ref())
}

/// Session options with prompt progress bars where they are drawn.
pub fn session_options() -> kiln::session::SessionOptions {
    let o = kiln::session::SessionOptions::default();
    match crate::bars::sink() {
        Some(f) => o.with_progress(f),
        None => o,
    }
}

/// The model name `-m MODEL` or `-hf REPO` gives (`hf://REPO` for the latter).
pub fn model_name(model: &str, hf_repo: Option<&str>) -> String {
    match hf_repo {
        Some(r) if r.starts_with(kiln::hub::hf::SCHEME) => r.to_string(),
        Some(r) => format!("{}{r}", kiln::hub::hf::SCHEME),
        None => model.to_string(),
    }
}

impl ModelArgs {
    /// The model to load: `-m`, or `hf://REPO` for `-hf REPO`.
    pub fn name(&self) -> String {
        model_name(&self.model, self.hf_repo.as_deref())
    }

    pub fn device(&self) -> kiln::Result<Device> {
        match (&self.device, std::env::var("KILN_DEVICE")) {
            (Some(d), _) => d.parse(),
            (None, Ok(d)) if !d.is_empty() => d.parse(),
            _ => Ok(Device::Auto),
        }
    }

    /// `-t`, clamped to the cores of this machine (with a note): more threads than cores
    /// only wait on each other.
    pub fn threads(&self) -> kiln::Result<usize> {
        let cores = kiln::backend::cpu::default_threads();
        match self.threads {
            None => Ok(cores),
            Some(0) => Err(KilnError::invalid("--threads must be at least 1")),
            Some(n) if n > cores => {
                eprintln!("note: --threads {n} is more than the {cores} cores here; using {cores}");
                Ok(cores)
            }
            Some(n) => Ok(n),
        }
    }

    pub fn engine_options(&self) -> kiln::Result<EngineOptions> {
        let mut o =
            EngineOptions::default().with_device(self.device()?).with_batch_invariant(self.batch_invariant);
        if let Some(f) = crate::bars::sink() {
            o = o.with_progress(f);
        }
        if self.threads.is_some() {
            o = o.with_threads(self.threads()?);
        }
        if let Some(c) = self.ctx_size {
            o = o.with_n_ctx(c);
        }
        if let Some(b) = self.batch_size {
            o = o.with_batch(b);
        }
        if let Some(m) = &self.mmproj {
            o = o.with_mmproj(m);
        }
        if let Some(t) = &self.chat_template {
            o = o.with_chat_template(t);
        }
        if let Some(f) = &self.chat_template_file {
            let src = std::fs::read_to_string(f)
                .map_err(|e| KilnError::invalid(format!("--chat-template-file {f}: {e}")))?;
            o = o.with_chat_template(src);
        }
        Ok(o.with_kv_types(self.cache_type_k, self.cache_type_v))
    }

    pub fn load(&self) -> kiln::Result<Engine> {
        Engine::load(self.name(), self.engine_options()?)
    }

    /// [`Self::load`] with speculative decoding as `spec` says.
    pub fn load_with(&self, spec: kiln::spec::SpecOptions) -> kiln::Result<Engine> {
        Engine::load(self.name(), self.engine_options()?.with_spec(spec))
    }
}

/// Text from `-p TEXT`, a positional TEXT or `-f FILE` (`-f -` = stdin), verbatim.
#[derive(clap::Args, Clone, Debug)]
pub struct TextArgs {
    #[arg(short = 'p', long = "prompt", conflicts_with_all = ["file", "text"])]
    pub prompt: Option<String>,
    /// Read the text from a file (`-` for stdin).
    #[arg(short = 'f', long, conflicts_with = "text")]
    pub file: Option<String>,
    #[arg(value_name = "TEXT")]
    pub text: Option<String>,
}

impl TextArgs {
    pub fn read(&self) -> kiln::Result<Option<String>> {
        if let Some(p) = self.prompt.clone().or_else(|| self.text.clone()) {
            return Ok(Some(p));
        }
        let Some(f) = &self.file else { return Ok(None) };
        let bytes = if f == "-" {
            let mut b = Vec::new();
            std::io::stdin().read_to_end(&mut b).map_err(|e| KilnError::io("<stdin>", e))?;
            b
        } else {
            std::fs::read(f).map_err(|e| KilnError::io(f, e))?
        };
        String::from_utf8(bytes).map(Some).map_err(|e| {
            KilnError::invalid(format!("{f}: invalid UTF-8 at byte {}", e.utf8_error().valid_up_to()))
        })
    }

    pub fn require(&self) -> kiln::Result<String> {
        self.read()?.ok_or_else(|| KilnError::invalid("no text given (use -p TEXT, TEXT or -f FILE)"))
    }
}

/// Writes to stdout, treating a closed pipe as the reader's choice to stop.
pub fn print_out(s: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if out.write_all(s.as_bytes()).and_then(|_| out.flush()).is_err() {
        std::process::exit(0);
    }
}
