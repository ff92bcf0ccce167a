//! `shmlink.Publisher` and `shmlink.Subscriber`.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use shmlink::{ErrorKind, Publisher, Subscriber};

use crate::buffer::{Msg, Target};
use crate::conn::lock;
use crate::errors::{closed, to_py, Op};
use crate::options;
use crate::options::Spin;
use crate::wait::{self, Mode};

/// The state both pub/sub classes share: the object, its fd, how calls wait.
struct Handle<T> {
    inner: Mutex<Option<T>>,
    fd: AtomicI32,
    mode: Mutex<Mode>,
    spin: Spin,
}

impl<T: AsRawFd> Handle<T> {
    fn new(inner: T, spin: Spin) -> Handle<T> {
        Handle {
            fd: AtomicI32::new(inner.as_raw_fd()),
            inner: Mutex::new(Some(inner)),
            mode: Mutex::new(Mode::Blocking),
            spin,
        }
    }

    fn with<R>(
        &self,
        what: &str,
        f: impl FnOnce(&mut T) -> shmlink::Result<R>,
    ) -> shmlink::Result<R> {
        match lock(&self.inner).as_mut() {
            Some(x) => f(x),
            None => Err(closed(what)),
        }
    }

    fn fd(&self) -> i32 {
        self.fd.load(Ordering::Relaxed)
    }

    fn mode(&self) -> Mode {
        *lock(&self.mode)
    }

    fn set_mode(&self, mode: Mode) {
        *lock(&self.mode) = mode;
    }

    fn take(&self) -> Option<T> {
        self.fd.store(-1, Ordering::Relaxed);
        lock(&self.inner).take()
    }
}

/// The publishing end of a topic bound at ``addr`` (``shm:NAME``; ``tcp:``, ``tls:``,
/// ``auto:`` also serve remote subscribers). Each message is written once, whatever the
/// number of subscribers. Options: ``slots``, ``capacity``, ``max_msg_size`` (default
/// 4080), ``policy`` (``"block"``, the default, or ``"overwrite"``), ``stall_timeout``,
/// ``history``, ``max_subscribers``, and the connection options (see ``docs/python.md``).
#[pyclass(module = "shmlink", name = "Publisher", frozen)]
pub(crate) struct PyPublisher {
    h: Handle<Publisher>,
}

#[pymethods]
impl PyPublisher {
    #[new]
    #[pyo3(signature = (addr, /, **options))]
    fn new(py: Python<'_>, addr: &str, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let (opts, spin) = options::pubsub(options)?;
        let mut p = py
            .allow_threads(|| Publisher::bind(addr, &opts))
            .map_err(|e| to_py(py, e, Op::Other))?;
        p.set_nonblocking(true);
        Ok(PyPublisher {
            h: Handle::new(p, spin),
        })
    }

    /// Publishes one message (a bytes-like object) to every subscriber. Under the
    /// ``block`` policy waits (GIL released, per :meth:`settimeout`) while the slowest
    /// subscriber holds the oldest slot; one that stalls for ``stall_timeout`` is
    /// detached. Raises ``BlockingIOError`` in non-blocking mode when it would wait.
    fn publish(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let msg = Msg::get(data)?;
        let first = self.h.with("publisher", |p| p.publish(msg.with_gil(py)));
        if !matches!(&first, Err(e) if e.kind() == ErrorKind::WouldBlock) {
            return first.map_err(|e| to_py(py, e, Op::Send));
        }
        let msg = msg.with_gil(py).to_vec();
        let r = wait::finish(
            py,
            first,
            self.h.fd(),
            self.h.mode(),
            self.h.spin,
            "publish",
            || self.h.with("publisher", |p| p.publish(&msg)),
        )?;
        r.map_err(|e| to_py(py, e, Op::Send))
    }

    /// Waits (GIL released) until at least ``n`` subscribers are subscribed; raises
    /// ``TimeoutError`` after ``timeout`` seconds.
    fn wait_for_subscribers(&self, py: Python<'_>, n: usize, timeout: f64) -> PyResult<()> {
        let timeout = options::seconds("timeout", timeout)?;
        let deadline = std::time::Instant::now() + timeout;
        // In slices, so that Ctrl-C is heard.
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let slice = left.min(std::time::Duration::from_millis(50));
            let r = py.allow_threads(|| {
                self.h
                    .with("publisher", |p| p.wait_for_subscribers(n, slice))
            });
            match r {
                Err(e) if e.kind() == ErrorKind::TimedOut && !left.is_zero() => {}
                r => return r.map_err(|e| to_py(py, e, Op::Other)),
            }
            py.check_signals()?;
        }
    }

    /// How many subscribers are subscribed now.
    #[getter]
    fn subscriber_count(&self, py: Python<'_>) -> PyResult<usize> {
        match lock(&self.h.inner).as_ref() {
            Some(p) => Ok(p.subscriber_count()),
            None => Err(to_py(py, closed("publisher"), Op::Other)),
        }
    }

    /// Largest message :meth:`publish` accepts.
    #[getter]
    fn max_msg_size(&self, py: Python<'_>) -> PyResult<usize> {
        match lock(&self.h.inner).as_ref() {
            Some(p) => Ok(p.max_msg_size()),
            None => Err(to_py(py, closed("publisher"), Op::Other)),
        }
    }

    /// The bound address.
    #[getter]
    fn local_addr(&self, py: Python<'_>) -> PyResult<String> {
        match lock(&self.h.inner).as_ref() {
            Some(p) => Ok(p.local_addr()),
            None => Err(to_py(py, closed("publisher"), Op::Other)),
        }
    }

    /// Readable when a :meth:`publish` that raised ``BlockingIOError`` is worth retrying.
    fn fileno(&self) -> i32 {
        self.h.fd()
    }

    /// As :meth:`Connection.setblocking`.
    fn setblocking(&self, flag: bool) {
        self.h.set_mode(if flag {
            Mode::Blocking
        } else {
            Mode::NonBlocking
        });
    }

    /// As :meth:`Connection.settimeout`.
    #[pyo3(signature = (value, /))]
    fn settimeout(&self, value: Option<f64>) -> PyResult<()> {
        self.h.set_mode(Mode::from_timeout(value)?);
        Ok(())
    }

    /// As :meth:`Connection.gettimeout`.
    fn gettimeout(&self) -> Option<f64> {
        self.h.mode().timeout()
    }

    /// Closes the topic: subscribers read what was published, then get ``EOFError``.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        match self.h.take() {
            Some(p) => py
                .allow_threads(|| p.close())
                .map_err(|e| to_py(py, e, Op::Other)),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

/// Subscribes to the topic a :class:`Publisher` bound at ``addr``. Options:
/// ``history`` (past messages to replay), ``max_msg_size`` (refuse topics with larger
/// messages), and the connection options. Iterating yields the messages until the
/// publisher closes the topic.
#[pyclass(module = "shmlink", name = "Subscriber", frozen)]
pub(crate) struct PySubscriber {
    h: Handle<Subscriber>,
}

#[pymethods]
impl PySubscriber {
    #[new]
    #[pyo3(signature = (addr, /, **options))]
    fn new(py: Python<'_>, addr: &str, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let (opts, spin) = options::pubsub(options)?;
        let mut s = py
            .allow_threads(|| Subscriber::connect(addr, &opts))
            .map_err(|e| to_py(py, e, Op::Other))?;
        s.set_nonblocking(true);
        Ok(PySubscriber {
            h: Handle::new(s, spin),
        })
    }

    /// The next message as ``bytes``. Waits (GIL released) per :meth:`settimeout`.
    /// Raises ``EOFError`` when the publisher closed the topic and everything was read,
    /// ``LaggedError`` (``overwrite`` policy; ``.missed`` says how many were lost, the
    /// next call goes on), ``DetachedError`` (``block`` policy, this subscriber stalled),
    /// ``ConnectionResetError`` when the publisher died.
    fn recv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let first = self.h.with("subscriber", |s| s.recv_vec());
        let r = wait::finish(
            py,
            first,
            self.h.fd(),
            self.h.mode(),
            self.h.spin,
            "recv",
            || self.h.with("subscriber", |s| s.recv_vec()),
        )?;
        match r {
            Ok(v) => Ok(PyBytes::new(py, &v)),
            Err(e) => Err(to_py(py, e, Op::Other)),
        }
    }

    /// Receives the next message into a writable buffer (``bytearray``, ``memoryview``,
    /// …) and returns its length, as :meth:`Connection.recv_into`: a message larger than
    /// the buffer stays queued and ``MessageTooLargeError`` says so. Waits and raises like
    /// :meth:`recv`.
    fn recv_into(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let target = Target::get(buffer)?;
        let first = target
            .in_place(py, |dst| self.h.with("subscriber", |s| s.recv(dst)))
            .unwrap_or_else(|| Err(shmlink::Error::new(ErrorKind::WouldBlock, "")));
        if !matches!(&first, Err(e) if e.kind() == ErrorKind::WouldBlock) {
            return first.map_err(|e| to_py(py, e, Op::Other));
        }
        // Into our own buffer first: the target is written only with the GIL held.
        let mut tmp = vec![0u8; target.len()];
        let tmp_first = self.h.with("subscriber", |s| s.recv(&mut tmp));
        let tmp_ref = &mut tmp;
        let r = wait::finish(
            py,
            tmp_first,
            self.h.fd(),
            self.h.mode(),
            self.h.spin,
            "recv_into",
            move || self.h.with("subscriber", |s| s.recv(tmp_ref)),
        )?;
        let n = r.map_err(|e| to_py(py, e, Op::Other))?;
        target.fill(&tmp[..n])?;
        Ok(n)
    }

    /// This subscriber's counts: a dict with ``received`` (messages received),
    /// ``missed`` (lost to overwriting under the ``overwrite`` policy, in total) and
    /// ``lag`` (published and not read yet; 0 over ``tcp:``/``tls:``, where it is not
    /// known).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = match lock(&self.h.inner).as_ref() {
            Some(s) => s.stats(),
            None => return Err(to_py(py, closed("subscriber"), Op::Other)),
        };
        let d = PyDict::new(py);
        d.set_item("received", st.received)?;
        d.set_item("missed", st.missed)?;
        d.set_item("lag", st.lag)?;
        Ok(d)
    }

    /// Readable when :meth:`recv` is worth retrying.
    fn fileno(&self) -> i32 {
        self.h.fd()
    }

    /// As :meth:`Connection.setblocking`.
    fn setblocking(&self, flag: bool) {
        self.h.set_mode(if flag {
            Mode::Blocking
        } else {
            Mode::NonBlocking
        });
    }

    /// As :meth:`Connection.settimeout`.
    #[pyo3(signature = (value, /))]
    fn settimeout(&self, value: Option<f64>) -> PyResult<()> {
        self.h.set_mode(Mode::from_timeout(value)?);
        Ok(())
    }

    /// As :meth:`Connection.gettimeout`.
    fn gettimeout(&self) -> Option<f64> {
        self.h.mode().timeout()
    }

    /// Unsubscribes.
    fn close(&self) {
        drop(self.h.take());
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// The next message; the iteration ends when the publisher closed the topic.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        match self.recv(py) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyEOFError>(py) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
