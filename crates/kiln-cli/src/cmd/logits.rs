//! `kiln logits`: the raw next-token logits after a prompt, highest first.

use kiln::session::SessionOptions;
use serde_json::json;

use super::common::{print_out, ModelArgs, TextArgs};
use super::prompt::prompt_ids;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    text: TextArgs,
    /// Use the prompt as plain text, without the chat template.
    #[arg(long)]
    raw: bool,
    /// How many of the highest logits to print.
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Print JSON (the only output format).
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> kiln::Result<()> {
    let prompt = a.text.require()?;
    let engine = a.model.load()?;
    let ids = prompt_ids(&engine, &prompt, None, a.raw)?;
    let mut session = engine.session(SessionOptions::default())?;
    session.append_tokens(&ids)?;
    let logits = session
        .logits()
        .ok_or_else(|| kiln::KilnError::invalid("the prompt has no tokens: there are no logits to print"))?;
    let top = kiln::eval::top_k(logits, a.top);
    let out = json!({
        "prompt_ids": ids, "n_vocab": logits.len(),
        "top": top.iter().map(|&(i, l)| json!([i, l])).collect::<Vec<_>>(),
    });
    print_out(&format!("{out}\n"));
    Ok(())
}
