//! One module per subcommand.

mod inspect;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum Command {
    /// Show a model's metadata and tensors.
    Inspect(inspect::Args),
}

impl Command {
    pub fn run(self) -> kiln::Result<()> {
        match self {
            Command::Inspect(a) => inspect::run(a),
        }
    }
}
