//! The `kiln` command. The contract (flags, output, exit codes) is `shared/CLI.md`.

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
    let cli = Cli::parse();
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
