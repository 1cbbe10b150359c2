//! The `kiln` command. The contract (flags, output, exit codes) is `docs/cli.md`.

mod argv;
mod bars;
mod cmd;

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(name = "kiln", version, about = "Run GGUF language models", propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: cmd::Command,
}

fn main() -> ExitCode {
    sigpipe(SigPipe::Default);
    quiet_device_select();
    let cli = Cli::parse_from(argv::rewrite(std::env::args_os()));
    if matches!(cli.command, cmd::Command::Serve(_)) {
        sigpipe(SigPipe::Ignore);
    }
    // A panic is a bug, but the contract says exit 1 with one `error:` line, never 101.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error: {info}");
    }));
    match std::panic::catch_unwind(|| cli.command.run()) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
        Err(_) => ExitCode::from(1),
    }
}

/// Mesa's Vulkan device-select layer, which only reorders adapters (kiln ranks them
/// itself), asks libwayland for a display while adapters are listed, and libwayland prints
/// an "error:" line about XDG_RUNTIME_DIR each time when it is unset. Without that variable
/// the layer is turned off, through the variable the layer's manifest names for it. Called
/// first in `main`, before any thread could read the environment.
fn quiet_device_select() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none_or(|v| v.is_empty())
        && std::env::var_os("NODEVICE_SELECT").is_none()
    {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

enum SigPipe {
    Default,
    Ignore,
}

/// Rust ignores SIGPIPE, so `kiln inspect x | head` would fail on its next write to the
/// closed pipe; like any Unix filter we let SIGPIPE end the process quietly instead. Not
/// `kiln serve`: a vectored write (`writev`, which has no MSG_NOSIGNAL) to a socket whose
/// client has gone would end the server, so it keeps ignoring SIGPIPE.
#[cfg(unix)]
fn sigpipe(disposition: SigPipe) {
    const SIGPIPE: i32 = 13; // the same on Linux, macOS and the BSDs
    const SIG_DFL: usize = 0;
    const SIG_IGN: usize = 1;
    extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    let handler = match disposition {
        SigPipe::Default => SIG_DFL,
        SigPipe::Ignore => SIG_IGN,
    };
    // SAFETY: setting one signal's disposition, before any thread starts.
    unsafe {
        signal(SIGPIPE, handler);
    }
}

#[cfg(not(unix))]
fn sigpipe(_: SigPipe) {}
