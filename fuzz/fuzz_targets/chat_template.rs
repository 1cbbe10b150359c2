//! A chat template from a model file is untrusted input: `ChatTemplate::new` on any source
//! and `render` of a conversation (with tools, and with a tool call and its result) must
//! return Ok or Err, never panic, hang or allocate without bound. The input is the template source, then (after the first NUL byte) the
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
    // Tool-call format probing, and a history with a call and its result.
    let _ = t.tool_caps();
    let chat_tools = kiln::chat::tools::ChatTools::new(vec![kiln::chat::tools::Tool::function(
        "f",
        text.as_ref(),
        serde_json::json!({"type": "object"}),
    )]);
    if let Ok(chat_tools) = chat_tools {
        let call = serde_json::json!([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": text.as_ref()}}]);
        let history = serde_json::json!([
            {"role": "user", "content": text.as_ref()},
            {"role": "assistant", "content": null, "tool_calls": call},
            {"role": "tool", "tool_call_id": "call_1", "content": text.as_ref()},
        ]);
        let _ = kiln::chat::tools::render_chat(&t, &history, &chat_tools, true);
    }
});
