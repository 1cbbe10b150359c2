//! Python objects ↔ JSON values (chat messages, tool definitions, response formats), and
//! chat messages as the templates take them.

use kiln::chat::tools::{ChatTools, Tool, ToolChoice};
use kiln::chat::Message;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Value};

use crate::errors::invalid;

/// `obj` as JSON: dicts with string keys, lists and tuples, strings, numbers, booleans, None.
/// `what` names the argument in errors.
pub fn to_json(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    if obj.is_none() {
        Ok(Value::Null)
    } else if obj.is_instance_of::<PyBool>() {
        Ok(Value::Bool(obj.extract()?))
    } else if obj.is_instance_of::<PyInt>() {
        match obj.extract::<i64>() {
            Ok(i) => Ok(Value::from(i)),
            Err(_) => Ok(Value::from(obj.extract::<u64>()?)),
        }
    } else if obj.is_instance_of::<PyFloat>() {
        let f: f64 = obj.extract()?;
        serde_json::Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| invalid(format!("{what}: {f} is not a JSON number")))
    } else if let Ok(s) = obj.cast::<PyString>() {
        Ok(Value::String(s.to_cow()?.into_owned()))
    } else if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in d.iter() {
            let key: String = k
                .extract()
                .map_err(|_| PyTypeError::new_err(format!("{what}: dictionary keys must be strings")))?;
            let value = to_json(&v, &format!("{what}[{key:?}]"))?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    } else if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let mut out = Vec::new();
        for (i, v) in obj.try_iter()?.enumerate() {
            out.push(to_json(&v?, &format!("{what}[{i}]"))?);
        }
        Ok(Value::Array(out))
    } else {
        let ty = obj.get_type().name()?;
        Err(PyTypeError::new_err(format!("{what}: a {ty} cannot be converted to JSON")))
    }
}

/// `v` as a Python object (dicts, lists, str, int, float, bool, None).
pub fn from_json<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any(),
            (_, Some(u)) => u.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let items = a.iter().map(|x| from_json(py, x)).collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, from_json(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// Chat messages from a list of dicts, as OpenAI's API takes them: `role` a string,
/// `content` a string, None, or a list of `{"type": "text", "text": ...}` parts (joined);
/// other keys (`tool_calls`, `tool_call_id`, `name`...) go to the template as they are.
pub fn messages(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Message>> {
    let Value::Array(items) = to_json(obj, "messages")? else {
        return Err(PyTypeError::new_err("messages must be a list of dicts"));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.into_iter().enumerate() {
        let Value::Object(mut m) = m else {
            return Err(PyTypeError::new_err(format!("messages[{i}] must be a dict")));
        };
        if !m.get("role").is_some_and(Value::is_string) {
            return Err(invalid(format!("messages[{i}] needs a 'role' string")));
        }
        let content = match m.remove("content") {
            None | Some(Value::Null) => Value::Null,
            Some(Value::String(s)) => Value::String(s),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return Err(invalid(format!(
                                "messages[{i}]['content'][{j}]: only text parts are supported"
                            )))
                        }
                    }
                }
                Value::String(text)
            }
            Some(_) => {
                return Err(PyTypeError::new_err(format!(
                    "messages[{i}]['content'] must be a string, a list of text parts or None"
                )))
            }
        };
        m.insert("content".into(), content);
        let msg: Message =
            serde_json::from_value(Value::Object(m)).map_err(|e| invalid(format!("messages[{i}]: {e}")))?;
        out.push(msg);
    }
    if out.is_empty() {
        return Err(invalid("messages must not be empty"));
    }
    Ok(out)
}

/// `tools`, `tool_choice` and `parallel_tool_calls` as OpenAI's API takes them: a list of
/// `{"type": "function", "function": {"name", "description", "parameters"}}`; `"auto"`,
/// `"none"`, `"required"` or `{"type": "function", "function": {"name": ...}}`; a bool.
pub fn chat_tools(
    tools: Option<&Bound<'_, PyAny>>,
    choice: Option<&Bound<'_, PyAny>>,
    parallel: Option<bool>,
) -> PyResult<ChatTools> {
    let list = match tools.map(|t| to_json(t, "tools")).transpose()? {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, t)| Tool::from_openai(t).map_err(|e| invalid(format!("tools[{i}]: {e}"))))
            .collect::<PyResult<_>>()?,
        Some(_) => return Err(PyTypeError::new_err("tools must be a list of dicts")),
    };
    let choice = match choice.map(|c| to_json(c, "tool_choice")).transpose()? {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(v) => ToolChoice::from_openai(&v).map_err(|e| invalid(e.to_string()))?,
    };
    ChatTools::new(list)
        .and_then(|t| t.with_choice(choice))
        .map(|t| t.with_parallel(parallel.unwrap_or(true)))
        .map_err(|e| invalid(e.to_string()))
}
