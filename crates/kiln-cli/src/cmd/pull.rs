//! `kiln pull NAME` / `kiln pull -hf ORG/REPO[:QUANT]` / `kiln pull --list`: fetch a model
//! into its cache and print its path.

use kiln::hub;

use super::common::{model_name, HF_REPO_HELP};

#[derive(clap::Args)]
pub struct Args {
    /// A catalog name (see `--list`) or a Hub name (hf://ORG/REPO[:QUANT], hf://ORG/REPO/PATH.gguf).
    #[arg(value_name = "NAME", required_unless_present_any = ["list", "llama_cpp_source", "hf_repo"])]
    name: Option<String>,
    #[arg(help = HF_REPO_HELP, long = "hf-repo", value_name = "REPO[:QUANT]", conflicts_with_all = ["name", "list"])]
    hf_repo: Option<String>,
    /// Print the catalog: name, size, architecture, and whether it is cached.
    #[arg(long, conflicts_with_all = ["name", "llama_cpp_source"])]
    list: bool,
    /// Fetch the llama-cpp-python sdist (llama.cpp source, vocab test files) that tests
    /// read; print its directory. For `.ci/run`, not part of the CLI contract.
    #[arg(long, hide = true, conflicts_with = "name")]
    llama_cpp_source: bool,
}

pub fn run(a: Args) -> kiln::Result<()> {
    if a.list {
        for e in hub::catalog() {
            let mut notes = Vec::new();
            if e.name == hub::DEFAULT_MODEL {
                notes.push("default");
            }
            if std::fs::metadata(hub::cached_path(e)).is_ok_and(|m| m.len() == e.size) {
                notes.push("cached");
            }
            let notes = if notes.is_empty() { String::new() } else { format!("  ({})", notes.join(", ")) };
            println!("{:<20} {:>8.1} MB  {}{notes}", e.name, e.size as f64 / 1e6, e.arch);
        }
        return Ok(());
    }
    if a.llama_cpp_source {
        println!("{}", hub::llama_cpp_source()?.display());
        return Ok(());
    }
    let name = model_name(a.name.as_deref().unwrap_or_default(), a.hf_repo.as_deref());
    let path = hub::pull_with(&name, crate::bars::sink().as_ref())?;
    println!("{}", path.display());
    Ok(())
}
