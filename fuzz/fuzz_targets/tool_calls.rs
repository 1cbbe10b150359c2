//! A model's output is untrusted input to the tool-call parser: for any text, in any
//! format, fed in any pieces, it must not panic, the pieces must give the same reply as
//! the whole (content and calls), and the streamed deltas must add up to that reply. The
//! first byte picks the format, the second seeds the piece sizes, the rest is the output.

#![no_main]

use kiln::chat::tools::{Parsed, ToolCallParser, ToolFormat};
use libfuzzer_sys::fuzz_target;

const FORMATS: [ToolFormat; 5] =
    [ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::MistralNemo, ToolFormat::Mistral, ToolFormat::Generic];

fn parser(format: ToolFormat, named: bool) -> ToolCallParser {
    let p = ToolCallParser::new(format);
    if named {
        p.with_names(vec!["f".into(), "get_weather".into()])
    } else {
        p
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let format = FORMATS[data[0] as usize % FORMATS.len()];
    let named = data[0] & 0x80 != 0;
    let text = String::from_utf8_lossy(&data[2..]);
    let mut whole_out = Parsed::default();
    let mut p = parser(format, named);
    p.push(&text, &mut whole_out);
    let whole = p.finish(&mut whole_out);

    let mut out = Parsed::default();
    let mut p = parser(format, named);
    let mut seed = data[1] as u32 | 1;
    let mut at = 0;
    while at < text.len() {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
        let mut end = (at + 1 + (seed >> 16) as usize % 9).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        p.push(&text[at..end], &mut out);
        at = end;
    }
    let pieces = p.finish(&mut out);
    assert_eq!(pieces.content, whole.content);
    assert_eq!(out.content, pieces.content);
    let calls = |r: &kiln::chat::tools::Reply| -> Vec<(String, String)> {
        r.tool_calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect()
    };
    assert_eq!(calls(&pieces), calls(&whole));
    for (i, c) in pieces.tool_calls.iter().enumerate() {
        let args: String = out.tool_calls.iter().filter(|d| d.index == i).map(|d| d.arguments.as_str()).collect();
        assert_eq!(args, c.arguments);
        assert!(serde_json::from_str::<serde_json::Value>(&c.arguments).is_ok());
    }
});
