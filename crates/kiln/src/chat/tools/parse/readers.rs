//! The readers of a reply's parts, fed as text arrives: a call object
//! (`{"name": ..., "arguments": ...}`), Mistral's `name[ARGS]{...}` calls, Llama 3.1's builtin
//! `name.call(key=value)` calls, and the generic reply's keys and `response` string. Each
//! consumes what it can and returns the parser's next state.

use serde_json::Value;

use super::{
    is_name_byte, After, Arr, Builtin, CallScan, GenericKey, Parsed, Phase, Role, State, ToolCallParser,
    MISTRAL_ARGS, MISTRAL_ID,
};
use crate::chat::tools::json_scan::{Scan, StringDecode, ValueScan};

impl ToolCallParser {
    pub(super) fn mistral_name(&mut self, mut name: String, out: &mut Parsed) -> (Option<State>, bool) {
        let n = self.rest().bytes().take_while(|&b| is_name_byte(b)).count();
        name.push_str(&self.rest()[..n]);
        self.consume(n);
        if self.rest().is_empty() {
            return (Some(State::MistralName(name)), n > 0);
        }
        let rest = self.rest();
        let next = if rest.starts_with(MISTRAL_ARGS) {
            self.consume(MISTRAL_ARGS.len());
            State::MistralArgs(None)
        } else if rest.starts_with(MISTRAL_ID) {
            self.consume(MISTRAL_ID.len());
            State::MistralId
        } else if MISTRAL_ARGS.starts_with(rest) || MISTRAL_ID.starts_with(rest) {
            return (Some(State::MistralName(name)), n > 0);
        } else {
            self.fail(out);
            return (None, true);
        };
        if name.is_empty() || !self.known(&name) {
            self.fail(out);
            return (None, true);
        }
        self.start_call(name, out);
        (Some(next), true)
    }

    pub(super) fn mistral_args(
        &mut self,
        scan: Option<ValueScan>,
        out: &mut Parsed,
    ) -> (Option<State>, bool) {
        let mut scan = match scan {
            Some(s) => s,
            None => {
                if !self.skip_ws() {
                    return (Some(State::MistralArgs(None)), false);
                }
                ValueScan::default()
            }
        };
        let index = self.calls.len() - 1;
        let rest = self.rest().to_string();
        match scan.feed(&rest) {
            Scan::End(n) => {
                self.add_args(index, &rest[..n], out);
                self.consume(n);
                self.complete(index);
                (Some(State::Text), true)
            }
            Scan::More => {
                self.add_args(index, &rest, out);
                self.consume(rest.len());
                (Some(State::MistralArgs(Some(scan))), false)
            }
            Scan::Bad => {
                self.fail(out);
                (None, true)
            }
        }
    }

    pub(super) fn python_tag(&mut self, out: &mut Parsed) -> (Option<State>, bool) {
        if !self.skip_ws() {
            return (Some(State::PythonTag), false);
        }
        if self.rest().starts_with('{') {
            return (Some(State::Call(Box::default(), After::JsonNext)), true);
        }
        let rest = self.rest();
        let n = rest.bytes().take_while(|&b| is_name_byte(b)).count();
        let tail = &rest[n..];
        if tail.is_empty() || ".call(".starts_with(tail) {
            return (Some(State::PythonTag), false);
        }
        if n == 0 || !tail.starts_with(".call(") || !self.known(&rest[..n]) {
            self.fail(out);
            return (None, true);
        }
        let name = rest[..n].to_string();
        self.consume(n + ".call(".len());
        let index = self.start_call(name, out);
        (Some(State::Builtin(Builtin { index, ..Default::default() })), true)
    }

    /// `key=value, ...)`, values JSON (strings in double quotes).
    pub(super) fn builtin(&mut self, mut b: Builtin, out: &mut Parsed) -> (Option<State>, bool) {
        if let Some((mut scan, mut text)) = b.value.take() {
            let rest = self.rest().to_string();
            return match scan.feed(&rest) {
                Scan::End(n) => {
                    text.push_str(&rest[..n]);
                    self.consume(n);
                    match serde_json::from_str::<Value>(&text) {
                        Ok(v) => {
                            b.args.insert(std::mem::take(&mut b.key), v);
                            b.after_value = true;
                            (Some(State::Builtin(b)), true)
                        }
                        Err(_) => {
                            self.fail(out);
                            (None, true)
                        }
                    }
                }
                Scan::More => {
                    text.push_str(&rest);
                    self.consume(rest.len());
                    b.value = Some((scan, text));
                    (Some(State::Builtin(b)), false)
                }
                Scan::Bad => {
                    self.fail(out);
                    (None, true)
                }
            };
        }
        if !self.skip_ws() {
            return (Some(State::Builtin(b)), false);
        }
        let c = self.rest().as_bytes()[0];
        if c == b')' {
            self.consume(1);
            let args = Value::Object(std::mem::take(&mut b.args)).to_string();
            self.add_args(b.index, &args, out);
            self.complete(b.index);
            return (Some(State::JsonNext), true);
        }
        if b.after_value {
            if c != b',' {
                self.fail(out);
                return (None, true);
            }
            self.consume(1);
            b.after_value = false;
            return (Some(State::Builtin(b)), true);
        }
        if b.key.is_empty() || !b.key.ends_with('=') {
            let n = self.rest().bytes().take_while(|&x| x.is_ascii_alphanumeric() || x == b'_').count();
            if n > 0 {
                b.key.push_str(&self.rest()[..n]);
                self.consume(n);
                return (Some(State::Builtin(b)), true);
            }
            if c == b'=' && !b.key.is_empty() {
                self.consume(1);
                b.key.push('=');
                return (Some(State::Builtin(b)), true);
            }
            self.fail(out);
            return (None, true);
        }
        b.key.pop();
        b.value = Some((ValueScan::default(), String::new()));
        (Some(State::Builtin(b)), true)
    }

    pub(super) fn generic_key(
        &mut self,
        scan: Option<ValueScan>,
        mut key: String,
        out: &mut Parsed,
    ) -> (Option<State>, bool) {
        let mut scan = match scan {
            Some(s) => s,
            None => {
                if !self.skip_ws() {
                    return (Some(State::GenericKey(None, key)), false);
                }
                if !self.rest().starts_with('"') {
                    self.fail(out);
                    return (None, true);
                }
                ValueScan::default()
            }
        };
        let rest = self.rest().to_string();
        match scan.feed(&rest) {
            Scan::End(n) => {
                key.push_str(&rest[..n]);
                self.consume(n);
                let k = match serde_json::from_str::<String>(&key).as_deref() {
                    Ok("tool_calls") => GenericKey::Calls,
                    Ok("tool_call") => GenericKey::Call,
                    Ok("response") => GenericKey::Response,
                    _ => {
                        self.fail(out);
                        return (None, true);
                    }
                };
                (Some(State::GenericValue(k)), true)
            }
            Scan::More => {
                key.push_str(&rest);
                self.consume(rest.len());
                (Some(State::GenericKey(Some(scan), key)), false)
            }
            Scan::Bad => {
                self.fail(out);
                (None, true)
            }
        }
    }

    pub(super) fn generic_value(&mut self, k: GenericKey, out: &mut Parsed) -> (Option<State>, bool) {
        if !self.skip_ws() {
            return (Some(State::GenericValue(k)), false);
        }
        let c = self.rest().as_bytes()[0];
        match (k, c) {
            (_, b':') => {
                self.consume(1);
                // The colon is consumed once; the value comes next.
                (Some(State::GenericValue(k)), true)
            }
            (GenericKey::Calls, b'[') => {
                self.consume(1);
                (Some(State::Item(Arr::Generic)), true)
            }
            (GenericKey::Call, b'{') => (Some(State::Call(Box::default(), After::GenericEnd)), true),
            (GenericKey::Response, b'"') => {
                (Some(State::GenericResponse(StringDecode::default(), ValueScan::default(), true)), true)
            }
            _ => {
                self.fail(out);
                (None, true)
            }
        }
    }

    pub(super) fn generic_response(
        &mut self,
        mut dec: StringDecode,
        mut scan: ValueScan,
        first: bool,
        out: &mut Parsed,
    ) -> (Option<State>, bool) {
        let rest = self.rest().to_string();
        let skip = usize::from(first);
        let (body, next) = match scan.feed(&rest) {
            Scan::End(n) => {
                self.consume(n);
                (&rest[skip..n - 1], None)
            }
            Scan::More => {
                self.consume(rest.len());
                (&rest[skip..], Some(scan))
            }
            Scan::Bad => {
                self.fail(out);
                return (None, true);
            }
        };
        let text = match next {
            Some(_) => dec.push(body),
            None => dec.push(body).and_then(|a| dec.finish().map(|b| a + &b)),
        };
        let Some(text) = text else {
            self.fail(out);
            return (None, true);
        };
        self.emit_verbatim(&text, out);
        match next {
            Some(scan) => (Some(State::GenericResponse(dec, scan, false)), false),
            None => (Some(State::GenericEnd), true),
        }
    }

    pub(super) fn call(
        &mut self,
        mut c: Box<CallScan>,
        after: After,
        out: &mut Parsed,
    ) -> (Option<State>, bool) {
        match c.phase {
            Phase::Open | Phase::KeyOrClose | Phase::Colon | Phase::ValueStart | Phase::CommaOrClose => {
                if !self.skip_ws() {
                    return (Some(State::Call(c, after)), false);
                }
                let b = self.rest().as_bytes()[0];
                let ok = match (c.phase, b) {
                    (Phase::Open, b'{') => {
                        self.consume(1);
                        c.phase = Phase::KeyOrClose;
                        true
                    }
                    (Phase::KeyOrClose, b'"') => {
                        c.phase = Phase::Key;
                        c.scan = ValueScan::default();
                        c.key.clear();
                        true
                    }
                    (Phase::KeyOrClose | Phase::CommaOrClose, b'}') => {
                        self.consume(1);
                        return self.close_call(&c, after, out);
                    }
                    (Phase::Colon, b':') => {
                        self.consume(1);
                        c.phase = Phase::ValueStart;
                        true
                    }
                    (Phase::ValueStart, _) => {
                        c.phase = Phase::Value;
                        c.scan = ValueScan::default();
                        c.value.clear();
                        true
                    }
                    (Phase::CommaOrClose, b',') => {
                        self.consume(1);
                        c.phase = Phase::KeyOrClose;
                        true
                    }
                    _ => false,
                };
                if !ok {
                    self.fail(out);
                    return (None, true);
                }
                (Some(State::Call(c, after)), true)
            }
            Phase::Key => {
                let rest = self.rest().to_string();
                match c.scan.feed(&rest) {
                    Scan::End(n) => {
                        c.key.push_str(&rest[..n]);
                        self.consume(n);
                        c.role = match serde_json::from_str::<String>(&c.key).as_deref() {
                            Ok("name") => Role::Name,
                            Ok("arguments" | "parameters") => Role::Args,
                            Ok("type" | "id") => Role::Skip,
                            // Another key before the name: not a call object.
                            _ if c.index.is_none() => {
                                self.fail(out);
                                return (None, true);
                            }
                            _ => Role::Skip,
                        };
                        c.phase = Phase::Colon;
                        (Some(State::Call(c, after)), true)
                    }
                    Scan::More => {
                        c.key.push_str(&rest);
                        self.consume(rest.len());
                        (Some(State::Call(c, after)), false)
                    }
                    Scan::Bad => {
                        self.fail(out);
                        (None, true)
                    }
                }
            }
            Phase::Value => self.call_value(c, after, out),
        }
    }

    pub(super) fn call_value(
        &mut self,
        mut c: Box<CallScan>,
        after: After,
        out: &mut Parsed,
    ) -> (Option<State>, bool) {
        let rest = self.rest().to_string();
        let r = c.scan.feed(&rest);
        let n = match r {
            Scan::End(n) => n,
            Scan::More => rest.len(),
            Scan::Bad => {
                self.fail(out);
                return (None, true);
            }
        };
        let piece = &rest[..n];
        self.consume(n);
        let done = matches!(r, Scan::End(_));
        match c.role {
            Role::Skip => {}
            Role::Name => c.value.push_str(piece),
            Role::Args if c.scan.is_string() => c.value.push_str(piece),
            Role::Args => match c.index {
                Some(i) => self.add_args(i, piece, out),
                None => c.pending.push_str(piece),
            },
        }
        if !done {
            return (Some(State::Call(c, after)), false);
        }
        c.phase = Phase::CommaOrClose;
        match c.role {
            Role::Name if c.index.is_none() => {
                let name = serde_json::from_str::<String>(&c.value).ok().filter(|n| self.known(n));
                let Some(name) = name else {
                    self.fail(out);
                    return (None, true);
                };
                let i = self.start_call(name, out);
                let pending = std::mem::take(&mut c.pending);
                self.add_args(i, &pending, out);
                c.index = Some(i);
            }
            Role::Args => {
                c.args_seen = true;
                if c.scan.is_string() {
                    // Arguments written as a JSON string of JSON.
                    let text = serde_json::from_str::<String>(&c.value).unwrap_or_default();
                    c.value.clear();
                    match c.index {
                        Some(i) => self.add_args(i, &text, out),
                        None => c.pending = text,
                    }
                }
            }
            _ => {}
        }
        (Some(State::Call(c, after)), true)
    }

    pub(super) fn close_call(
        &mut self,
        c: &CallScan,
        after: After,
        out: &mut Parsed,
    ) -> (Option<State>, bool) {
        let Some(i) = c.index else {
            self.fail(out);
            return (None, true);
        };
        if !c.args_seen {
            self.add_args(i, "{}", out);
        }
        if !self.complete(i) {
            self.fail(out);
            return (None, true);
        }
        let next = match after {
            After::HermesClose => State::HermesClose,
            After::FenceClose => State::FenceClose,
            After::Next(arr) => State::Next(arr),
            After::JsonNext => State::JsonNext,
            After::GenericEnd => State::GenericEnd,
            After::Text => State::Text,
        };
        (Some(next), true)
    }
}
