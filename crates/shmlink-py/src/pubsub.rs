//! `shmlink.Publisher` and `shmlink.Subscriber`.

use std::ptr::NonNull;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use shmlink::{ErrorKind, Publisher, Subscriber};

use crate::buffer::Msg;
use crate::errors::{to_py, Op};
use crate::handle::Handle;
use crate::lend::{Lent, Mem, PySendBuffer, Slot};
use crate::options;

/// The publishing end of a topic bound at ``addr`` (``shm:NAME``; ``tcp:``, ``tls:``,
/// ``auto:`` also serve remote subscribers). Each message is written once, whatever the
/// number of subscribers. Options: ``slots``, ``capacity``, ``max_msg_size`` (default
/// 4080), ``policy`` (``"block"``, the default, or ``"overwrite"``), ``stall_timeout``,
/// ``history``, ``max_subscribers``, and the connection options (see ``docs/python.md``).
#[pyclass(module = "shmlink", name = "Publisher", frozen)]
pub(crate) struct PyPublisher {
    h: Handle<Publisher>,
    /// The slot `reserve()` lent, until `commit()` or `cancel()`. Locked after the publisher
    /// when both are.
    lent: Slot,
}

impl PyPublisher {
    /// Runs `f`, a call that publishes, if no reservation is open: it would fill the slot
    /// lent.
    fn with_publishing<R>(
        &self,
        f: impl FnOnce(&mut Publisher) -> shmlink::Result<R>,
    ) -> shmlink::Result<R> {
        self.h.with(|p| {
            self.lent.check("publisher")?;
            f(p)
        })
    }
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
            h: Handle::new(p, spin, "publisher"),
            lent: Slot::new(),
        })
    }

    /// Publishes one message (a bytes-like object) to every subscriber. Under the
    /// ``block`` policy waits (GIL released, per :meth:`settimeout`) while the slowest
    /// subscriber holds the oldest slot; one that stalls for ``stall_timeout`` is
    /// detached. Raises ``BlockingIOError`` in non-blocking mode when it would wait.
    fn publish(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let msg = Msg::get(data)?;
        let first = self.with_publishing(|p| p.publish(msg.with_gil(py)));
        if !matches!(&first, Err(e) if e.kind() == ErrorKind::WouldBlock) {
            return first.map_err(|e| to_py(py, e, Op::Send));
        }
        let msg = msg.with_gil(py).to_vec();
        let r = self.h.finish(py, first, "publish", || {
            self.with_publishing(|p| p.publish(&msg))
        })?;
        r.map_err(|e| to_py(py, e, Op::Send))
    }

    /// Zero-copy publishing, first half: the next slot of the topic, lent as a writable
    /// :class:`SendBuffer` of ``n`` bytes (at most :attr:`max_msg_size`). Waits like
    /// :meth:`publish`. Until :meth:`commit` or :meth:`cancel`, :meth:`publish` and
    /// :meth:`reserve` raise ``ValueError``.
    fn reserve(slf: &Bound<'_, Self>, n: usize) -> PyResult<PySendBuffer> {
        let py = slf.py();
        let this = slf.get();
        let attempt = || {
            this.with_publishing(|p| {
                let mut loan = p.loan(n)?;
                let ptr = NonNull::new(loan.as_mut_ptr()).unwrap_or(NonNull::dangling());
                // Dropped unpublished: the slot stays stamped busy, and the next `loan`
                // (in `commit`) lends the same one without waiting.
                drop(loan);
                let lent = Lent::new(Mem::Ring(ptr), n);
                this.lent.open(lent.clone());
                Ok(lent)
            })
        };
        let first = attempt();
        let r = this.h.finish(py, first, "reserve", attempt)?;
        let lent = r.map_err(|e| to_py(py, e, Op::Send))?;
        Ok(PySendBuffer::new(lent, slf.clone().into_any().unbind()))
    }

    /// Zero-copy publishing, second half: publishes the first ``nbytes`` of the slot
    /// :meth:`reserve` lent (all of it by default). Refuses like
    /// :meth:`Connection.commit` (``BufferError`` while an export is alive, ``ValueError``
    /// above the reservation).
    #[pyo3(signature = (nbytes=None))]
    fn commit(&self, py: Python<'_>, nbytes: Option<usize>) -> PyResult<()> {
        let (lent, mem, n) = self.lent.take(nbytes, "commit")?;
        let r = self.h.with(|p| {
            let mut loan = p.loan(lent.len())?;
            if let Mem::Ring(ptr) = mem {
                if loan.as_mut_ptr() != ptr.as_ptr() && lent.len() > 0 {
                    return Err(shmlink::Error::new(
                        ErrorKind::Other,
                        "the publisher lent another slot than reserve() did: nothing published",
                    ));
                }
            }
            loan.publish_len(n)
        });
        self.lent.clear();
        r.map_err(|e| to_py(py, e, Op::Send))
    }

    /// Drops the slot :meth:`reserve` lent: nothing is published (the next message takes
    /// the slot). Raises ``BufferError`` while an export of the buffer is alive.
    fn cancel(&self) -> PyResult<()> {
        self.lent.take(None, "cancel")?;
        self.lent.clear();
        Ok(())
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
            let r = py.allow_threads(|| self.h.with(|p| p.wait_for_subscribers(n, slice)));
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
        self.h.get(py, |p| p.subscriber_count())
    }

    /// Largest message :meth:`publish` accepts.
    #[getter]
    fn max_msg_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.h.get(py, |p| p.max_msg_size())
    }

    /// The bound address.
    #[getter]
    fn local_addr(&self, py: Python<'_>) -> PyResult<String> {
        self.h.get(py, |p| p.local_addr())
    }

    /// Readable when a :meth:`publish` that raised ``BlockingIOError`` is worth retrying.
    fn fileno(&self) -> i32 {
        self.h.fd()
    }

    /// As :meth:`Connection.setblocking`.
    fn setblocking(&self, flag: bool) {
        self.h.set_blocking(flag);
    }

    /// As :meth:`Connection.settimeout`.
    #[pyo3(signature = (value, /))]
    fn settimeout(&self, value: Option<f64>) -> PyResult<()> {
        self.h.set_timeout(value)
    }

    /// As :meth:`Connection.gettimeout`.
    fn gettimeout(&self) -> Option<f64> {
        self.h.mode().timeout()
    }

    /// Closes the topic: subscribers read what was published, then get ``EOFError``.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.lent.is_open() {
            self.cancel()?;
        }
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
            h: Handle::new(s, spin, "subscriber"),
        })
    }

    /// The next message as ``bytes``. Waits (GIL released) per :meth:`settimeout`.
    /// Raises ``EOFError`` when the publisher closed the topic and everything was read,
    /// ``LaggedError`` (``overwrite`` policy; ``.missed`` says how many were lost, the
    /// next call goes on), ``DetachedError`` (``block`` policy, this subscriber stalled),
    /// ``ConnectionResetError`` when the publisher died.
    fn recv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let first = self.h.with(|s| s.recv_vec());
        let r = self
            .h
            .finish(py, first, "recv", || self.h.with(|s| s.recv_vec()))?;
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
        self.h.recv_into(py, buffer, |s, dst| s.recv(dst))
    }

    /// This subscriber's counts: a dict with ``received`` (messages received),
    /// ``missed`` (lost to overwriting under the ``overwrite`` policy, in total) and
    /// ``lag`` (published and not read yet; 0 over ``tcp:``/``tls:``, where it is not
    /// known).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.h.get(py, |s| s.stats())?;
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
        self.h.set_blocking(flag);
    }

    /// As :meth:`Connection.settimeout`.
    #[pyo3(signature = (value, /))]
    fn settimeout(&self, value: Option<f64>) -> PyResult<()> {
        self.h.set_timeout(value)
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
        crate::errors::until_eof(py, self.recv(py))
    }
}
