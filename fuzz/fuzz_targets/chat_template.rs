//! A chat template from a model file is untrusted input: `ChatTemplate::new` on any source
//! and `render` of a conversation must return Ok or Err, never panic, hang or allocate
//! without bound. The input is the template source, then (after the first NUL byte) the
//! text of the messages; the clock is pinned so runs repeat.

#![no_main]

use kiln::chat::{ChatTemplate, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (src, text) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b"Hi"[..]),
    };
    let (src, text) = (String::from_utf8_lossy(src), String::from_utf8_lossy(text));
    let Ok(t) = ChatTemplate::new(&src, "<s>", "</s>") else { return };
    let t = t.with_fixed_time(1_700_000_000);
    let messages =
        [Message::system(text.as_ref()), Message::user(text.as_ref()), Message::assistant(text.as_ref())];
    let tools = serde_json::json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    for gen in [false, true] {
        let _ = t.render(&messages, gen, None);
        let _ = t.render(&messages[1..], gen, Some(&tools));
    }
});
