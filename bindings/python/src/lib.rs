//! `kiln._kiln`: the native module of kiln's Python package (`import kiln`). The Python
//! side (`python/kiln/`) re-exports it and defines the exception classes; the `.pyi` stub
//! beside it is the typed API.
//!
//! Everything runs in this process on the kiln engine: no subprocess, no HTTP. Compute
//! runs on worker threads with the GIL released (see `worker`), so Python threads can
//! generate on one engine at once and Ctrl-C interrupts promptly.

mod convert;
mod engine;
mod errors;
mod generate;
mod results;
mod sampling;
mod serve;
mod session;
mod worker;

use pyo3::prelude::*;

#[pymodule]
fn _kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::Engine>()?;
    m.add_class::<session::Session>()?;
    m.add_class::<results::Completion>()?;
    m.add_class::<results::Piece>()?;
    m.add_class::<results::Timings>()?;
    m.add_class::<generate::Stream>()?;
    m.add_class::<serve::Server>()?;
    m.add_function(wrap_pyfunction!(serve::serve, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("SAMPLING_KEYWORDS", sampling::KEYWORDS.to_vec())?;
    Ok(())
}
