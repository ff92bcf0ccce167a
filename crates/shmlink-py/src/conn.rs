//! `shmlink.Connection`, `shmlink.Listener`, `shmlink.connect()` and `shmlink.listen()`.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use shmlink::{Connection, ErrorKind, Listener};

use crate::buffer::{Msg, Target};
use crate::errors::{closed, to_py, Op};
use crate::options;
use crate::options::Spin;
use crate::wait::{self, Mode};

/// Pushes out, without waiting, what a non-blocking send left (`WouldBlock` while some
/// is left): a reservation of zero bytes flushes first, then is dropped uncommitted.
fn flush(c: &mut Connection) -> shmlink::Result<()> {
    c.reserve(0).map(drop)
}

/// Locks, shrugging off poisoning: the guarded objects stay consistent (a panic cannot
/// happen between two of their calls' effects that matter here).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A message connection (any transport: ``shm:``, ``ux:``, ``tcp:``, ``tls:``, ``auto:``).
///
/// Made by :func:`shmlink.connect` and :meth:`Listener.accept`. Messages keep their
/// boundaries and order; zero-length messages are valid. Blocking by default
/// (see :meth:`settimeout`); the GIL is released while a call waits, and a waiting call
/// raises ``KeyboardInterrupt`` promptly on Ctrl-C. :meth:`fileno` is readable when a
/// call is worth retrying (for ``selectors`` and ``asyncio``). One thread may send while
/// another receives.
#[pyclass(module = "shmlink", name = "Connection", frozen)]
pub(crate) struct PyConnection {
    conn: Mutex<Option<Connection>>,
    fd: AtomicI32,
    mode: Mutex<Mode>,
    spin: Spin,
}

impl PyConnection {
    /// After a send was accepted: in blocking mode (or with a timeout) waits until all of
    /// it is handed to the transport, as a blocking send in the library does.
    fn finish_send(&self, py: Python<'_>) -> PyResult<()> {
        if self.mode() == Mode::NonBlocking {
            return Ok(());
        }
        self.flush(py)
    }

    pub(crate) fn new(mut conn: Connection, spin: Spin) -> PyConnection {
        conn.set_nonblocking(true);
        PyConnection {
            fd: AtomicI32::new(conn.as_raw_fd()),
            conn: Mutex::new(Some(conn)),
            mode: Mutex::new(Mode::Blocking),
            spin,
        }
    }

    /// Runs `f` on the connection, if it is still open.
    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> shmlink::Result<T>) -> shmlink::Result<T> {
        match lock(&self.conn).as_mut() {
            Some(c) => f(c),
            None => Err(closed("connection")),
        }
    }

    fn fd(&self) -> i32 {
        self.fd.load(Ordering::Relaxed)
    }

    fn mode(&self) -> Mode {
        *lock(&self.mode)
    }

    fn info<T>(&self, py: Python<'_>, f: impl FnOnce(&Connection) -> T) -> PyResult<T> {
        match lock(&self.conn).as_ref() {
            Some(c) => Ok(f(c)),
            None => Err(to_py(py, closed("connection"), Op::Other)),
        }
    }
}

#[pymethods]
impl PyConnection {
    /// Sends one message: ``bytes``, ``bytearray``, ``memoryview`` or any other
    /// bytes-like object. Waits (GIL released) while the peer's receive window is full,
    /// per :meth:`settimeout`, and returns once the whole message is handed to the
    /// transport. Raises ``BlockingIOError`` in non-blocking mode when it would wait,
    /// ``BrokenPipeError`` when the peer is gone, ``MessageTooLargeError`` above
    /// :attr:`max_msg_size`. In non-blocking mode a message larger than the ring may be
    /// accepted in part: :meth:`flush` (or the next call) pushes the rest, and
    /// :meth:`close` delivers what is left.
    fn send(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let msg = Msg::get(data)?;
        let first = self.with(|c| c.send(msg.with_gil(py)));
        if !matches!(&first, Err(e) if e.kind() == ErrorKind::WouldBlock) {
            first.map_err(|e| to_py(py, e, Op::Send))?;
            return self.finish_send(py);
        }
        // The GIL is released while waiting: only bytes nobody can change may be read.
        let copy;
        let bytes = match msg.without_gil() {
            Some(b) => b,
            None => {
                copy = msg.with_gil(py).to_vec();
                &copy
            }
        };
        let r = wait::finish(py, first, self.fd(), self.mode(), self.spin, "send", || {
            self.with(|c| c.send(bytes))
        })?;
        r.map_err(|e| to_py(py, e, Op::Send))?;
        self.finish_send(py)
    }

    /// Hands to the transport what a non-blocking :meth:`send` accepted but could not
    /// pass on yet (the rest of a message larger than the ring, or than the socket
    /// buffer). Blocking sends do this themselves; in non-blocking mode (asyncio) call it
    /// until it stops raising ``BlockingIOError``, or the rest goes out only with the
    /// next call (at the latest :meth:`close`).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let first = self.with(flush);
        let r = wait::finish(
            py,
            first,
            self.fd(),
            self.mode(),
            self.spin,
            "flush",
            || self.with(flush),
        )?;
        r.map_err(|e| to_py(py, e, Op::Send))
    }

    /// Receives one message as ``bytes``. Waits (GIL released) per :meth:`settimeout`.
    /// Raises ``EOFError`` once the peer closed and everything it sent was received,
    /// ``ConnectionResetError`` when the peer died, ``BlockingIOError`` in non-blocking
    /// mode when nothing is waiting, ``TimeoutError`` after the timeout.
    fn recv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut made = None;
        let first = self.with(|c| {
            let msg = c.recv_ref()?;
            made = Some(PyBytes::new_with(py, msg.len(), |dst| {
                msg.bytes().copy_to(dst);
                Ok(())
            }));
            Ok(())
        });
        if let Some(bytes) = made {
            return bytes;
        }
        let first = first.map(|()| Vec::new());
        let r = wait::finish(py, first, self.fd(), self.mode(), self.spin, "recv", || {
            self.with(|c| c.recv_vec())
        })?;
        match r {
            Ok(v) => Ok(PyBytes::new(py, &v)),
            Err(e) => Err(to_py(py, e, Op::Other)),
        }
    }

    /// Receives one message into a writable buffer (``bytearray``, ``memoryview``, …) and
    /// returns its length. A message larger than the buffer stays queued and
    /// ``MessageTooLargeError`` says so (receive it with a larger buffer or :meth:`recv`).
    /// Waits and raises like :meth:`recv`.
    fn recv_into(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let target = Target::get(buffer)?;
        let first = target
            .in_place(py, |dst| self.with(|c| c.recv(dst)))
            .unwrap_or_else(|| Err(shmlink::Error::new(ErrorKind::WouldBlock, "")));
        if !matches!(&first, Err(e) if e.kind() == ErrorKind::WouldBlock) {
            return first.map_err(|e| to_py(py, e, Op::Other));
        }
        // Into our own buffer first: the target is written only with the GIL held.
        let mut tmp = vec![0u8; target.len()];
        let tmp_first = self.with(|c| c.recv(&mut tmp));
        let tmp_ref = &mut tmp;
        let r = wait::finish(
            py,
            tmp_first,
            self.fd(),
            self.mode(),
            self.spin,
            "recv_into",
            move || self.with(|c| c.recv(tmp_ref)),
        )?;
        let n = r.map_err(|e| to_py(py, e, Op::Other))?;
        target.fill(&tmp[..n])?;
        Ok(n)
    }

    /// The fd to watch for readability (``selectors``, ``loop.add_reader``): readable
    /// when a non-blocking call is worth retrying or the peer is gone. -1 once closed.
    fn fileno(&self) -> i32 {
        self.fd()
    }

    /// ``False``: calls raise ``BlockingIOError`` instead of waiting (``settimeout(0)``);
    /// ``True``: they wait without limit (``settimeout(None)``).
    fn setblocking(&self, flag: bool) {
        *lock(&self.mode) = if flag {
            Mode::Blocking
        } else {
            Mode::NonBlocking
        };
    }

    /// Whether calls wait (blocking mode or a timeout).
    fn getblocking(&self) -> bool {
        self.mode() != Mode::NonBlocking
    }

    /// ``None``: calls wait without limit; ``0``: non-blocking; ``t > 0``: calls wait at
    /// most ``t`` seconds and then raise ``TimeoutError``.
    #[pyo3(signature = (value, /))]
    fn settimeout(&self, value: Option<f64>) -> PyResult<()> {
        *lock(&self.mode) = Mode::from_timeout(value)?;
        Ok(())
    }

    /// The timeout in seconds, ``None`` in blocking mode, ``0.0`` in non-blocking mode.
    fn gettimeout(&self) -> Option<f64> {
        self.mode().timeout()
    }

    /// Closes gracefully: the peer receives every message sent before, then
    /// ``EOFError``. Waits (GIL released) for a partly sent large message to be taken,
    /// at most 30 s while the peer takes nothing. Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let conn = lock(&self.conn).take();
        self.fd.store(-1, Ordering::Relaxed);
        match conn {
            Some(c) => py
                .allow_threads(|| c.close())
                .map_err(|e| to_py(py, e, Op::Other)),
            None => Ok(()),
        }
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.conn).is_none()
    }

    /// This side's address.
    #[getter]
    fn local_addr(&self, py: Python<'_>) -> PyResult<String> {
        self.info(py, |c| c.local_addr())
    }

    /// The peer's address.
    #[getter]
    fn peer_addr(&self, py: Python<'_>) -> PyResult<String> {
        self.info(py, |c| c.peer_addr())
    }

    /// What the messages travel over: ``"shm"``, ``"ux"``, ``"tcp"`` or ``"tls"``.
    #[getter]
    fn transport(&self, py: Python<'_>) -> PyResult<String> {
        self.info(py, |c| c.transport().to_string())
    }

    /// Largest message :meth:`send` accepts.
    #[getter]
    fn max_msg_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.info(py, |c| c.max_msg_size())
    }

    /// Messages and bytes sent and received: a dict with ``msgs_out``, ``bytes_out``,
    /// ``msgs_in``, ``bytes_in``.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.info(py, |c| c.counters())?;
        let d = PyDict::new(py);
        d.set_item("msgs_out", c.msgs_out)?;
        d.set_item("bytes_out", c.bytes_out)?;
        d.set_item("msgs_in", c.msgs_in)?;
        d.set_item("bytes_in", c.bytes_in)?;
        Ok(d)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// The next message; the iteration ends at the end of the stream.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        match self.recv(py) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyEOFError>(py) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn __repr__(&self) -> String {
        match lock(&self.conn).as_ref() {
            Some(c) => format!(
                "<shmlink.Connection {} -> {} fd={}>",
                c.local_addr(),
                c.peer_addr(),
                c.as_raw_fd()
            ),
            None => "<shmlink.Connection closed>".to_string(),
        }
    }
}

/// A server: binds an address and accepts connections. Made by :func:`shmlink.listen`.
///
/// Blocking by default (see :meth:`settimeout`); :meth:`fileno` is readable when a
/// client is waiting to be accepted.
#[pyclass(module = "shmlink", name = "Listener", frozen)]
pub(crate) struct PyListener {
    listener: Mutex<Option<Listener>>,
    fd: AtomicI32,
    mode: Mutex<Mode>,
    spin: Spin,
}

impl PyListener {
    fn with<T>(&self, f: impl FnOnce(&mut Listener) -> shmlink::Result<T>) -> shmlink::Result<T> {
        match lock(&self.listener).as_mut() {
            Some(l) => f(l),
            None => Err(closed("listener")),
        }
    }
}

#[pymethods]
impl PyListener {
    /// Waits (GIL released, per :meth:`settimeout`) for the next client and returns its
    /// :class:`Connection`, in blocking mode. Clients that fail the handshake are
    /// refused and skipped.
    fn accept(&self, py: Python<'_>) -> PyResult<PyConnection> {
        let first = self.with(|l| l.accept());
        let mode = *lock(&self.mode);
        let fd = self.fd.load(Ordering::Relaxed);
        let r = wait::finish(py, first, fd, mode, self.spin, "accept", || {
            self.with(|l| l.accept())
        })?;
        match r {
            Ok(c) => Ok(PyConnection::new(c, self.spin)),
            Err(e) => Err(to_py(py, e, Op::Other)),
        }
    }

    /// The fd to watch: readable when :meth:`accept` is worth calling. -1 once closed.
    fn fileno(&self) -> i32 {
        self.fd.load(Ordering::Relaxed)
    }

    /// As :meth:`Connection.setblocking`.
    fn setblocking(&self, flag: bool) {
        *lock(&self.mode) = if flag {
            Mode::Blocking
        } else {
            Mode::NonBlocking
        };
    }

    /// Whether :meth:`accept` waits.
    fn getblocking(&self) -> bool {
        *lock(&self.mode) != Mode::NonBlocking
    }

    /// As :meth:`Connection.settimeout`.
    #[pyo3(signature = (value, /))]
    fn settimeout(&self, value: Option<f64>) -> PyResult<()> {
        *lock(&self.mode) = Mode::from_timeout(value)?;
        Ok(())
    }

    /// As :meth:`Connection.gettimeout`.
    fn gettimeout(&self) -> Option<f64> {
        lock(&self.mode).timeout()
    }

    /// Stops listening and removes the rendezvous socket. Accepted connections live on.
    fn close(&self) {
        self.fd.store(-1, Ordering::Relaxed);
        drop(lock(&self.listener).take());
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn closed(&self) -> bool {
        lock(&self.listener).is_none()
    }

    /// The bound address (for ``tcp:HOST:0``, with the port chosen).
    #[getter]
    fn local_addr(&self, py: Python<'_>) -> PyResult<String> {
        match lock(&self.listener).as_ref() {
            Some(l) => Ok(l.local_addr()),
            None => Err(to_py(py, closed("listener"), Op::Other)),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        match lock(&self.listener).as_ref() {
            Some(l) => format!("<shmlink.Listener {} fd={}>", l.local_addr(), l.as_raw_fd()),
            None => "<shmlink.Listener closed>".to_string(),
        }
    }
}

/// Connects to ``addr`` (``shm:NAME``, ``ux:NAME``, ``tcp:HOST:PORT``, ``tls:HOST:PORT``,
/// ``auto:HOST:PORT``) and returns a blocking :class:`Connection`. Waits (GIL released)
/// at most ``connect_timeout`` seconds (default 5). Options: see ``docs/python.md``.
/// Raises ``ConnectionRefusedError`` when nobody listens, ``ValueError`` for a bad
/// address or option, ``TypeError`` for an unknown option.
#[pyfunction]
#[pyo3(signature = (addr, /, **options))]
pub(crate) fn connect(
    py: Python<'_>,
    addr: &str,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyConnection> {
    let parsed = options::connection(options)?;
    let opts = parsed.options;
    let conn = py
        .allow_threads(|| Connection::connect(addr, &opts))
        .map_err(|e| to_py(py, e, Op::Other))?;
    Ok(PyConnection::new(conn, parsed.spin))
}

/// Binds ``addr`` and returns a blocking :class:`Listener`. Raises ``OSError``
/// (``EADDRINUSE``) when another listener serves it, ``ValueError`` for a bad address
/// or option.
#[pyfunction]
#[pyo3(signature = (addr, /, **options))]
pub(crate) fn listen(
    py: Python<'_>,
    addr: &str,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyListener> {
    let parsed = options::connection(options)?;
    let opts = parsed.options;
    let mut listener = py
        .allow_threads(|| Listener::bind(addr, &opts))
        .map_err(|e| to_py(py, e, Op::Other))?;
    listener.set_nonblocking(true);
    Ok(PyListener {
        fd: AtomicI32::new(listener.as_raw_fd()),
        listener: Mutex::new(Some(listener)),
        mode: Mutex::new(Mode::Blocking),
        spin: parsed.spin,
    })
}
