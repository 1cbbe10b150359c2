//! `kiln chat`: interactive multi-turn chat. Replies stream to stdout; the KV cache of
//! earlier turns is reused, so each turn evaluates only its new tokens. Ctrl-C cancels
//! the reply being generated (at the prompt it quits). Commands: `/reset`, `/save FILE`,
//! `/load FILE`, `/image FILE` (an image for the next message, with `--mmproj`), `/quit`. With piped stdin, each line is one user message.

use std::io::{BufRead, IsTerminal};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kiln::chat::Message;
use kiln::session::{GenerateOptions, Session};
use kiln::vision::RgbImage;
use kiln::KilnError;

use super::common::{print_out, ModelArgs, SpecArgs};
use super::grammar::{self, GrammarArgs};
use super::run::SamplingArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// System message, at the start of the conversation (and after /reset).
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per reply (-1: until end of generation or the context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true)]
    n_predict: i64,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    grammar: GrammarArgs,
    #[command(flatten)]
    spec: SpecArgs,
    /// Start from a session saved with /save (exits 1 if it belongs to another model).
    #[arg(long)]
    load: Option<String>,
    /// When the context fills, drop old tokens keeping the first N (default: stop the reply).
    #[arg(long = "context-shift", value_name = "N_KEEP")]
    context_shift: Option<usize>,
}

/// Set while a reply is generated: Ctrl-C then cancels it instead of quitting.
static GENERATING: AtomicBool = AtomicBool::new(false);
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: i32) {
    if GENERATING.load(Ordering::SeqCst) {
        INTERRUPTED.store(true, Ordering::SeqCst);
    } else {
        // SAFETY: _exit is async-signal-safe.
        unsafe { _exit(130) }
    }
}

extern "C" {
    fn signal(signum: i32, handler: usize) -> usize;
    fn _exit(code: i32) -> !;
}

const SIGINT: i32 = 2; // the same on Linux, macOS and the BSDs

pub fn run(a: Args) -> kiln::Result<()> {
    let params = a.sampling.params()?;
    let grammar = a.grammar.grammar()?;
    let engine = a.model.load_with(a.spec.options())?;
    params.validate(engine.config().n_vocab)?;
    grammar::check(&engine, &grammar)?;
    let mut sopts = super::common::session_options();
    if let Some(n) = a.context_shift {
        sopts = sopts.with_context_shift(n);
    }
    let mut session = engine.session(sopts)?;
    if let Some(f) = &a.load {
        session.restore(f)?;
    }
    let chat_mode = engine.chat_template().is_some();
    if !chat_mode {
        eprintln!(
            "note: the model has no chat template; each message continues the text as plain completion"
        );
    }
    let mut opts = GenerateOptions::default().with_sampler(params);
    if a.n_predict >= 0 {
        opts = opts.with_max_tokens(a.n_predict as usize);
    }
    if let Some(g) = grammar {
        opts = opts.with_grammar(g);
    }
    let tty = std::io::stdin().is_terminal();
    // SAFETY: installs a handler that only touches atomics and calls _exit.
    unsafe { signal(SIGINT, on_sigint as *const () as usize) };
    let cancel = session.cancel_handle();
    std::thread::spawn(move || loop {
        if INTERRUPTED.swap(false, Ordering::SeqCst) {
            cancel.cancel();
        }
        std::thread::sleep(Duration::from_millis(10));
    });
    if tty {
        eprintln!(
            "kiln chat: {} — /reset, /save FILE, /load FILE, /image FILE, /quit; Ctrl-C stops a reply",
            engine.path().display()
        );
    }

    let stdin = std::io::stdin();
    let mut lines = stdin.lock();
    // Images attached with /image, for the next message.
    let mut images: Vec<RgbImage> = Vec::new();
    let mut line = String::new();
    loop {
        if tty {
            eprint!("> ");
        }
        line.clear();
        let n = lines.read_line(&mut line).map_err(|e| KilnError::io("<stdin>", e))?;
        if n == 0 {
            return Ok(());
        }
        let msg = line.trim_end_matches(['\n', '\r']);
        if let Some(cmd) = msg.strip_prefix('/') {
            let (name, arg) = cmd.split_once(' ').map_or((cmd, ""), |(n, a)| (n, a.trim()));
            let done = match (name, arg) {
                ("quit" | "exit", _) => return Ok(()),
                ("reset", _) => {
                    session.reset();
                    Ok("conversation cleared".to_string())
                }
                ("save", f) if !f.is_empty() => session.save(f).map(|_| format!("saved to {f}")),
                ("load", f) if !f.is_empty() => {
                    session.restore(f).map(|_| format!("loaded {f} ({} tokens)", session.tokens().len()))
                }
                ("image", f) if !f.is_empty() => match engine.vision() {
                    None => Err(KilnError::invalid(
                        "the model takes no images: start kiln chat with --mmproj FILE",
                    )),
                    Some(_) => RgbImage::open(f).map(|img| {
                        let note = format!("{f} ({}x{}) goes with your next message", img.width, img.height);
                        images.push(img);
                        note
                    }),
                },
                _ => Err(KilnError::invalid(format!(
                    "unknown command /{cmd} (try /reset, /save FILE, /load FILE, /image FILE, /quit)"
                ))),
            };
            match done {
                Ok(note) => eprintln!("kiln: {note}"),
                Err(e) => eprintln!("error: {e}"),
            }
            continue;
        }
        if msg.is_empty() {
            continue;
        }
        let attached = std::mem::take(&mut images);
        if let Err(e) = turn(&mut session, msg, &attached, a.system.as_deref(), chat_mode, &opts) {
            // Piped input stops at the first failed turn (main prints the error once); at a
            // terminal the conversation goes on.
            if !tty {
                return Err(e);
            }
            eprintln!("error: {e}");
        }
    }
}

/// One user message and the streamed reply.
fn turn(
    s: &mut Session,
    msg: &str,
    images: &[RgbImage],
    system: Option<&str>,
    chat_mode: bool,
    opts: &GenerateOptions,
) -> kiln::Result<()> {
    s.cancel_handle().reset();
    GENERATING.store(true, Ordering::SeqCst);
    let result = (|| {
        if chat_mode {
            let mut msgs = Vec::new();
            if s.history().is_empty() {
                msgs.extend(system.map(Message::system));
            }
            msgs.push(Message::user(msg));
            s.append_chat_with_images(&msgs, images)?;
        } else {
            for img in images {
                s.append_image(img)?;
            }
            s.append_text(msg)?;
        }
        s.generate(opts, |ev| {
            print_out(ev.text);
            ControlFlow::Continue(())
        })
    })();
    GENERATING.store(false, Ordering::SeqCst);
    crate::bars::clear();
    let summary = result?;
    print_out("\n");
    let t = &summary.timings;
    if std::io::stdin().is_terminal() || summary.finish_reason.as_str() == "cancelled" {
        eprintln!(
            "kiln: {} ({} prompt tokens evaluated, {} reused; {} generated)",
            summary.finish_reason.as_str(),
            t.prompt_n,
            t.prompt_cached,
            t.gen_n
        );
    }
    Ok(())
}
