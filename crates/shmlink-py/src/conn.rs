//! `shmlink.Connection`, `shmlink.Listener`, `shmlink.connect()` and `shmlink.listen()`.

use std::os::fd::AsRawFd;
use std::ptr::NonNull;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use shmlink::{Connection, ErrorKind, Listener};

use crate::buffer::Msg;
use crate::errors::{to_py, Op};
use crate::handle::Handle;
use crate::lend::{Lent, Mem, PySendBuffer, Slot};
use crate::options;
use crate::options::Spin;
use crate::wait::Mode;

/// Pushes out, without waiting, what a non-blocking send left (`WouldBlock` while some
/// is left): a reservation of zero bytes flushes first, then is dropped uncommitted.
fn flush(c: &mut Connection) -> shmlink::Result<()> {
    c.reserve(0).map(drop)
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
    h: Handle<Connection>,
    /// The reservation `reserve()` lent, until `commit()` or `cancel()`. Locked after
    /// the connection when both are.
    lent: Slot,
}

impl PyConnection {
    /// After a send was accepted: in blocking mode (or with a timeout) waits until all of
    /// it is handed to the transport, as a blocking send in the library does.
    fn finish_send(&self, py: Python<'_>) -> PyResult<()> {
        if self.h.mode() == Mode::NonBlocking {
            return Ok(());
        }
        self.flush(py)
    }

    pub(crate) fn new(mut conn: Connection, spin: Spin) -> PyConnection {
        conn.set_nonblocking(true);
        PyConnection {
            h: Handle::new(conn, spin, "connection"),
            lent: Slot::new(),
        }
    }

    /// Runs `f`, a call that sends, on the connection if it is open and no reservation
    /// is: that call would overwrite the room lent (and the message order would change).
    fn with_sending<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> shmlink::Result<T>,
    ) -> shmlink::Result<T> {
        self.h.with(|c| {
            self.lent.check("connection")?;
            f(c)
        })
    }

    /// Sends `msg`, waiting per the mode.
    fn send_msg(&self, py: Python<'_>, msg: &Msg<'_>) -> PyResult<()> {
        let attempt = |b: &[u8]| self.with_sending(|c| c.send(b));
        let first = attempt(msg.with_gil(py));
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
        let r = self.h.finish(py, first, "send", || attempt(bytes))?;
        r.map_err(|e| to_py(py, e, Op::Send))?;
        self.finish_send(py)
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
        self.send_msg(py, &Msg::get(data)?)
    }

    /// Zero-copy sending, first half: room for a message of ``n`` bytes, lent as a
    /// writable :class:`SendBuffer` (on ``shm:`` between processes, for a message that
    /// fits in half the ring, the ring itself; otherwise a buffer sent as a copy by
    /// :meth:`commit`). Waits for room (GIL released) like :meth:`send`, raises like it.
    /// Until :meth:`commit` or :meth:`cancel`, calls that send raise ``ValueError``;
    /// receiving goes on.
    fn reserve(slf: &Bound<'_, Self>, n: usize) -> PyResult<PySendBuffer> {
        let py = slf.py();
        let this = slf.get();
        let attempt = || {
            this.with_sending(|c| {
                let mem = if n <= c.max_msg_size() && c.reserves_in_place(n) {
                    c.reserve_begin(n)?;
                    let mut room = c.lend_reserved(n);
                    let ptr = NonNull::new(room.as_mut_ptr()).unwrap_or(NonNull::dangling());
                    // Kept open: `commit`/`cancel` take it back with `lend_reserved`.
                    std::mem::forget(room);
                    Mem::Ring(ptr)
                } else if n > c.max_msg_size() {
                    return Err(shmlink::Error::new(
                        ErrorKind::MessageTooLarge,
                        format!(
                            "reserve({n}) exceeds the maximum message size of {} bytes \
                             (option max_msg_size)",
                            c.max_msg_size()
                        ),
                    ));
                } else {
                    Mem::Own(vec![0; n])
                };
                let lent = Lent::new(mem, n);
                this.lent.open(lent.clone());
                Ok(lent)
            })
        };
        let first = attempt();
        let r = this.h.finish(py, first, "reserve", attempt)?;
        let lent = r.map_err(|e| to_py(py, e, Op::Send))?;
        Ok(PySendBuffer::new(lent, slf.clone().into_any().unbind()))
    }

    /// Zero-copy sending, second half: sends the first ``nbytes`` of what
    /// :meth:`reserve` lent (all of it by default). The buffer and its slices raise
    /// ``ValueError`` afterwards. Raises ``BufferError`` while an export of the buffer
    /// (a ``memoryview``, a numpy array) is alive, ``ValueError`` when ``nbytes`` exceeds
    /// the reservation (both leave it open), and as :meth:`send` (a copied message stays
    /// reserved when it could not be sent: commit again or cancel).
    #[pyo3(signature = (nbytes=None))]
    fn commit(&self, py: Python<'_>, nbytes: Option<usize>) -> PyResult<()> {
        let (lent, mem, n) = self.lent.take(nbytes, "commit")?;
        match mem {
            Mem::Ring(_) => {
                let r = self.h.with(|c| {
                    let len = lent.len();
                    c.lend_reserved(len).commit_len(n)
                });
                self.lent.clear();
                r.map_err(|e| to_py(py, e, Op::Send))?;
                self.finish_send(py)
            }
            Mem::Own(mut v) => {
                self.lent.clear();
                v.truncate(n);
                let msg = Msg::Owned(v);
                let r = self.send_msg(py, &msg);
                if r.is_err() {
                    // Not sent: the reservation is open again, its bytes as they were.
                    if let Msg::Owned(mut v) = msg {
                        v.resize(lent.len(), 0);
                        lent.restore(v);
                    }
                    self.lent.reopen(lent);
                }
                r
            }
            Mem::Gone => Ok(()),
        }
    }

    /// Drops what :meth:`reserve` lent: nothing is sent. Raises ``BufferError`` while an
    /// export of the buffer is alive.
    fn cancel(&self) -> PyResult<()> {
        let (_, mem, _) = self.lent.take(None, "cancel")?;
        if let Mem::Ring(_) = mem {
            // Dropping the guard aborts the reservation.
            let _ = self.h.with(|c| {
                drop(c.lend_reserved(0));
                Ok(())
            });
        }
        self.lent.clear();
        Ok(())
    }

    /// Hands to the transport what a non-blocking :meth:`send` accepted but could not
    /// pass on yet (the rest of a message larger than the ring, or than the socket
    /// buffer). Blocking sends do this themselves; in non-blocking mode (asyncio) call it
    /// until it stops raising ``BlockingIOError``, or the rest goes out only with the
    /// next call (at the latest :meth:`close`).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let first = self.with_sending(flush);
        let r = self
            .h
            .finish(py, first, "flush", || self.with_sending(flush))?;
        r.map_err(|e| to_py(py, e, Op::Send))
    }

    /// Receives one message as ``bytes``. Waits (GIL released) per :meth:`settimeout`.
    /// Raises ``EOFError`` once the peer closed and everything it sent was received,
    /// ``ConnectionResetError`` when the peer died, ``BlockingIOError`` in non-blocking
    /// mode when nothing is waiting, ``TimeoutError`` after the timeout.
    fn recv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut made = None;
        let first = self.h.with(|c| {
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
        let r = self
            .h
            .finish(py, first, "recv", || self.h.with(|c| c.recv_vec()))?;
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
        self.h.recv_into(py, buffer, |c, dst| c.recv(dst))
    }

    /// The fd to watch for readability (``selectors``, ``loop.add_reader``): readable
    /// when a non-blocking call is worth retrying or the peer is gone. -1 once closed.
    fn fileno(&self) -> i32 {
        self.h.fd()
    }

    /// ``False``: calls raise ``BlockingIOError`` instead of waiting (``settimeout(0)``);
    /// ``True``: they wait without limit (``settimeout(None)``).
    fn setblocking(&self, flag: bool) {
        self.h.set_blocking(flag);
    }

    /// Whether calls wait (blocking mode or a timeout).
    fn getblocking(&self) -> bool {
        self.h.mode() != Mode::NonBlocking
    }

    /// ``None``: calls wait without limit; ``0``: non-blocking; ``t > 0``: calls wait at
    /// most ``t`` seconds and then raise ``TimeoutError``.
    #[pyo3(signature = (value, /))]
    fn settimeout(&self, value: Option<f64>) -> PyResult<()> {
        self.h.set_timeout(value)
    }

    /// The timeout in seconds, ``None`` in blocking mode, ``0.0`` in non-blocking mode.
    fn gettimeout(&self) -> Option<f64> {
        self.h.mode().timeout()
    }

    /// Closes gracefully: the peer receives every message sent before, then
    /// ``EOFError``. Waits (GIL released) for a partly sent large message to be taken,
    /// at most 30 s while the peer takes nothing. Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.lent.is_open() {
            self.cancel()?;
        }
        match self.h.take() {
            Some(c) => py
                .allow_threads(|| c.close())
                .map_err(|e| to_py(py, e, Op::Other)),
            None => Ok(()),
        }
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.h.lock().is_none()
    }

    /// This side's address.
    #[getter]
    fn local_addr(&self, py: Python<'_>) -> PyResult<String> {
        self.h.get(py, |c| c.local_addr())
    }

    /// The peer's address.
    #[getter]
    fn peer_addr(&self, py: Python<'_>) -> PyResult<String> {
        self.h.get(py, |c| c.peer_addr())
    }

    /// What the messages travel over: ``"shm"``, ``"ux"``, ``"tcp"`` or ``"tls"``.
    #[getter]
    fn transport(&self, py: Python<'_>) -> PyResult<String> {
        self.h.get(py, |c| c.transport().to_string())
    }

    /// Largest message :meth:`send` accepts.
    #[getter]
    fn max_msg_size(&self, py: Python<'_>) -> PyResult<usize> {
        self.h.get(py, |c| c.max_msg_size())
    }

    /// Messages and bytes sent and received: a dict with ``msgs_out``, ``bytes_out``,
    /// ``msgs_in``, ``bytes_in``.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.h.get(py, |c| c.counters())?;
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
        crate::errors::until_eof(py, self.recv(py))
    }

    fn __repr__(&self) -> String {
        match self.h.lock().as_ref() {
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
    h: Handle<Listener>,
}

#[pymethods]
impl PyListener {
    /// Waits (GIL released, per :meth:`settimeout`) for the next client and returns its
    /// :class:`Connection`, in blocking mode. Clients that fail the handshake are
    /// refused and skipped.
    fn accept(&self, py: Python<'_>) -> PyResult<PyConnection> {
        let first = self.h.with(|l| l.accept());
        let r = self
            .h
            .finish(py, first, "accept", || self.h.with(|l| l.accept()))?;
        match r {
            Ok(c) => Ok(PyConnection::new(c, self.h.spin)),
            Err(e) => Err(to_py(py, e, Op::Other)),
        }
    }

    /// The fd to watch: readable when :meth:`accept` is worth calling. -1 once closed.
    fn fileno(&self) -> i32 {
        self.h.fd()
    }

    /// As :meth:`Connection.setblocking`.
    fn setblocking(&self, flag: bool) {
        self.h.set_blocking(flag);
    }

    /// Whether :meth:`accept` waits.
    fn getblocking(&self) -> bool {
        self.h.mode() != Mode::NonBlocking
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

    /// Stops listening and removes the rendezvous socket. Accepted connections live on.
    fn close(&self) {
        drop(self.h.take());
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.h.lock().is_none()
    }

    /// The bound address (for ``tcp:HOST:0``, with the port chosen).
    #[getter]
    fn local_addr(&self, py: Python<'_>) -> PyResult<String> {
        self.h.get(py, |l| l.local_addr())
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
        match self.h.lock().as_ref() {
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
        h: Handle::new(listener, parsed.spin, "listener"),
    })
}
