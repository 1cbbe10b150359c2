//! The grammar flags of `kiln run` and `kiln chat`: constrain the output to a GBNF grammar
//! (or a Lark grammar, when the text starts with `%llguidance`, as in llama.cpp), a JSON
//! schema, or any JSON object.

use kiln::engine::Engine;
use kiln::grammar::Grammar;
use kiln::KilnError;

#[derive(clap::Args, Clone, Debug, Default)]
#[group(id = "grammar_source", multiple = false)]
pub struct GrammarArgs {
    /// Constrain the output to this GBNF grammar (Lark if it starts with %llguidance).
    #[arg(long)]
    grammar: Option<String>,
    /// Constrain the output to the grammar in FILE (GBNF, or Lark as above).
    #[arg(long = "grammar-file", value_name = "FILE")]
    grammar_file: Option<String>,
    /// Constrain the output to a JSON schema: inline JSON, or a file.
    #[arg(long = "json-schema", value_name = "FILE_OR_JSON")]
    json_schema: Option<String>,
    /// Constrain the output to a JSON object.
    #[arg(long = "json-object")]
    json_object: bool,
}

impl GrammarArgs {
    /// The grammar the flags ask for (reading files), if any.
    pub fn grammar(&self) -> kiln::Result<Option<Grammar>> {
        let read = |path: &str| std::fs::read_to_string(path).map_err(|e| KilnError::io(path, e));
        let text = match (&self.grammar, &self.grammar_file) {
            (Some(g), _) => Some(g.clone()),
            (None, Some(f)) => Some(read(f)?),
            _ => None,
        };
        if let Some(text) = text {
            return Ok(Some(if text.trim_start().starts_with("%llguidance") {
                Grammar::Lark(text)
            } else {
                Grammar::Gbnf(text)
            }));
        }
        if let Some(s) = &self.json_schema {
            let inline = s.trim_start().starts_with(['{', '[']) || matches!(s.trim(), "true" | "false");
            let text = if inline { s.clone() } else { read(s)? };
            return Grammar::json_schema_str(&text).map(Some);
        }
        Ok(self.json_object.then_some(Grammar::JsonObject))
    }
}

/// Compiles `g` for the model's vocabulary, so a bad grammar exits before any generation.
pub fn check(engine: &Engine, g: &Option<Grammar>) -> kiln::Result<()> {
    if let Some(g) = g {
        engine.compile_grammar(&g.clone().into())?;
    }
    Ok(())
}
