//! `kiln::KilnError` → a Python exception of the matching `kiln.KilnError` subclass.
//!
//! The classes are defined in Python (`kiln/_errors.py`) because some also derive from a
//! builtin (`InvalidArgumentError` is a `ValueError`, `KilnIOError` an `OSError`), which a
//! class made from Rust cannot. They are looked up once and kept.

use kiln::KilnError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The exception classes, in the order of [`class_index`].
const CLASSES: [&str; 9] = [
    "KilnError",
    "InvalidArgumentError",
    "ModelError",
    "TokenizerError",
    "TemplateError",
    "GrammarError",
    "HubError",
    "BackendError",
    "KilnIOError",
];

static TYPES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn class_index(e: &KilnError) -> usize {
    match e {
        KilnError::Invalid(_) => 1,
        KilnError::Gguf { .. }
        | KilnError::Unsupported { .. }
        | KilnError::Metadata(_)
        | KilnError::Tensor { .. } => 2,
        KilnError::Tokenizer(_) => 3,
        KilnError::Template(_) => 4,
        KilnError::Grammar(_) => 5,
        KilnError::Hub(_) => 6,
        KilnError::Backend(_) => 7,
        KilnError::Io { .. } => 8,
        _ => 0,
    }
}

/// The Python exception for `e`, carrying kiln's message.
pub fn to_py(e: KilnError) -> PyErr {
    Python::attach(|py| {
        let types = TYPES.get_or_try_init(py, || -> PyResult<Vec<Py<PyType>>> {
            let m = py.import("kiln._errors")?;
            CLASSES.iter().map(|name| Ok(m.getattr(*name)?.cast_into::<PyType>()?.unbind())).collect()
        });
        match types {
            Ok(t) => PyErr::from_type(t[class_index(&e)].bind(py).clone(), e.to_string()),
            Err(_) => PyRuntimeError::new_err(e.to_string()),
        }
    })
}

/// `Result<T, KilnError>` → `PyResult<T>`.
pub trait OrRaise<T> {
    fn or_raise(self) -> PyResult<T>;
}

impl<T> OrRaise<T> for kiln::Result<T> {
    fn or_raise(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// `kiln.InvalidArgumentError` (a `ValueError`) with `msg`.
pub fn invalid(msg: impl Into<String>) -> PyErr {
    to_py(KilnError::invalid(msg))
}
