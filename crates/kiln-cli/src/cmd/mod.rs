//! One module per subcommand.

mod inspect;
mod pull;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum Command {
    /// Show a model's metadata and tensors.
    Inspect(inspect::Args),
    /// Fetch a catalog model into the cache; print its path.
    Pull(pull::Args),
}

impl Command {
    pub fn run(self) -> kiln::Result<()> {
        match self {
            Command::Inspect(a) => inspect::run(a),
            Command::Pull(a) => pull::run(a),
        }
    }
}
