//! Python bindings of shmlink: the extension module `shmlink._shmlink`, re-exported by
//! the pure-Python package `shmlink` (python/shmlink). See `docs/python.md`.
//!
//! Every shmlink object is kept in non-blocking mode; blocking Python calls are built
//! in `wait.rs` from non-blocking tries and `poll()` on the object's fd, with the GIL
//! released, so that Ctrl-C interrupts them.
#![deny(missing_docs)]

use pyo3::prelude::*;

mod buffer;
mod conn;
mod errors;
mod handle;
mod lend;
mod options;
mod pubsub;
mod wait;

/// The compiled part of the `shmlink` package.
#[pymodule]
fn _shmlink(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // SHMLINK_LOG=info prints the library's events on stderr (docs/python.md, "Logging").
    shmlink::trace::log_to_stderr(None);
    m.add_function(wrap_pyfunction!(conn::connect, m)?)?;
    m.add_function(wrap_pyfunction!(conn::listen, m)?)?;
    m.add_class::<conn::PyConnection>()?;
    m.add_class::<conn::PyListener>()?;
    m.add_class::<lend::PySendBuffer>()?;
    m.add_class::<pubsub::PyPublisher>()?;
    m.add_class::<pubsub::PySubscriber>()?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
