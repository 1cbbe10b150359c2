//! Progress bars on stderr, drawn only when stderr is a terminal: downloads at once (bytes,
//! rate, time left), loading and uploading weights and evaluating a prompt only once they
//! have taken over a second (a fast step draws nothing).

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln::progress::{Progress, ProgressFn, Stage};

/// How long a step other than a download runs before its bar appears.
const QUIET: Duration = Duration::from_secs(1);

struct Bar {
    bar: ProgressBar,
    started: Instant,
    shown: bool,
}

/// The bars in flight, one per (stage, label).
#[derive(Clone, Default)]
pub struct Bars(Arc<Mutex<HashMap<(Stage, String), Bar>>>);

/// The command's bars, or `None` when stderr is not a terminal.
pub fn global() -> Option<&'static Bars> {
    static BARS: std::sync::OnceLock<Option<Bars>> = std::sync::OnceLock::new();
    BARS.get_or_init(|| std::io::stderr().is_terminal().then(Bars::default)).as_ref()
}

/// The library's progress callback for the command's bars, if they are drawn.
pub fn sink() -> Option<ProgressFn> {
    global().map(Bars::sink)
}

/// Clears whatever bars are left.
pub fn clear() {
    if let Some(b) = global() {
        b.clear();
    }
}

impl Bars {
    /// The callback the library reports to.
    pub fn sink(&self) -> ProgressFn {
        let bars = self.clone();
        ProgressFn::new(move |p| bars.update(p))
    }

    fn update(&self, p: &Progress) {
        let mut bars = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (p.stage, p.label.to_string());
        let b = bars.entry(key.clone()).or_insert_with(|| Bar {
            bar: ProgressBar::with_draw_target(Some(p.total), ProgressDrawTarget::hidden())
                .with_style(style(p.stage))
                .with_message(message(p)),
            started: Instant::now(),
            shown: false,
        });
        b.bar.set_length(p.total);
        b.bar.set_position(p.done);
        if !b.shown && (p.stage == Stage::Download || b.started.elapsed() >= QUIET) && p.done < p.total {
            b.bar.set_draw_target(ProgressDrawTarget::stderr());
            b.shown = true;
        }
        if p.done >= p.total {
            b.bar.finish_and_clear();
            bars.remove(&key);
        }
    }

    /// Clears bars left unfinished (a prompt cancelled midway).
    pub fn clear(&self) {
        let mut bars = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (_, b) in bars.drain() {
            b.bar.finish_and_clear();
        }
    }
}

fn message(p: &Progress) -> String {
    match p.stage {
        Stage::Download => format!("downloading {}", p.label),
        Stage::Load => format!("loading {}", p.label),
        Stage::Upload => format!("uploading {} to the GPU", p.label),
        _ => "evaluating the prompt".to_string(),
    }
}

fn style(stage: Stage) -> ProgressStyle {
    let template = match stage {
        Stage::Download => "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
        Stage::Load | Stage::Upload => "{msg} [{bar:30}] {bytes}/{total_bytes}",
        _ => "{msg} [{bar:30}] {pos}/{len} tokens, {rate}, {eta} left",
    };
    ProgressStyle::with_template(template)
        .expect("a valid template")
        .with_key("rate", |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.1} tok/s", s.per_sec());
        })
        .progress_chars("=> ")
}
