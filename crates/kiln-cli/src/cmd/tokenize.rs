//! `kiln tokenize`: token ids of a text, as `llama-tokenize --ids --no-escape` prints them.

use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;

use kiln::gguf::GgufFile;
use kiln::tokenizer::Tokenizer;
use kiln::KilnError;

#[derive(clap::Args)]
pub struct Args {
    /// A .gguf path, a catalog name or a Hub name (hf://...).
    #[arg(short = 'm', long, default_value = kiln::hub::DEFAULT_MODEL)]
    model: String,
    #[arg(help = super::common::HF_REPO_HELP, long = "hf-repo", value_name = "REPO[:QUANT]", conflicts_with = "model")]
    hf_repo: Option<String>,
    /// The text (verbatim).
    #[arg(short = 'p', long = "prompt", value_name = "TEXT", conflicts_with_all = ["text", "file"])]
    prompt: Option<OsString>,
    /// The text, as a positional argument.
    #[arg(value_name = "TEXT", conflicts_with = "file")]
    text: Option<OsString>,
    /// Read the text from FILE (`-` = stdin).
    #[arg(short = 'f', long, value_name = "FILE")]
    file: Option<PathBuf>,
    /// Do not prepend BOS.
    #[arg(long)]
    no_bos: bool,
    /// Treat special-token text as plain text.
    #[arg(long)]
    no_parse_special: bool,
    /// Print `[id, "piece"]` pairs.
    #[arg(long)]
    pieces: bool,
}

pub fn run(a: Args) -> kiln::Result<()> {
    let text = read_text(&a)?;
    let path = super::common::resolve(&super::common::model_name(&a.model, a.hf_repo.as_deref()))?;
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path)?)?;
    let mut ids = tok.encode(&text, true, !a.no_parse_special)?;
    if a.no_bos && tok.add_bos() && !ids.is_empty() && tok.bos() == Some(ids[0]) {
        ids.remove(0);
    }
    let items: Vec<String> = if a.pieces {
        ids.iter().map(|&id| format!("[{id}, {}]", piece_json(tok.token_to_piece(id, true)))).collect()
    } else {
        ids.iter().map(u32::to_string).collect()
    };
    println!("[{}]", items.join(", "));
    Ok(())
}

fn read_text(a: &Args) -> kiln::Result<String> {
    let (bytes, what) = match (&a.prompt, &a.text, &a.file) {
        (Some(p), _, _) => (os_bytes(p), "-p text".to_string()),
        (None, Some(t), _) => (os_bytes(t), "text argument".to_string()),
        (None, None, Some(f)) if f.as_os_str() == "-" => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).map_err(|e| KilnError::io("<stdin>", e))?;
            (buf, "stdin".to_string())
        }
        (None, None, Some(f)) => {
            (std::fs::read(f).map_err(|e| KilnError::io(f, e))?, f.display().to_string())
        }
        (None, None, None) => return Err(KilnError::invalid("no text: give -p TEXT, TEXT or -f FILE")),
    };
    String::from_utf8(bytes).map_err(|e| {
        KilnError::invalid(format!("{what}: invalid UTF-8 at byte {}", e.utf8_error().valid_up_to()))
    })
}

#[cfg(unix)]
fn os_bytes(s: &OsString) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    s.as_os_str().as_bytes().to_vec()
}

#[cfg(not(unix))]
fn os_bytes(s: &OsString) -> Vec<u8> {
    // Non-Unix argv is UTF-16; anything unpaired cannot be text anyway.
    match s.to_str() {
        Some(t) => t.as_bytes().to_vec(),
        None => vec![0xFF],
    }
}

/// A JSON string of the piece; bytes that are not valid UTF-8 on their own become `<0xNN>`.
fn piece_json(mut bytes: &[u8]) -> String {
    let mut s = String::new();
    loop {
        match std::str::from_utf8(bytes) {
            Ok(t) => {
                s.push_str(t);
                break;
            }
            Err(e) => {
                let (ok, rest) = bytes.split_at(e.valid_up_to());
                s.push_str(std::str::from_utf8(ok).unwrap_or_default());
                let n = e.error_len().unwrap_or(rest.len());
                for b in &rest[..n] {
                    s.push_str(&format!("<0x{b:02X}>"));
                }
                bytes = &rest[n..];
            }
        }
    }
    serde_json::to_string(&s).unwrap_or_else(|_| "\"\"".into())
}
