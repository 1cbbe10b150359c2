//! What the engine reads from a parsed GGUF's metadata before any weight: the model
//! configuration, the tokenizer (then an encode and decode) and the chat template, on
//! arbitrary bytes. Each must give Ok or a clear error, never panic.

#![no_main]

use kiln::chat::ChatTemplate;
use kiln::gguf::GgufFile;
use kiln::model::ModelConfig;
use kiln::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = GgufFile::from_bytes(data.to_vec()) else { return };
    let _ = ModelConfig::from_gguf(&g);
    if let Ok(t) = Tokenizer::from_gguf(&g) {
        if let Ok(ids) = t.encode("Hello world! <s> 12 ü\n", true, true) {
            let _ = t.decode(&ids, true);
        }
    }
    if let Ok(Some(t)) = ChatTemplate::from_gguf(&g) {
        let _ = t.with_fixed_time(0).render(&[kiln::Message::user("Hi")], true, None);
    }
});
