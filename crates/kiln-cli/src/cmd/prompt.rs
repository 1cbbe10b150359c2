//! How `run` and `logits` turn the user's text into prompt tokens (docs/cli.md).

use kiln::chat::Message;
use kiln::engine::Engine;

/// Chat mode renders the model's template for `[system?, user]`; `raw` (or a model with no
/// template) tokenizes the text as `kiln tokenize` does.
pub fn prompt_ids(engine: &Engine, text: &str, system: Option<&str>, raw: bool) -> kiln::Result<Vec<u32>> {
    let tok = engine.tokenizer();
    match engine.chat_template().filter(|_| !raw) {
        Some(tpl) => {
            let mut msgs = Vec::new();
            if let Some(s) = system {
                msgs.push(Message::system(s));
            }
            msgs.push(Message::user(text));
            tok.encode_prompt(&tpl.render(&msgs, true, None)?)
        }
        None => {
            if !raw {
                eprintln!("note: the model has no chat template; using the prompt as plain text");
            }
            tok.encode(text, true, true)
        }
    }
}
