//! Async shmlink on tokio (cargo feature `tokio`): [`Listener`], [`Connection`] (and its
//! owned halves [`SendHalf`]/[`RecvHalf`]), [`Publisher`], [`Subscriber`], streams of
//! incoming connections ([`Incoming`]) and of subscriber messages, and [`ByteStream`], an
//! [`AsyncRead`](::tokio::io::AsyncRead) + [`AsyncWrite`](::tokio::io::AsyncWrite)
//! adapter that hyper, tonic and tokio-util codecs run over.
//!
//! # How it waits
//!
//! Every type wraps its blocking counterpart in non-blocking mode and registers that
//! object's one fd with tokio's reactor ([`AsyncFd`](::tokio::io::unix::AsyncFd),
//! read interest): no thread of its own, no thread per connection. A call tries the
//! operation; when it would block, the library has already announced the wait
//! (`docs/design.md` §4.2: it drained the doorbells and set its sleep count, so the next
//! progress of the peer, or its death, makes the fd readable), and the call awaits
//! readiness. tokio's readiness is edge-triggered, so the order matters: the call
//! clears tokio's readiness only with a readiness guard taken *before* the attempt that
//! would block (tokio then keeps any event that arrived in between) and always tries again
//! after clearing. No wake-up is lost that way; `tests/tokio_conformance.rs` and
//! `tests/tokio_cancel.rs` check it under load with small rings.
//!
//! **Spin budget.** Before a receive awaits readiness it busy-polls the ring for the
//! connection's [`WaitPolicy::spin`](crate::WaitPolicy) (`shm:` only: the other
//! transports cannot look without a system call), reading shared memory only — it neither
//! announces nor makes the peer ring. A message that arrives within the budget is taken
//! without a wake-up through the reactor (microseconds saved per round trip); the cost is
//! that the task holds its worker thread for up to the budget. Set the spin to zero
//! ([`WaitPolicy::BLOCKING`](crate::WaitPolicy::BLOCKING)) to never hold a worker; an
//! idle connection costs no CPU either way (once the budget is spent the task sleeps in
//! the reactor). Sends never spin: a full ring is flow control, not latency.
//!
//! **Connect** runs the blocking [`crate::Connection::connect`] (the handshake, bounded by
//! the connect timeout) on tokio's blocking pool ([`spawn_blocking`](::tokio::task::spawn_blocking)):
//! it needs the runtime's blocking pool, which every tokio runtime has. **Accept** is fully
//! non-blocking: the listener runs each client's handshake as the fd reports progress.
//!
//! # Cancel safety
//!
//! As in tokio's docs, a method is *cancel safe* when dropping its future before it
//! completes (in a `select!` branch that lost, at a timeout) has no effect: every
//! method here performs its operation in a single poll, so it either completed (and the
//! future returned) or did nothing.
//!
//! | method | cancel safe | a dropped future… |
//! |---|---|---|
//! | [`Listener::accept`], [`Incoming`] | yes | accepted nothing; the client stays queued |
//! | [`Connection::connect`] | no | the handshake finishes on the blocking pool and the connection is dropped (the server sees it end) |
//! | [`Connection::recv`], [`recv_vec`](Connection::recv_vec), [`recv_ref`](Connection::recv_ref), [`RecvHalf::recv`], [`RecvHalf::recv_vec`] | yes | received nothing; the message stays queued |
//! | [`Connection::send`], [`SendHalf::send`] | yes | sent nothing (a message is taken whole or not at all) |
//! | [`Connection::reserve`] | yes | reserved nothing |
//! | [`SendBuf::commit`] | yes | sent nothing (a staged message is dropped with it) |
//! | [`Connection::flush`], [`SendHalf::flush`] | yes | what was accepted stays queued; flush again |
//! | [`Connection::close`] | no | the connection is dropped: queued messages may be lost (as on a drop) |
//! | [`Subscriber::recv`], [`recv_vec`](Subscriber::recv_vec), [`recv_ref`](Subscriber::recv_ref), its `Stream` | yes | took nothing from the ring |
//! | [`Publisher::publish`], [`Publisher::loan`] | yes | published (loaned) nothing |
//! | [`ByteStream`] reads/writes | as tokio's `AsyncRead`/`AsyncWrite` over a socket | |
//!
//! ```
//! # std::env::set_var("SHMLINK_DIR", std::env::temp_dir().join(format!("shmlink-doc-{}", std::process::id())));
//! # ::tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! use shmlink::tokio::{Connection, Listener};
//! use shmlink::{ErrorKind, Options};
//!
//! let mut listener = Listener::bind("shm:doc-async", &Options::default())?;
//! let server = ::tokio::spawn(async move {
//!     let mut conn = listener.accept().await?;
//!     loop {
//!         match conn.recv_vec().await {
//!             Ok(msg) => conn.send(&msg).await?,
//!             Err(e) if e.kind() == ErrorKind::EndOfStream => return Ok::<(), shmlink::Error>(()),
//!             Err(e) => return Err(e),
//!         }
//!     }
//! });
//! let mut conn = Connection::connect("shm:doc-async", &Options::default()).await?;
//! conn.send(b"hello").await?;
//! assert_eq!(conn.recv_vec().await?, b"hello");
//! conn.close().await?;
//! server.await.unwrap()?;
//! # Ok::<(), shmlink::Error>(())
//! # }).unwrap();
//! ```
//!
//! # Rust version
//!
//! The feature builds with the workspace's Rust (1.80) and needs tokio ≥ 1.38 with the
//! `net`, `rt`, `sync` and `time` features (turned on by this feature).

mod conn;
mod pubsub;
mod split;
mod stream;

pub use conn::{Connection, Incoming, Listener, SendBuf};
pub use pubsub::{Publisher, Subscriber};
pub use split::{RecvHalf, SendHalf};
pub use stream::ByteStream;

use std::os::fd::{AsRawFd, RawFd};

use crate::error::{Error, ErrorKind};

/// The fd tokio's reactor watches: the number of an fd that the wrapped object owns.
/// The object outlives the registration: every owner declares its `AsyncFd` field
/// before the object, so the registration is dropped first.
#[derive(Debug)]
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

fn register(fd: RawFd) -> crate::Result<::tokio::io::unix::AsyncFd<Fd>> {
    // `with_interest` is deprecated in the newest tokio in favour of an `unsafe`
    // `register_with_interest` (an `AsyncFd` cannot tell whether its fd outlives it);
    // the old name works with every tokio this feature accepts. The fd does outlive the
    // registration: see `Fd`.
    #[allow(deprecated)]
    ::tokio::io::unix::AsyncFd::with_interest(Fd(fd), ::tokio::io::Interest::READABLE)
        .map_err(|e| Error::io("register with the tokio reactor (is a runtime running?)", e))
}

#[inline]
fn would_block<T>(r: &crate::Result<T>) -> bool {
    matches!(r, Err(e) if e.kind() == ErrorKind::WouldBlock)
}

fn reactor_error(e: std::io::Error) -> Error {
    Error::io("wait for the tokio reactor", e)
}

/// Runs the non-blocking `op` until it does not fail with `WouldBlock`, awaiting `fd`'s
/// readiness in between: the attempt announced the wait (docs/design.md §4.2), so the
/// peer's next progress, or its death, makes the fd readable.
fn poll_until_done<T>(
    fd: &::tokio::io::unix::AsyncFd<Fd>,
    cx: &mut std::task::Context<'_>,
    mut op: impl FnMut() -> crate::Result<T>,
) -> std::task::Poll<crate::Result<T>> {
    use std::task::Poll;
    loop {
        let r = op();
        if !would_block(&r) {
            return Poll::Ready(r);
        }
        match fd.poll_read_ready(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(reactor_error(e))),
            // Cleared with a guard taken after the attempt: an event that came in
            // between is seen by the next attempt, one after it sets readiness again.
            Poll::Ready(Ok(mut guard)) => guard.clear_ready(),
        }
    }
}
