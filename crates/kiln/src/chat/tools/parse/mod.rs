//! The streaming tool-call parser: model output in, content and call deltas out, for each
//! [`ToolFormat`]. Text that might still turn out to be call markup (a partial `<tool_call>`,
//! a Llama reply's opening `{`) is held back until it is known, so markup never reaches the
//! content. A block that opens like a call but is not one (unknown function, not a call
//! object) is given back as content; a call cut short at the end of the output is dropped.
//! Parsing a whole reply is the same code fed once, so streamed and whole replies agree.

use serde_json::Value;

mod readers;

use super::json_scan::{StringDecode, ValueScan};
use super::{new_call_id, ToolCall, ToolCallDelta, ToolFormat};

/// What one `push` (or `finish`) released: content text and the deltas of calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub content: String,
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A whole reply: its content and every complete call, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reply {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
}

/// Parses one reply. Feed it the output text as it streams (`push`), then `finish`.
#[derive(Debug)]
pub struct ToolCallParser {
    format: ToolFormat,
    /// Functions that may be called; a call of any other name is content. Empty: any.
    names: Vec<String>,
    buf: String,
    pos: usize,
    state: State,
    /// The current block's text since its opener, while none of its calls has started:
    /// content again if the block turns out not to hold calls.
    raw: Option<String>,
    /// Nothing but whitespace yet: Llama 3 and generic replies open with their JSON, and a
    /// Hermes reply may too (small models drop the tags).
    at_start: bool,
    /// Whitespace after content, released only when more content follows.
    held_ws: String,
    content: String,
    calls: Vec<Call>,
}

#[derive(Debug)]
struct Call {
    id: String,
    name: String,
    arguments: String,
    complete: bool,
}

#[derive(Debug)]
enum State {
    Text,
    /// After `<tool_call>`.
    HermesBody,
    /// After a Hermes call object: `</tool_call>`.
    HermesClose,
    /// After a call in a Markdown code block: its closing fence.
    FenceClose,
    /// After Mistral Nemo's `[TOOL_CALLS]`: `[` (or one bare call object).
    NemoOpen,
    /// Before a call object in an array.
    Item(Arr),
    /// After a call object in an array: `,` or `]`.
    Next(Arr),
    /// After Mistral's `[TOOL_CALLS]`: the function name, up to `[ARGS]` or `[CALL_ID]`.
    MistralName(String),
    /// A Mistral call id, up to `[ARGS]`.
    MistralId,
    /// A Mistral call's arguments value.
    MistralArgs(Option<ValueScan>),
    /// After a bare JSON call (Llama 3, or Hermes without its tags): another one, or text.
    JsonNext,
    /// After `<|python_tag|>`: a JSON call or a builtin `name.call(...)`.
    PythonTag,
    /// The arguments of a builtin call, `key=value, ...)`.
    Builtin(Builtin),
    /// A generic reply's key.
    GenericKey(Option<ValueScan>, String),
    /// After a generic key: `:` and its value.
    GenericValue(GenericKey),
    /// The `response` string of a generic reply, streamed as content.
    GenericResponse(StringDecode, ValueScan, bool),
    /// A generic reply's closing `}`.
    GenericEnd,
    /// The generic reply is complete; anything after it is ignored.
    Done,
    Call(Box<CallScan>, After),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arr {
    Nemo,
    Generic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GenericKey {
    Calls,
    Call,
    Response,
}

/// Where a call object's parse goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    HermesClose,
    FenceClose,
    Next(Arr),
    JsonNext,
    GenericEnd,
    Text,
}

/// A call object `{"name": ..., "arguments"|"parameters": ..., ...}` being read.
#[derive(Debug, Default)]
struct CallScan {
    phase: Phase,
    scan: ValueScan,
    key: String,
    role: Role,
    /// Raw text of the name, or of arguments given as a JSON string.
    value: String,
    index: Option<usize>,
    /// Arguments read before the name.
    pending: String,
    args_seen: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    #[default]
    Open,
    KeyOrClose,
    Key,
    Colon,
    ValueStart,
    Value,
    CommaOrClose,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Role {
    #[default]
    Skip,
    Name,
    Args,
}

#[derive(Debug, Default)]
struct Builtin {
    index: usize,
    args: serde_json::Map<String, Value>,
    key: String,
    /// `None`: reading a key; `Some`: reading its value.
    value: Option<(ValueScan, String)>,
    after_value: bool,
}

enum Lit {
    Yes,
    Partial,
    No,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_ID: &str = "[CALL_ID]";
const PYTHON_TAG: &str = "<|python_tag|>";

/// Whether a reply opening with a Markdown fence (```` ``` ```` or ```` ```json ````) holds a JSON call.
enum Fence {
    Wait,
    /// A call: its `{` follows this many bytes of fence and whitespace.
    Call(usize),
    No,
}

/// Small models wrap a call in a code block; `body` is the reply from its first non-space.
fn fenced_call(body: &str) -> Fence {
    if "```json".starts_with(body) {
        return Fence::Wait;
    }
    let Some(after) = body.strip_prefix("```json").or_else(|| body.strip_prefix("```")) else {
        return Fence::No;
    };
    if "json".starts_with(after) && !after.is_empty() {
        return Fence::Wait;
    }
    let json = after.trim_start();
    match json.as_bytes().first() {
        None => Fence::Wait,
        Some(b'{') => Fence::Call(body.len() - json.len()),
        Some(_) => Fence::No,
    }
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

impl ToolCallParser {
    /// A parser for `format` that accepts calls of any function.
    pub fn new(format: ToolFormat) -> Self {
        ToolCallParser {
            format,
            names: Vec::new(),
            buf: String::new(),
            pos: 0,
            state: State::Text,
            raw: None,
            at_start: true,
            held_ws: String::new(),
            content: String::new(),
            calls: Vec::new(),
        }
    }

    /// Accepts calls of these functions only; any other "call" is content.
    pub fn with_names(mut self, names: Vec<String>) -> Self {
        self.names = names;
        self
    }

    /// Feeds the next piece of output; what it releases is appended to `out`.
    pub fn push(&mut self, text: &str, out: &mut Parsed) {
        self.buf.push_str(text);
        while self.step(out) {}
        self.buf.drain(..self.pos);
        self.pos = 0;
    }

    /// Ends the output: releases what was held back and returns the whole reply. A call
    /// cut short is left out (its start may have streamed already).
    pub fn finish(&mut self, out: &mut Parsed) -> Reply {
        match std::mem::replace(&mut self.state, State::Text) {
            State::Text => {
                let rest = self.buf[self.pos..].to_string();
                self.emit(&rest, out);
                if self.calls.is_empty() && !self.content.is_empty() {
                    let ws = std::mem::take(&mut self.held_ws);
                    self.content.push_str(&ws);
                    out.content.push_str(&ws);
                }
            }
            State::MistralArgs(Some(scan)) if scan.complete_at_end() => {
                let i = self.calls.len() - 1;
                self.complete(i);
            }
            // An unfinished block: its call, if one began, is incomplete and left out.
            _ => {}
        }
        self.buf.clear();
        self.pos = 0;
        Reply {
            content: self.content.clone(),
            tool_calls: self
                .calls
                .iter()
                .filter(|c| c.complete)
                .map(|c| ToolCall { id: c.id.clone(), name: c.name.clone(), arguments: c.arguments.clone() })
                .collect(),
        }
    }

    fn rest(&self) -> &str {
        &self.buf[self.pos..]
    }

    /// Consumes `n` bytes of the unread text (kept in `raw` while the block is undecided).
    fn consume(&mut self, n: usize) {
        if let Some(raw) = &mut self.raw {
            raw.push_str(&self.buf[self.pos..self.pos + n]);
        }
        self.pos += n;
    }

    /// Skips whitespace; true when a non-space byte is next.
    fn skip_ws(&mut self) -> bool {
        let rest = self.rest();
        let n = rest.len() - rest.trim_start().len();
        self.consume(n);
        !self.rest().is_empty()
    }

    fn lit(&mut self, lit: &str) -> Lit {
        let rest = self.rest();
        if rest.starts_with(lit) {
            self.consume(lit.len());
            Lit::Yes
        } else if lit.starts_with(rest) {
            Lit::Partial
        } else {
            Lit::No
        }
    }

    /// Content text; whitespace at its end waits for what follows.
    fn emit(&mut self, text: &str, out: &mut Parsed) {
        if text.is_empty() {
            return;
        }
        let body = text.trim_end();
        if !body.is_empty() {
            if !self.content.is_empty() {
                let ws = std::mem::take(&mut self.held_ws);
                self.content.push_str(&ws);
                out.content.push_str(&ws);
            }
            self.held_ws.clear();
            self.content.push_str(body);
            out.content.push_str(body);
        }
        self.held_ws.push_str(&text[body.len()..]);
    }

    /// Content exactly as given (a generic reply's `response`).
    fn emit_verbatim(&mut self, text: &str, out: &mut Parsed) {
        self.raw = None;
        self.content.push_str(text);
        out.content.push_str(text);
    }

    /// The block is not calls after all: its text is content, and parsing goes on as text.
    /// A block whose calls began already just ends (its unfinished call is dropped).
    fn fail(&mut self, out: &mut Parsed) {
        if let Some(raw) = self.raw.take() {
            self.emit(&raw, out);
        }
        self.state = State::Text;
        self.at_start = false;
    }

    fn known(&self, name: &str) -> bool {
        self.names.is_empty() || self.names.iter().any(|n| n == name)
    }

    /// Starts call `name`: its id and name go out, and the block is committed.
    fn start_call(&mut self, name: String, out: &mut Parsed) -> usize {
        self.raw = None;
        self.held_ws.clear();
        let id = new_call_id();
        let index = self.calls.len();
        out.tool_calls.push(ToolCallDelta {
            index,
            id: Some(id.clone()),
            name: Some(name.clone()),
            arguments: String::new(),
        });
        self.calls.push(Call { id, name, arguments: String::new(), complete: false });
        index
    }

    fn add_args(&mut self, index: usize, text: &str, out: &mut Parsed) {
        if text.is_empty() {
            return;
        }
        self.calls[index].arguments.push_str(text);
        match out.tool_calls.last_mut() {
            Some(d) if d.index == index && d.id.is_none() => d.arguments.push_str(text),
            _ => out.tool_calls.push(ToolCallDelta {
                index,
                id: None,
                name: None,
                arguments: text.to_string(),
            }),
        }
    }

    /// Marks call `index` done if its arguments are a JSON value.
    fn complete(&mut self, index: usize) -> bool {
        let ok = serde_json::from_str::<Value>(&self.calls[index].arguments).is_ok();
        self.calls[index].complete = ok;
        ok
    }

    fn openers(&self) -> &'static [&'static str] {
        match self.format {
            ToolFormat::Hermes => &[HERMES_OPEN],
            ToolFormat::MistralNemo | ToolFormat::Mistral => &[MISTRAL_OPEN],
            ToolFormat::Llama3 => &[PYTHON_TAG],
            ToolFormat::Generic => &[],
        }
    }

    /// One move; false when more text is needed.
    fn step(&mut self, out: &mut Parsed) -> bool {
        let state = std::mem::replace(&mut self.state, State::Text);
        let (state, progress) = self.advance(state, out);
        // `fail` may have reset the state already; a returned state wins otherwise.
        if let Some(s) = state {
            self.state = s;
        }
        progress
    }

    /// Advances `state`; returns the next state (None: keep what `self.state` holds) and
    /// whether anything moved.
    fn advance(&mut self, state: State, out: &mut Parsed) -> (Option<State>, bool) {
        use State::*;
        if self.rest().is_empty() {
            return (Some(state), false);
        }
        match state {
            Text => self.text(out),
            HermesBody => {
                if !self.skip_ws() {
                    return (Some(HermesBody), false);
                }
                (Some(Call(Box::default(), After::HermesClose)), true)
            }
            HermesClose => {
                if !self.skip_ws() {
                    return (Some(HermesClose), false);
                }
                match self.lit(HERMES_CLOSE) {
                    Lit::Yes | Lit::No => (Some(Text), true),
                    Lit::Partial => (Some(HermesClose), false),
                }
            }
            FenceClose => {
                if !self.skip_ws() {
                    return (Some(FenceClose), false);
                }
                match self.lit("```") {
                    Lit::Yes => (Some(JsonNext), true),
                    Lit::Partial => (Some(FenceClose), false),
                    Lit::No => (Some(Text), true),
                }
            }
            NemoOpen => {
                if !self.skip_ws() {
                    return (Some(NemoOpen), false);
                }
                if self.rest().starts_with('[') {
                    self.consume(1);
                    (Some(Item(Arr::Nemo)), true)
                } else if self.rest().starts_with('{') {
                    (Some(Call(Box::default(), After::Text)), true)
                } else {
                    self.fail(out);
                    (None, true)
                }
            }
            Item(arr) => {
                if !self.skip_ws() {
                    return (Some(Item(arr)), false);
                }
                (Some(Call(Box::default(), After::Next(arr))), true)
            }
            Next(arr) => {
                if !self.skip_ws() {
                    return (Some(Next(arr)), false);
                }
                let b = self.rest().as_bytes()[0];
                match b {
                    b',' => {
                        self.consume(1);
                        (Some(Item(arr)), true)
                    }
                    b']' => {
                        self.consume(1);
                        (Some(if arr == Arr::Nemo { Text } else { GenericEnd }), true)
                    }
                    _ => {
                        self.fail(out);
                        (None, true)
                    }
                }
            }
            MistralName(name) => self.mistral_name(name, out),
            MistralId => {
                let n = self.rest().find('[').unwrap_or(self.rest().len());
                self.consume(n);
                match self.lit(MISTRAL_ARGS) {
                    Lit::Yes => (Some(MistralArgs(None)), true),
                    Lit::Partial => (Some(MistralId), n > 0),
                    Lit::No => {
                        self.fail(out);
                        (None, true)
                    }
                }
            }
            MistralArgs(scan) => self.mistral_args(scan, out),
            JsonNext => {
                if !self.skip_ws() {
                    return (Some(JsonNext), false);
                }
                if self.rest().starts_with(';') {
                    self.consume(1);
                    return (Some(JsonNext), true);
                }
                if self.rest().starts_with('{') {
                    self.raw = Some(String::new());
                    return (Some(Call(Box::default(), After::JsonNext)), true);
                }
                // Text, or a marked call the text state finds.
                (Some(Text), true)
            }
            PythonTag => self.python_tag(out),
            Builtin(b) => self.builtin(b, out),
            GenericKey(scan, key) => self.generic_key(scan, key, out),
            GenericValue(k) => self.generic_value(k, out),
            GenericResponse(dec, scan, first) => self.generic_response(dec, scan, first, out),
            GenericEnd => {
                if !self.skip_ws() {
                    return (Some(GenericEnd), false);
                }
                if self.rest().starts_with('}') {
                    self.consume(1);
                    (Some(Done), true)
                } else {
                    self.fail(out);
                    (None, true)
                }
            }
            Done => {
                let n = self.rest().len();
                self.consume(n);
                (Some(Done), false)
            }
            Call(scan, after) => self.call(scan, after, out),
        }
    }

    fn text(&mut self, out: &mut Parsed) -> (Option<State>, bool) {
        if self.at_start
            && matches!(self.format, ToolFormat::Llama3 | ToolFormat::Generic | ToolFormat::Hermes)
        {
            let rest = self.rest();
            let body = rest.trim_start();
            if body.is_empty() {
                return (Some(State::Text), false);
            }
            if body.starts_with('{') {
                let ws = rest.len() - body.len();
                self.pos += ws;
                self.at_start = false;
                self.raw = Some(String::new());
                self.consume(1);
                let next = match self.format {
                    ToolFormat::Generic => State::GenericKey(None, String::new()),
                    _ => {
                        let scan = CallScan { phase: Phase::KeyOrClose, ..Default::default() };
                        State::Call(Box::new(scan), After::JsonNext)
                    }
                };
                return (Some(next), true);
            }
            if self.format == ToolFormat::Hermes && (body.starts_with("```") || "```".starts_with(body)) {
                match fenced_call(body) {
                    Fence::Wait => return (Some(State::Text), false),
                    Fence::Call(n) => {
                        self.pos += rest.len() - body.len();
                        self.at_start = false;
                        self.raw = Some(String::new());
                        self.consume(n);
                        return (Some(State::Call(Box::default(), After::FenceClose)), true);
                    }
                    Fence::No => {}
                }
            }
        }
        self.at_start = false;
        let rest = self.rest();
        let found =
            self.openers().iter().filter_map(|o| rest.find(o).map(|k| (k, *o))).min_by_key(|&(k, _)| k);
        if let Some((k, opener)) = found {
            let before = rest[..k].to_string();
            self.emit(&before, out);
            self.held_ws.clear();
            self.pos += k + opener.len();
            self.raw = Some(opener.to_string());
            let next = match self.format {
                ToolFormat::Hermes => State::HermesBody,
                ToolFormat::MistralNemo => State::NemoOpen,
                ToolFormat::Mistral => State::MistralName(String::new()),
                _ => State::PythonTag,
            };
            return (Some(next), true);
        }
        // Hold back an ending that may begin an opener.
        let hold = self
            .openers()
            .iter()
            .flat_map(|o| (1..o.len()).rev().filter(move |&n| rest.ends_with(&o[..n])))
            .max()
            .unwrap_or(0);
        let text = rest[..rest.len() - hold].to_string();
        self.emit(&text, out);
        self.pos += text.len();
        (Some(State::Text), false)
    }
}
