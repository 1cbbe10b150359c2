//! What generation returns: `Completion` (the whole result), `Piece` (one streamed step)
//! and `Timings`.

use kiln::chat::tools::ToolCallDelta;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::convert::from_json;

/// Where the time went: prompt tokens evaluated (and reused from the KV cache), generated
/// tokens, and the milliseconds each took.
#[pyclass(module = "kiln", frozen, get_all)]
pub struct Timings {
    pub prompt_n: usize,
    pub prompt_cached: usize,
    pub prompt_ms: f64,
    pub gen_n: usize,
    pub gen_ms: f64,
}

fn rate(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1e3 / ms
    } else {
        0.0
    }
}

#[pymethods]
impl Timings {
    /// Prompt tokens evaluated per second.
    #[getter]
    fn prompt_tok_s(&self) -> f64 {
        rate(self.prompt_n, self.prompt_ms)
    }
    /// Tokens generated per second.
    #[getter]
    fn gen_tok_s(&self) -> f64 {
        rate(self.gen_n, self.gen_ms)
    }
    fn __repr__(&self) -> String {
        format!(
            "Timings(prompt_n={}, prompt_cached={}, prompt_ms={:.3}, gen_n={}, gen_ms={:.3})",
            self.prompt_n, self.prompt_cached, self.prompt_ms, self.gen_n, self.gen_ms
        )
    }
}

impl From<&kiln::session::Timings> for Timings {
    fn from(t: &kiln::session::Timings) -> Self {
        Timings {
            prompt_n: t.prompt_n,
            prompt_cached: t.prompt_cached,
            prompt_ms: t.prompt_ms,
            gen_n: t.gen_n,
            gen_ms: t.gen_ms,
        }
    }
}

/// One streamed step: the text it releases (valid UTF-8, possibly empty while a character
/// or a possible stop string is incomplete), the sampled token id (None for text released
/// at the end, which belongs to no new token), when asked for, log-probabilities, and in a
/// chat with tools the pieces of calls this step completed.
#[pyclass(module = "kiln", frozen)]
pub struct Piece {
    #[pyo3(get)]
    pub text: String,
    #[pyo3(get)]
    pub id: Option<u32>,
    #[pyo3(get)]
    pub logprob: Option<f32>,
    #[pyo3(get)]
    pub top_logprobs: Vec<(u32, f32)>,
    calls: Vec<ToolCallDelta>,
}

#[pymethods]
impl Piece {
    /// OpenAI's `delta.tool_calls` entries: a call's index, id, type and name first (with
    /// empty arguments), then fragments of its arguments.
    #[getter]
    fn tool_calls<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(
            py,
            self.calls.iter().map(|c| from_json(py, &c.to_openai())).collect::<PyResult<Vec<_>>>()?,
        )
    }
    fn __str__(&self) -> &str {
        &self.text
    }
    fn __repr__(&self) -> String {
        let id = self.id.map_or("None".to_string(), |i| i.to_string());
        format!("Piece(text={:?}, id={id})", self.text)
    }
}

impl Piece {
    pub fn from_event(ev: &kiln::Event) -> Piece {
        Piece {
            text: ev.text.to_string(),
            id: (!ev.flush).then_some(ev.token),
            logprob: ev.logprob,
            top_logprobs: ev.top_logprobs.to_vec(),
            calls: ev.tool_calls.to_vec(),
        }
    }
}

/// A finished generation. `str()` gives the text.
#[pyclass(module = "kiln", frozen, get_all)]
pub struct Completion {
    /// The generated text, without control tokens, cut before a matched stop string.
    pub text: String,
    /// Every sampled token id, a final end-of-generation token included.
    pub ids: Vec<u32>,
    /// The prompt's token ids (the whole conversation, for a session).
    pub prompt_ids: Vec<u32>,
    /// "eog", "stop", "length", "context_full" or "cancelled".
    pub finish_reason: &'static str,
    pub timings: Py<Timings>,
    /// With `logprobs`: each sampled token's log-probability (a final end-of-generation
    /// token has none).
    pub logprobs: Option<Vec<f32>>,
    /// With `logprobs=N`: each step's N most likely `(id, logprob)`, best first.
    pub top_logprobs: Option<Vec<Vec<(u32, f32)>>>,
    /// In a chat with tools: the calls the reply made, in OpenAI's shape (`{"id", "type":
    /// "function", "function": {"name", "arguments"}}`, arguments a JSON string), ready to
    /// go back into the history as an assistant message's `tool_calls`.
    pub tool_calls: Py<PyList>,
}

#[pymethods]
impl Completion {
    fn __str__(&self) -> &str {
        &self.text
    }
    fn __repr__(&self, py: Python<'_>) -> String {
        let n = self.tool_calls.bind(py).len();
        format!(
            "Completion(text={:?}, finish_reason={:?}, n_tokens={}{})",
            self.text,
            self.finish_reason,
            self.ids.len(),
            if n > 0 { format!(", n_tool_calls={n}") } else { String::new() }
        )
    }
}

/// Log-probabilities collected over a generation, when asked for.
#[derive(Default)]
pub struct Logprobs {
    pub logprob: Vec<f32>,
    pub top: Vec<Vec<(u32, f32)>>,
}

impl Logprobs {
    pub fn push(&mut self, ev: &kiln::Event) {
        if let (Some(lp), false) = (ev.logprob, ev.flush) {
            self.logprob.push(lp);
            self.top.push(ev.top_logprobs.to_vec());
        }
    }
}

/// What a worker hands back when generation ends.
pub struct Outcome {
    pub prompt_ids: Vec<u32>,
    pub summary: kiln::Summary,
    pub logprobs: Option<Logprobs>,
}

impl Outcome {
    pub fn into_completion(self, py: Python<'_>) -> PyResult<Completion> {
        let s = self.summary;
        let (logprobs, top_logprobs) = match self.logprobs {
            Some(l) => (Some(l.logprob), Some(l.top)),
            None => (None, None),
        };
        let calls =
            s.tool_calls.iter().map(|c| from_json(py, &c.to_openai())).collect::<PyResult<Vec<_>>>()?;
        Ok(Completion {
            tool_calls: PyList::new(py, calls)?.unbind(),
            text: s.text,
            ids: s.ids,
            prompt_ids: self.prompt_ids,
            finish_reason: s.finish_reason.as_str(),
            timings: Py::new(py, Timings::from(&s.timings))?,
            logprobs,
            top_logprobs,
        })
    }
}
