//! Turning scheduler events into OpenAI responses: one JSON body, or server-sent events
//! ending with `data: [DONE]`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use kiln::chat::tools::{Parsed, ToolCall, ToolCallDelta, ToolCallParser};

use crate::error::ApiError;
use crate::params::Kind;
use crate::scheduler::{Event, Finish, Logprob};
use crate::state::App;
use crate::structured::Tools;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The accumulating reply to one generation request (all its choices).
pub struct Reply {
    app: Arc<App>,
    kind: Kind,
    id: String,
    created: u64,
    include_usage: bool,
    want_logprobs: bool,
    prompt_tokens: usize,
    completion_tokens: usize,
    /// Speculative decoding's tokens drafted and accepted, over the choices.
    draft_tokens: usize,
    accepted_tokens: usize,
    texts: Vec<String>,
    logprobs: Vec<Vec<Logprob>>,
    /// Per choice: its finish reason, once done.
    finish: Vec<Option<&'static str>>,
    /// Per choice: the parser of its tool calls, in a chat with tools.
    parsers: Vec<Option<ToolCallParser>>,
    /// Per choice: its calls, once done.
    calls: Vec<Vec<ToolCall>>,
    role_sent: Vec<bool>,
    n_done: usize,
}

impl Reply {
    pub fn new(
        app: Arc<App>,
        kind: Kind,
        n_choices: usize,
        include_usage: bool,
        want_logprobs: bool,
        prompts: &[Vec<u32>],
        tools: &Tools,
    ) -> Self {
        let prefix = if kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
        let created =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let id = format!("{prefix}-kiln{:x}{:06x}", created, NEXT_ID.fetch_add(1, Ordering::Relaxed));
        Reply {
            app,
            kind,
            id,
            created,
            include_usage,
            want_logprobs,
            prompt_tokens: prompts.iter().map(Vec::len).sum(),
            completion_tokens: 0,
            draft_tokens: 0,
            accepted_tokens: 0,
            texts: vec![String::new(); n_choices],
            logprobs: vec![Vec::new(); n_choices],
            finish: vec![None; n_choices],
            parsers: (0..n_choices).map(|_| tools.parser()).collect(),
            calls: vec![Vec::new(); n_choices],
            role_sent: vec![false; n_choices],
            n_done: 0,
        }
    }

    fn all_done(&self) -> bool {
        self.n_done == self.finish.len()
    }

    /// OpenAI's usage object; where the server speculates, with the tokens drafted and
    /// accepted besides (`accepted_tokens` of `draft_tokens` were emitted from drafts).
    fn usage(&self) -> Value {
        let mut u = json!({"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
               "total_tokens": self.prompt_tokens + self.completion_tokens});
        if self.app.ready.get().is_some_and(|r| r.engine.spec().enabled()) {
            u["draft_tokens"] = self.draft_tokens.into();
            u["accepted_tokens"] = self.accepted_tokens.into();
        }
        u
    }

    fn error_for(&self, message: String) -> ApiError {
        if self.app.draining() {
            ApiError::unavailable(message)
        } else {
            ApiError::internal(message)
        }
    }

    fn piece(&self, id: u32) -> (String, Vec<u8>) {
        let bytes =
            self.app.ready.get().map_or(&[][..], |r| r.engine.tokenizer().token_to_piece(id, true)).to_vec();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    /// OpenAI's logprobs object for `lps` (chat: `content` entries; completions: the
    /// legacy parallel arrays, `text_offset` counted from `offset`).
    fn logprobs_json(&self, lps: &[Logprob], offset: usize) -> Value {
        if self.kind == Kind::Chat {
            let entry = |id: u32, lp: f32| {
                let (token, bytes) = self.piece(id);
                json!({"token": token, "logprob": lp, "bytes": bytes})
            };
            let content: Vec<Value> = lps
                .iter()
                .map(|l| {
                    let mut e = entry(l.token, l.logprob);
                    e["top_logprobs"] = l.top.iter().map(|&(t, p)| entry(t, p)).collect();
                    e
                })
                .collect();
            json!({"content": content})
        } else {
            let mut at = offset;
            let (mut tokens, mut lp, mut top, mut offs) = (vec![], vec![], vec![], vec![]);
            for l in lps {
                let (t, _) = self.piece(l.token);
                offs.push(at);
                at += t.len();
                tokens.push(t);
                lp.push(l.logprob);
                let m: serde_json::Map<String, Value> =
                    l.top.iter().map(|&(id, p)| (self.piece(id).0, json!(p))).collect();
                top.push(Value::Object(m));
            }
            json!({"tokens": tokens, "token_logprobs": lp, "top_logprobs": top, "text_offset": offs})
        }
    }

    fn chunk(&self, choice: Value) -> String {
        let object = if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
        let c = json!({"id": self.id, "object": object, "created": self.created, "model": self.app.model_id,
                       "choices": [choice]});
        format!("data: {c}\n\n")
    }

    /// Applies one event; returns the SSE chunks it produces.
    fn apply(&mut self, ev: Event, out: &mut VecDeque<String>) -> Result<(), String> {
        match ev {
            Event::Token { index, text, logprob } => {
                let lp = logprob.filter(|_| self.want_logprobs);
                let mut parsed = Parsed::default();
                let text = match &mut self.parsers[index] {
                    Some(p) => {
                        p.push(&text, &mut parsed);
                        std::mem::take(&mut parsed.content)
                    }
                    None => text,
                };
                let offset = self.texts[index].len();
                self.texts[index].push_str(&text);
                let lp_json =
                    lp.as_ref().map_or(Value::Null, |l| self.logprobs_json(std::slice::from_ref(l), offset));
                if self.kind == Kind::Chat && !self.role_sent[index] {
                    self.role_sent[index] = true;
                    out.push_back(
                        self.chunk(json!({"index": index, "delta": {"role": "assistant", "content": ""},
                                                   "logprobs": null, "finish_reason": null})),
                    );
                }
                if !text.is_empty() || lp.is_some() {
                    let choice = if self.kind == Kind::Chat {
                        json!({"index": index, "delta": {"content": text}, "logprobs": lp_json, "finish_reason": null})
                    } else {
                        json!({"index": index, "text": text, "logprobs": lp_json, "finish_reason": null})
                    };
                    out.push_back(self.chunk(choice));
                }
                self.call_chunks(index, &parsed.tool_calls, out);
                if let Some(l) = lp {
                    self.logprobs[index].push(l);
                }
            }
            Event::Done { index, finish, completion_tokens, draft_tokens, accepted_tokens, .. } => {
                let mut reason = finish.as_openai();
                if let Some(p) = &mut self.parsers[index] {
                    let mut parsed = Parsed::default();
                    let reply = p.finish(&mut parsed);
                    if !parsed.content.is_empty() {
                        self.texts[index].push_str(&parsed.content);
                        let delta = json!({"content": parsed.content});
                        out.push_back(self.chunk(
                            json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null}),
                        ));
                    }
                    self.call_chunks(index, &parsed.tool_calls, out);
                    if !reply.tool_calls.is_empty() && finish == Finish::Stop {
                        reason = "tool_calls";
                    }
                    self.calls[index] = reply.tool_calls;
                }
                self.finish[index] = Some(reason);
                self.completion_tokens += completion_tokens;
                self.draft_tokens += draft_tokens;
                self.accepted_tokens += accepted_tokens;
                self.n_done += 1;
                let choice = if self.kind == Kind::Chat {
                    json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": reason})
                } else {
                    json!({"index": index, "text": "", "logprobs": null, "finish_reason": reason})
                };
                out.push_back(self.chunk(choice));
            }
            Event::Error { message, .. } => return Err(message),
        }
        Ok(())
    }

    /// OpenAI's `delta.tool_calls` chunks: a call's index, id and name first, then its
    /// argument text.
    fn call_chunks(&self, index: usize, deltas: &[ToolCallDelta], out: &mut VecDeque<String>) {
        for d in deltas {
            let delta = json!({"tool_calls": [d.to_openai()]});
            out.push_back(
                self.chunk(json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null})),
            );
        }
    }

    fn body(&self) -> Value {
        let choices: Vec<Value> = (0..self.texts.len())
            .map(|i| {
                let lp =
                    if self.want_logprobs { self.logprobs_json(&self.logprobs[i], 0) } else { Value::Null };
                let finish = self.finish[i];
                if self.kind == Kind::Chat {
                    let mut message = json!({"role": "assistant", "content": self.texts[i]});
                    if !self.calls[i].is_empty() {
                        message["tool_calls"] = self.calls[i].iter().map(ToolCall::to_openai).collect();
                        if self.texts[i].is_empty() {
                            message["content"] = Value::Null;
                        }
                    }
                    json!({"index": i, "message": message, "logprobs": lp, "finish_reason": finish})
                } else {
                    json!({"index": i, "text": self.texts[i], "logprobs": lp, "finish_reason": finish})
                }
            })
            .collect();
        let object = if self.kind == Kind::Chat { "chat.completion" } else { "text_completion" };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.app.model_id,
               "choices": choices, "usage": self.usage()})
    }
}

/// Waits for every choice and answers with one JSON body.
pub async fn collect(mut reply: Reply, mut rx: UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let mut sink = VecDeque::new();
    while !reply.all_done() {
        let Some(ev) = rx.recv().await else {
            return Err(ApiError::unavailable("the server is shutting down"));
        };
        reply.apply(ev, &mut sink).map_err(|m| reply.error_for(m))?;
        sink.clear();
    }
    Ok(Json(reply.body()).into_response())
}

struct Sse {
    reply: Reply,
    rx: UnboundedReceiver<Event>,
    out: VecDeque<String>,
    ended: bool,
    status: u16,
}

impl Drop for Sse {
    fn drop(&mut self) {
        // Dropped before the end: the client went away (nginx's 499).
        let status = if self.ended { self.status } else { 499 };
        self.reply.app.shared.metrics.request_done(status);
    }
}

/// Streams the reply as server-sent events. Dropping the body (a client that disconnects)
/// drops the receiver, which the scheduler sees and cancels the request.
pub fn event_stream(reply: Reply, rx: UnboundedReceiver<Event>) -> Response {
    let state = Sse { reply, rx, out: VecDeque::new(), ended: false, status: 200 };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(chunk) = st.out.pop_front() {
                return Some((Ok::<_, Infallible>(Bytes::from(chunk)), st));
            }
            if st.ended {
                return None;
            }
            let ev = st.rx.recv().await;
            let r = match ev {
                Some(ev) => st.reply.apply(ev, &mut st.out),
                None => Err("the server is shutting down".to_string()),
            };
            match r {
                Err(message) => {
                    let e = st.reply.error_for(message);
                    st.status = e.status.as_u16();
                    st.out.push_back(format!("data: {}\n\n", e.body()));
                    st.out.push_back("data: [DONE]\n\n".into());
                    st.ended = true;
                }
                Ok(()) if st.reply.all_done() => {
                    if st.reply.include_usage {
                        let object = if st.reply.kind == Kind::Chat {
                            "chat.completion.chunk"
                        } else {
                            "text_completion"
                        };
                        let u = json!({"id": st.reply.id, "object": object, "created": st.reply.created,
                                       "model": st.reply.app.model_id, "choices": [], "usage": st.reply.usage()});
                        st.out.push_back(format!("data: {u}\n\n"));
                    }
                    st.out.push_back("data: [DONE]\n\n".into());
                    st.ended = true;
                }
                Ok(()) => {}
            }
        }
    });
    let mut r = Response::new(Body::from_stream(stream));
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-cache"));
    r
}

/// Little-endian f32 bytes in standard base64 (OpenAI's `encoding_format: "base64"`).
pub fn base64_f32(v: &[f32]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for k in 0..4 {
            if k <= c.len() {
                s.push(A[(n >> (18 - 6 * k)) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc4648() {
        // 1.0f32 = 00 00 80 3f
        assert_eq!(super::base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(super::base64_f32(&[]), "");
    }
}
