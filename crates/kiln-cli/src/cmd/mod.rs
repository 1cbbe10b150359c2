//! One module per subcommand.

mod inspect;
mod tokenize;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum Command {
    /// Show a model's metadata and tensors.
    Inspect(inspect::Args),
    /// Print the token ids of a text.
    Tokenize(tokenize::Args),
}

impl Command {
    pub fn run(self) -> kiln::Result<()> {
        match self {
            Command::Inspect(a) => inspect::run(a),
            Command::Tokenize(a) => tokenize::run(a),
        }
    }
}
