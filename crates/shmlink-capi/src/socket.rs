//! `shmlink_socket`: a connection or a listener behind one opaque handle, as XCM has it
//! (one type, so `shmlink_fd`, `shmlink_set_blocking`, `shmlink_local_addr` and
//! `shmlink_close` serve both).
//!
//! The zero-copy calls lend what the Rust API lends through guards that borrow the
//! connection (`SendBuf`, `RecvBuf`). C has no borrows, so the socket keeps the guard
//! between the two calls (`shmlink_reserve` … `shmlink_commit`, `shmlink_recv_ref` …
//! `shmlink_release`), and the connection lives behind a raw pointer of its own
//! allocation that nothing else touches while a guard holds it.

use std::ffi::{c_char, c_int, c_void, CString};
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::{null, null_mut, NonNull};

use shmlink::{Connection, Counters, ErrorKind, Listener, Options, RecvBuf, SendBuf};

use crate::args::{bytes, bytes_mut, obj, obj_ref, ssize, text};
use crate::error::{call, too_small, Fail, Res};
use crate::options::{conn_opts, ShmlinkOptions};

/// A connection or a listener (opaque). Made by `shmlink_connect`, `shmlink_listen` or
/// `shmlink_accept`; freed by `shmlink_close`.
///
/// One thread at a time may call into a socket (any thread; a socket may move between
/// threads), except where a function says otherwise. Different sockets are independent.
pub struct ShmlinkSocket {
    kind: Kind,
}

enum Kind {
    Conn(ConnSock),
    Listener(ListenSock),
}

struct ListenSock {
    listener: Listener,
    fd: RawFd,
    addr: CString,
    nonblocking: bool,
}

/// Message and byte counters of a connection (`shmlink_get_counters`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShmlinkCounters {
    /// Messages sent.
    pub msgs_out: u64,
    /// Payload bytes sent.
    pub bytes_out: u64,
    /// Messages received.
    pub msgs_in: u64,
    /// Payload bytes received.
    pub bytes_in: u64,
}

impl From<Counters> for ShmlinkCounters {
    fn from(c: Counters) -> Self {
        ShmlinkCounters {
            msgs_out: c.msgs_out,
            bytes_out: c.bytes_out,
            msgs_in: c.msgs_in,
            bytes_in: c.bytes_in,
        }
    }
}

/// What a zero-copy call lends until its second call.
enum Guard {
    None,
    /// `shmlink_reserve` … `shmlink_commit` / `shmlink_cancel`.
    Send(SendBuf<'static>),
    /// `shmlink_recv_ref` … `shmlink_release`.
    Recv(RecvBuf<'static>),
}

struct ConnSock {
    /// The connection, from `Box::leak`; freed in `Drop` after the guard (or taken by
    /// `into_conn`, leaving `None`). While `guard` is not `Guard::None` the guard holds
    /// the only reference to it.
    conn: Option<NonNull<Connection>>,
    guard: Guard,
    /// The counters when the guard was taken (the connection is out of reach meanwhile).
    frozen: Counters,
    /// A message a too-small `shmlink_recv` took off the connection to keep it, with
    /// whether `shmlink_recv_ref` lends it now.
    stash: Option<Vec<u8>>,
    stash_lent: bool,
    fd: RawFd,
    local: CString,
    peer: CString,
    transport: CString,
    max_msg: usize,
    nonblocking: bool,
}

/// `EINVAL` for a call that sends or receives while `shmlink_recv_ref` lends a message.
fn lent() -> Fail {
    Fail::inval("a received message is lent on this connection: shmlink_release it first")
}

fn cstring(s: String) -> CString {
    CString::new(s).unwrap_or_default()
}

impl ConnSock {
    fn new(conn: Connection) -> ConnSock {
        ConnSock {
            fd: conn.as_raw_fd(),
            local: cstring(conn.local_addr()),
            peer: cstring(conn.peer_addr()),
            transport: cstring(conn.transport().to_string()),
            max_msg: conn.max_msg_size(),
            frozen: Counters::default(),
            conn: Some(NonNull::from(Box::leak(Box::new(conn)))),
            guard: Guard::None,
            stash: None,
            stash_lent: false,
            nonblocking: false,
        }
    }

    /// The connection, when no guard holds it.
    fn conn(&mut self) -> Res<&mut Connection> {
        match self.guard {
            Guard::None => {
                let mut conn = self.conn.expect("connection taken only by into_conn");
                // SAFETY: `conn` is our own live allocation and no guard borrows it; the
                // returned borrow is tied to `&mut self`, so no guard can be made while
                // it lives.
                Ok(unsafe { conn.as_mut() })
            }
            Guard::Send(_) => Err(Fail::inval(
                "a reservation is open on this connection: shmlink_commit or shmlink_cancel it first",
            )),
            Guard::Recv(_) => Err(lent()),
        }
    }

    /// The connection for a call that sends or receives: refused while anything is lent,
    /// a kept message from `shmlink_recv_ref` included.
    fn io(&mut self) -> Res<&mut Connection> {
        if self.stash_lent {
            return Err(lent());
        }
        self.conn()
    }

    /// The connection with a lifetime of its own, for a guard stored in `self.guard`.
    ///
    /// # Safety
    /// The caller stores the guard made from it in `self.guard` (or drops it before
    /// touching the connection again); `Drop` drops the guard before the connection.
    unsafe fn conn_for_guard(&mut self) -> Res<&'static mut Connection> {
        let conn: *mut Connection = self.io()?;
        // SAFETY: our own live allocation, and no guard holds it (checked by `io()`);
        // the caller keeps the guard it makes in `self.guard`, which every other access
        // checks first, and `Drop` drops it before the connection.
        Ok(unsafe { &mut *conn })
    }

    fn counters(&mut self) -> Counters {
        match self.guard {
            Guard::None => self.conn().map(|c| c.counters()).unwrap_or_default(),
            _ => self.frozen,
        }
    }
}

impl ConnSock {
    /// The reservation `shmlink_reserve` left open, taken out of the socket; `EINVAL` with
    /// `none` when there is none (whatever else is open stays).
    fn take_reservation(&mut self, none: &str) -> Res<SendBuf<'static>> {
        match std::mem::replace(&mut self.guard, Guard::None) {
            Guard::Send(buf) => Ok(buf),
            other => {
                self.guard = other;
                Err(Fail::inval(none))
            }
        }
    }

    /// The connection itself, after dropping whatever the socket lent.
    fn into_conn(mut self) -> Box<Connection> {
        self.guard = Guard::None; // the guard borrows the connection: it goes first
        let conn = self.conn.take().expect("connection taken once");
        // SAFETY: our own allocation from Box::leak, no guard left, taken out of `self`
        // so `Drop` does not free it again.
        unsafe { Box::from_raw(conn.as_ptr()) }
    }
}

impl Drop for ConnSock {
    fn drop(&mut self) {
        self.guard = Guard::None; // the guard borrows the connection: it goes first
        if let Some(conn) = self.conn.take() {
            // SAFETY: our own allocation from Box::leak, no guard left, freed once.
            drop(unsafe { Box::from_raw(conn.as_ptr()) });
        }
    }
}

impl ShmlinkSocket {
    fn conn(&mut self) -> Res<&mut ConnSock> {
        match &mut self.kind {
            Kind::Conn(c) => Ok(c),
            Kind::Listener(_) => Err(Fail::inval(
                "this socket is a listener: the call needs a connection",
            )),
        }
    }

    fn listener(&mut self) -> Res<&mut ListenSock> {
        match &mut self.kind {
            Kind::Listener(l) => Ok(l),
            Kind::Conn(_) => Err(Fail::inval(
                "this socket is a connection: the call needs a listener",
            )),
        }
    }
}

fn boxed(kind: Kind) -> *mut ShmlinkSocket {
    Box::into_raw(Box::new(ShmlinkSocket { kind }))
}

/// The socket `make` opens at the address and with the options a C caller gave, boxed;
/// NULL with errno on an error.
///
/// # Safety
/// `addr` is NULL or a NUL-terminated string; `opts` NULL or a live `shmlink_options`.
unsafe fn open_socket(
    addr: *const c_char,
    opts: *const ShmlinkOptions,
    make: impl FnOnce(&str, &Options) -> Res<Kind>,
) -> *mut ShmlinkSocket {
    call(null_mut(), || {
        // SAFETY: forwarded to the caller.
        let addr = unsafe { text(addr, "address") }?;
        // SAFETY: forwarded to the caller.
        let opts = unsafe { conn_opts(opts) };
        Ok(boxed(make(addr, &opts)?))
    })
}

/// Connects to `addr` (`shm:NAME`, `ux:NAME`, `tcp:HOST:PORT`, `tls:HOST:PORT`,
/// `auto:HOST:PORT`), waiting up to the connect timeout for the listener and the
/// handshake. `opts` NULL means the defaults. The connection is blocking; see
/// `shmlink_set_blocking`.
///
/// Returns the connection, or NULL with errno: `EINVAL` (bad address or options),
/// `ECONNREFUSED` (nobody listens, or the listener refused us), `ENOENT` (the host name
/// does not resolve), `EACCES` (credentials or certificates refused), `ETIMEDOUT`,
/// `EPROTO`; `shmlink_last_error()` says more.
///
/// Thread safety: any thread; `opts` may be shared by concurrent calls.
///
/// # Safety
/// `addr` is NULL or a NUL-terminated string; `opts` NULL or a live `shmlink_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_connect(
    addr: *const c_char,
    opts: *const ShmlinkOptions,
) -> *mut ShmlinkSocket {
    // SAFETY: forwarded to the caller.
    unsafe {
        open_socket(addr, opts, |addr, opts| {
            let conn = Connection::connect(addr, opts)?;
            Ok(Kind::Conn(ConnSock::new(conn)))
        })
    }
}

/// Binds a listener at `addr` (as for `shmlink_connect`; `tcp:HOST:0` picks a free port,
/// which `shmlink_local_addr` tells). `opts` NULL means the defaults.
///
/// Returns the listener, or NULL with errno: `EINVAL`, `EADDRINUSE` (another listener
/// serves the address), `EACCES`, `ENOENT` (the directory to bind in does not exist, or
/// the host name does not resolve).
///
/// Thread safety: any thread.
///
/// # Safety
/// `addr` is NULL or a NUL-terminated string; `opts` NULL or a live `shmlink_options`.
#[no_mangle]
pub unsafe extern "C" fn shmlink_listen(
    addr: *const c_char,
    opts: *const ShmlinkOptions,
) -> *mut ShmlinkSocket {
    // SAFETY: forwarded to the caller.
    unsafe {
        open_socket(addr, opts, |addr, opts| {
            let listener = Listener::bind(addr, opts)?;
            Ok(Kind::Listener(ListenSock {
                fd: listener.as_raw_fd(),
                addr: cstring(listener.local_addr()),
                listener,
                nonblocking: false,
            }))
        })
    }
}

/// Waits for the next client on `listener` and completes its handshake; returns the new
/// connection (blocking, whatever the listener's mode). Clients that fail the handshake
/// are refused and skipped. A non-blocking listener returns NULL with `EAGAIN` when no
/// client is ready; its fd is readable when one may be.
///
/// Thread safety: one thread at a time per listener.
///
/// # Safety
/// `listener` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_accept(listener: *mut ShmlinkSocket) -> *mut ShmlinkSocket {
    call(null_mut(), || {
        // SAFETY: forwarded to the caller.
        let l = unsafe { obj(listener, "listener") }?.listener()?;
        let conn = l.listener.accept()?;
        Ok(boxed(Kind::Conn(ConnSock::new(conn))))
    })
}

/// Sends the `len` bytes at `buf` as one message (`len` 0 is a valid, empty message).
/// Blocks while the peer's receive window is full, unless the connection is
/// non-blocking (`EAGAIN`; the fd is readable when trying again is worth it).
///
/// Returns 0, or -1 with errno: `EAGAIN`, `EMSGSIZE` (larger than
/// `shmlink_max_msg_size`), `ECONNRESET` (the peer died or broke the connection),
/// `EPIPE` (the peer closed), `EPROTO`, `EINVAL` (NULL arguments, a listener, or a
/// zero-copy call open on the connection).
///
/// Thread safety: one thread at a time per connection.
///
/// # Safety
/// `sock` is NULL or a live socket; `buf` NULL or `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn shmlink_send(
    sock: *mut ShmlinkSocket,
    buf: *const c_void,
    len: usize,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { obj(sock, "socket") }?.conn()?;
        // SAFETY: forwarded to the caller.
        let msg = unsafe { bytes(buf, len) }?;
        c.io()?.send(msg)?;
        Ok(0)
    })
}

/// Receives one message into `buf` (capacity `cap`) and returns its length (0 for an
/// empty message: the end of the stream is never 0, it is `EPIPE`). Blocks until a
/// message arrives unless the connection is non-blocking (`EAGAIN`).
///
/// A message longer than `cap` is not lost: the call fails with `EMSGSIZE`, the
/// connection keeps the message, `shmlink_pending_size` tells its length, and the next
/// `shmlink_recv` with a large enough buffer (or `shmlink_recv_ref`) returns it. (It is
/// then held in this process, so the fd does not announce it: receive it right away.)
///
/// Returns the length, or -1 with errno: `EAGAIN`, `EMSGSIZE`, `EPIPE` (the peer closed
/// and every message it sent was received), `ECONNRESET`, `EPROTO`, `EINVAL` (NULL `buf`
/// with a non-zero `cap`, a listener, a lent message not released).
///
/// Thread safety: one thread at a time per connection.
///
/// # Safety
/// `sock` is NULL or a live socket; `buf` NULL or `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn shmlink_recv(
    sock: *mut ShmlinkSocket,
    buf: *mut c_void,
    cap: usize,
) -> libc::ssize_t {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { obj(sock, "socket") }?.conn()?;
        // SAFETY: forwarded to the caller.
        let dst = unsafe { bytes_mut(buf, cap) }?;
        c.conn()?; // no guard open
        if let Some(msg) = &c.stash {
            if c.stash_lent {
                return Err(lent());
            }
            return if msg.len() <= cap {
                let n = msg.len();
                dst[..n].copy_from_slice(msg);
                c.stash = None;
                Ok(ssize(n))
            } else {
                Err(too_small(msg.len(), cap))
            };
        }
        match c.conn()?.recv(dst) {
            Ok(n) => Ok(ssize(n)),
            Err(e) if e.kind() == ErrorKind::MessageTooLarge => {
                // Still queued: take it off the ring into the stash, so that the
                // connection goes on (sending too) while the caller finds a buffer.
                let msg = c.conn()?.recv_vec()?;
                let n = msg.len();
                c.stash = Some(msg);
                Err(too_small(n, cap))
            }
            Err(e) => Err(e.into()),
        }
    })
}

/// The length of the message a too-small `shmlink_recv` kept (`EMSGSIZE`), or 0 when
/// none is kept (an empty message always fits). -1 with `EINVAL` for NULL or a listener.
///
/// Thread safety: one thread at a time per connection.
///
/// # Safety
/// `sock` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_pending_size(sock: *mut ShmlinkSocket) -> libc::ssize_t {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { obj(sock, "socket") }?.conn()?;
        Ok(ssize(c.stash.as_ref().map_or(0, Vec::len)))
    })
}

/// Zero-copy send, first half: room for a message of `len` bytes to fill in place (on
/// `shm:` straight in the ring when it fits in half of it). Send it with
/// `shmlink_commit`, or drop it with `shmlink_cancel`. Until then the connection accepts
/// no other call that sends or receives (`EINVAL`). Waits for room like `shmlink_send`.
///
/// Returns the pointer to `len` writable bytes (not NULL, also for `len` 0), or NULL with
/// errno as for `shmlink_send`.
///
/// Thread safety: one thread at a time per connection; the pointer may be written from
/// any thread until the commit.
///
/// # Safety
/// `sock` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_reserve(sock: *mut ShmlinkSocket, len: usize) -> *mut c_void {
    call(null_mut(), || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { obj(sock, "socket") }?.conn()?;
        let frozen = c.counters();
        // SAFETY: the guard goes into `c.guard` below, or is never made.
        let conn = unsafe { c.conn_for_guard() }?;
        let mut buf = conn.reserve(len)?;
        let ptr = buf.as_mut_ptr();
        c.frozen = frozen;
        c.guard = Guard::Send(buf);
        Ok(ptr.cast())
    })
}

/// Zero-copy send, second half: sends the message `shmlink_reserve` lent. The pointer is
/// invalid afterwards. 0, or -1 with errno (`EINVAL`: no reservation open; the others as
/// for `shmlink_send`).
///
/// Thread safety: one thread at a time per connection.
///
/// # Safety
/// `sock` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_commit(sock: *mut ShmlinkSocket) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { obj(sock, "socket") }?.conn()?;
        let buf = c.take_reservation("shmlink_commit without shmlink_reserve")?;
        buf.commit()?;
        Ok(0)
    })
}

/// Drops the reservation `shmlink_reserve` made: nothing is sent. 0, or -1 with
/// `EINVAL` when none is open.
///
/// Thread safety: one thread at a time per connection.
///
/// # Safety
/// `sock` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_cancel(sock: *mut ShmlinkSocket) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { obj(sock, "socket") }?.conn()?;
        drop(c.take_reservation("shmlink_cancel without shmlink_reserve")?);
        Ok(0)
    })
}

/// Zero-copy receive, first half: waits for the next message (like `shmlink_recv`) and
/// lends it in place: `*data` points to its `*len` bytes, valid until
/// `shmlink_release`, which consumes it. Until then the connection accepts no other call
/// that sends or receives (`EINVAL`).
///
/// On `shm:` the bytes are in the peer's shared memory: an honest peer never writes them
/// while they are lent, but a hostile one could change them at any time. Read each byte
/// you validate once (copy a header out, check the copy, use the copy); if the peer is
/// not trusted, copy the message out (or use `shmlink_recv`).
///
/// Returns 0, or -1 with errno as for `shmlink_recv` (never `EMSGSIZE`).
///
/// Thread safety: one thread at a time per connection; the bytes may be read from any
/// thread until the release.
///
/// # Safety
/// `sock` is NULL or a live socket; `data` and `len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmlink_recv_ref(
    sock: *mut ShmlinkSocket,
    data: *mut *const c_void,
    len: *mut usize,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { obj(sock, "socket") }?.conn()?;
        if data.is_null() || len.is_null() {
            return Err(Fail::inval("shmlink_recv_ref: data or len is NULL"));
        }
        c.conn()?; // no guard open
        let (ptr, n) = if let Some(msg) = &c.stash {
            if c.stash_lent {
                return Err(lent());
            }
            c.stash_lent = true;
            (msg.as_ptr(), msg.len())
        } else {
            let before = c.counters();
            // SAFETY: the guard goes into `c.guard` below, or is never made.
            let conn = unsafe { c.conn_for_guard() }?;
            let buf = conn.recv_ref()?;
            let bytes = buf.bytes();
            let (ptr, n) = {
                // SAFETY: the slice is made only to read its address and length; Rust
                // never reads through it. C reads the bytes under the contract above.
                let s = unsafe { bytes.as_slice() };
                (s.as_ptr(), s.len())
            };
            c.frozen = Counters {
                msgs_in: before.msgs_in + 1,
                bytes_in: before.bytes_in + n as u64,
                ..before
            };
            c.guard = Guard::Recv(buf);
            (ptr, n)
        };
        // SAFETY: both non-NULL (checked above) and writable as the caller promises.
        unsafe {
            *data = ptr.cast();
            *len = n;
        }
        Ok(0)
    })
}

/// Zero-copy receive, second half: consumes the message `shmlink_recv_ref` lent (on
/// `shm:` its ring space is free again). The pointer is invalid afterwards. 0, or -1 with
/// `EINVAL` when no message is lent.
///
/// Thread safety: one thread at a time per connection.
///
/// # Safety
/// `sock` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_release(sock: *mut ShmlinkSocket) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { obj(sock, "socket") }?.conn()?;
        match std::mem::replace(&mut c.guard, Guard::None) {
            Guard::Recv(buf) => {
                drop(buf);
                Ok(0)
            }
            other => {
                c.guard = other;
                if c.stash_lent {
                    c.stash_lent = false;
                    c.stash = None;
                    return Ok(0);
                }
                Err(Fail::inval("shmlink_release without shmlink_recv_ref"))
            }
        }
    })
}

/// The file descriptor to watch with poll/epoll/select for `POLLIN`: a connection's is
/// readable when a message may be received, a blocked send may go on, or the peer is
/// gone; a listener's when a client may be accepted. Level-triggered hints: after a
/// wake-up call until `EAGAIN`. The fd belongs to the socket: do not read, write or
/// close it. -1 with `EINVAL` for NULL.
///
/// Thread safety: one thread at a time per socket, like every call on it. The value
/// stays the same for the socket's life: an event loop may read it once and keep it.
///
/// # Safety
/// `sock` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_fd(sock: *const ShmlinkSocket) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        Ok(match &unsafe { obj_ref(sock, "socket") }?.kind {
            Kind::Conn(c) => c.fd,
            Kind::Listener(l) => l.fd,
        })
    })
}

/// Switches blocking mode (1, the default) or non-blocking mode (0), in which calls
/// that would wait fail with `EAGAIN` instead. 0, or -1 with `EINVAL`.
///
/// Thread safety: one thread at a time per socket.
///
/// # Safety
/// `sock` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_set_blocking(sock: *mut ShmlinkSocket, blocking: bool) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        match &mut unsafe { obj(sock, "socket") }?.kind {
            Kind::Conn(c) => {
                c.conn()?.set_nonblocking(!blocking);
                c.nonblocking = !blocking;
            }
            Kind::Listener(l) => {
                l.listener.set_nonblocking(!blocking);
                l.nonblocking = !blocking;
            }
        }
        Ok(0)
    })
}

/// 1 if the socket is blocking, 0 if not, -1 with `EINVAL` for NULL.
///
/// Thread safety: one thread at a time per socket.
///
/// # Safety
/// `sock` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_is_blocking(sock: *const ShmlinkSocket) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let nonblocking = match &unsafe { obj_ref(sock, "socket") }?.kind {
            Kind::Conn(c) => c.nonblocking,
            Kind::Listener(l) => l.nonblocking,
        };
        Ok(c_int::from(!nonblocking))
    })
}

/// Closes the socket and frees it; `sock` is invalid afterwards, whatever the result
/// (NULL: nothing happens, 0). A connection closes gracefully: the peer receives every
/// message sent before, then the end of the stream (`EPIPE`). Messages a non-blocking
/// send accepted but could not yet hand over are delivered first, waiting while the
/// peer takes them (at most 30 s without progress: then `ETIMEDOUT` and the peer sees
/// `ECONNRESET`). An open reservation is dropped, a lent message released. A listener
/// stops listening (its socket file is removed).
///
/// Returns 0, or -1 with errno (the socket is freed all the same).
///
/// Thread safety: no other thread may use the socket during or after the call.
///
/// # Safety
/// `sock` is NULL or a live socket, not used again afterwards.
#[no_mangle]
pub unsafe extern "C" fn shmlink_close(sock: *mut ShmlinkSocket) -> c_int {
    if sock.is_null() {
        return 0;
    }
    call(-1, || {
        // SAFETY: made by Box::into_raw in this module, freed once (the caller's promise).
        let sock = unsafe { Box::from_raw(sock) };
        match sock.kind {
            Kind::Conn(c) => c.into_conn().close()?,
            Kind::Listener(l) => drop(l),
        }
        Ok(0)
    })
}

/// The socket's own address (a listener's with the port chosen for `tcp:HOST:0`), as a
/// string owned by the socket: valid until `shmlink_close`. NULL with `EINVAL` for NULL.
///
/// Thread safety: one thread at a time per socket, like every call on it. The value
/// stays the same for the socket's life: an event loop may read it once and keep it.
///
/// # Safety
/// `sock` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_local_addr(sock: *const ShmlinkSocket) -> *const c_char {
    call(null(), || {
        // SAFETY: forwarded to the caller.
        Ok(match &unsafe { obj_ref(sock, "socket") }?.kind {
            Kind::Conn(c) => c.local.as_ptr(),
            Kind::Listener(l) => l.addr.as_ptr(),
        })
    })
}

/// `get` of the connection `sock` is, in `call`'s frame (`failed` on an error); a
/// listener is `EINVAL` with `why`.
///
/// # Safety
/// `sock` is NULL or a live socket.
unsafe fn conn_value<T>(
    sock: *const ShmlinkSocket,
    failed: T,
    why: &'static str,
    get: impl FnOnce(&ConnSock) -> T,
) -> T {
    call(failed, || {
        // SAFETY: forwarded to the caller.
        match &unsafe { obj_ref(sock, "socket") }?.kind {
            Kind::Conn(c) => Ok(get(c)),
            Kind::Listener(_) => Err(Fail::inval(why)),
        }
    })
}

/// A connection's peer address, owned by the socket (valid until `shmlink_close`).
/// NULL with `EINVAL` for NULL or a listener.
///
/// Thread safety: one thread at a time per socket, like every call on it. The value
/// stays the same for the socket's life: an event loop may read it once and keep it.
///
/// # Safety
/// `sock` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_remote_addr(sock: *const ShmlinkSocket) -> *const c_char {
    // SAFETY: forwarded to the caller.
    unsafe {
        conn_value(sock, null(), "a listener has no remote address", |c| {
            c.peer.as_ptr()
        })
    }
}

/// What a connection's messages travel over: `"shm"`, `"ux"`, `"tcp"` or `"tls"` (an
/// `auto:` connection names the one it settled on). Owned by the socket. NULL with
/// `EINVAL` for NULL or a listener.
///
/// Thread safety: one thread at a time per socket, like every call on it. The value
/// stays the same for the socket's life: an event loop may read it once and keep it.
///
/// # Safety
/// `sock` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_transport(sock: *const ShmlinkSocket) -> *const c_char {
    // SAFETY: forwarded to the caller.
    unsafe {
        conn_value(
            sock,
            null(),
            "a listener has no transport of its own",
            |c| c.transport.as_ptr(),
        )
    }
}

/// The largest message `shmlink_send` accepts on this connection (both sides' limits
/// applied), or -1 with `EINVAL`.
///
/// Thread safety: one thread at a time per socket, like every call on it. The value
/// stays the same for the socket's life: an event loop may read it once and keep it.
///
/// # Safety
/// `sock` is NULL or a live socket.
#[no_mangle]
pub unsafe extern "C" fn shmlink_max_msg_size(sock: *const ShmlinkSocket) -> libc::ssize_t {
    // SAFETY: forwarded to the caller.
    unsafe {
        conn_value(sock, -1, "a listener sends no messages", |c| {
            ssize(c.max_msg)
        })
    }
}

/// Copies a connection's message and byte counters into `*out` (the same counters
/// `shmlink ls` shows for connections a listener accepted). 0, or -1 with `EINVAL`.
///
/// Thread safety: one thread at a time per connection.
///
/// # Safety
/// `sock` is NULL or a live socket; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn shmlink_get_counters(
    sock: *mut ShmlinkSocket,
    out: *mut ShmlinkCounters,
) -> c_int {
    call(-1, || {
        // SAFETY: forwarded to the caller.
        let c = unsafe { obj(sock, "socket") }?.conn()?;
        // SAFETY: forwarded to the caller.
        let out = unsafe { obj(out, "counters") }?;
        *out = c.counters().into();
        Ok(0)
    })
}
