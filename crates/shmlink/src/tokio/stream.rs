//! [`ByteStream`]: a connection as `AsyncRead + AsyncWrite`.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use ::tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Connection;
use crate::error::ErrorKind;

// Here, not in conn.rs, so that the connection does not name the stream (no import
// circle: tests/layering.rs).
impl Connection {
    /// Wraps the connection in a byte stream ([`AsyncRead`] + [`AsyncWrite`]); see
    /// [`ByteStream`].
    pub fn into_byte_stream(self) -> ByteStream {
        ByteStream::new(self)
    }
}

/// Largest message a write sends: one HTTP/2 frame of the default size fits, and a
/// message this size stays well under half of the smallest ring worth using for bulk.
const CHUNK: usize = 64 * 1024;

/// A [`Connection`] as a byte stream: [`AsyncRead`] + [`AsyncWrite`], for anything that
/// runs over a socket (hyper, tonic, tokio-util codecs).
///
/// Each `write` sends one message of up to 64 KiB (or the connection's maximum); a read
/// returns bytes from the next message, keeping what does not fit for the next read.
///
/// **Waiting.** A read that finds nothing on `shm:` keeps its task awake for the
/// connection's spin budget ([`set_spin`](Self::set_spin); by default the
/// [`WaitPolicy::spin`](crate::WaitPolicy) of the options it was made with): it returns
/// `Pending` and wakes itself at once, so the runtime runs every other ready task (an
/// RPC handler, hyper's connection task) and polls the read again, which then looks at
/// the ring without a system call. A reply that comes within the budget is read without
/// a wake-up through the reactor; after the budget the read waits on the reactor like a
/// socket's, and an idle connection costs no CPU. The spin never holds the runtime's
/// thread (a busy loop inside `poll_read` would keep the tasks that make the reply from
/// running).
/// `shutdown` sends a zero-length message, which the peer's `ByteStream` reads as the
/// end of the stream (`read` returns 0) while both can still read what the other sends:
/// half-close as on TCP. So both ends of a connection must be `ByteStream`s; the peer's
/// graceful close also reads as the end of the stream, and its death as
/// [`io::ErrorKind::ConnectionReset`].
///
/// ```
/// # std::env::set_var("SHMLINK_DIR", std::env::temp_dir().join(format!("shmlink-doc-{}", std::process::id())));
/// # ::tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// use ::tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use shmlink::tokio::{Connection, Listener};
/// use shmlink::Options;
///
/// let mut listener = Listener::bind("shm:doc-bytes", &Options::default())?;
/// let server = ::tokio::spawn(async move {
///     let mut s = listener.accept().await?.into_byte_stream();
///     let mut all = Vec::new();
///     s.read_to_end(&mut all).await?; // until the client's shutdown
///     s.write_all(&all).await?;
///     s.shutdown().await?;
///     Ok::<(), std::io::Error>(())
/// });
/// let mut s = Connection::connect("shm:doc-bytes", &Options::default()).await?.into_byte_stream();
/// s.write_all(b"hello, ").await?;
/// s.write_all(b"world").await?;
/// s.shutdown().await?;
/// let mut back = String::new();
/// s.read_to_string(&mut back).await?;
/// assert_eq!(back, "hello, world");
/// server.await.unwrap()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
///
/// `Send`, not `Sync`; `Unpin`.
#[derive(Debug)]
pub struct ByteStream {
    conn: Connection,
    /// What a read took from a message but could not return yet.
    rest: Vec<u8>,
    at: usize,
    /// The peer shut down its writing (or closed): reads return 0.
    eof: bool,
    /// We shut down our writing.
    shut: bool,
    chunk: usize,
    /// How long a read keeps its task awake looking for a message.
    spin: Duration,
    /// When the current wait began (`None`: the last read found a message).
    waiting_since: Option<Instant>,
}

impl ByteStream {
    /// Wraps a connection.
    pub fn new(mut conn: Connection) -> ByteStream {
        // The connection's own spin is a busy loop inside the poll: the stream spins by
        // waking its task instead (see "Waiting" above).
        let spin = conn.spin();
        conn.set_spin(Duration::ZERO);
        let chunk = conn.max_msg_size().clamp(1, CHUNK);
        ByteStream {
            conn,
            rest: Vec::new(),
            at: 0,
            eof: false,
            shut: false,
            chunk,
            spin,
            waiting_since: None,
        }
    }

    /// Sets how long a read keeps its task awake looking for a message before it waits
    /// on the reactor (zero: never; `shm:` only). See "Waiting" above.
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// The read spin budget.
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// A read found nothing: `Pending`, after waking the task again at once while the
    /// wait is younger than the spin budget (the ring is looked at again on that poll).
    fn pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.spin.is_zero() && self.conn.inner.recv_hint().is_some() {
            let now = Instant::now();
            let since = *self.waiting_since.get_or_insert(now);
            if now.duration_since(since) < self.spin {
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    }

    /// The connection inside.
    pub fn get_ref(&self) -> &Connection {
        &self.conn
    }

    /// Gives the connection back; bytes read from a message but not yet returned are
    /// lost.
    pub fn into_inner(self) -> Connection {
        self.conn
    }
}

impl AsyncRead for ByteStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if me.at < me.rest.len() {
            let n = (me.rest.len() - me.at).min(buf.remaining());
            buf.put_slice(&me.rest[me.at..me.at + n]);
            me.at += n;
            if me.at == me.rest.len() {
                me.rest.clear();
                me.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        if me.eof {
            return Poll::Ready(Ok(()));
        }
        // Spinning: the poll that began the wait announced it and registered the task
        // with the reactor; within the budget look at the ring only, without a system
        // call. The poll after the budget goes through `poll_op` again, which registers
        // the task anew (a wake-up during the spin used the old registration up).
        if let Some(since) = me.waiting_since {
            if me.conn.inner.recv_hint() == Some(false) && since.elapsed() < me.spin {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
        let n = match me.conn.poll_op(cx, true, |c| c.recv_begin()) {
            Poll::Pending => return me.pending(cx),
            Poll::Ready(r) => {
                me.waiting_since = None;
                r
            }
        };
        let n = match n {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::EndOfStream => {
                me.eof = true;
                return Poll::Ready(Ok(()));
            }
            Err(e) => return Poll::Ready(Err(e.into())),
        };
        let msg = me.conn.inner.lend();
        if n == 0 {
            // The peer's shutdown.
            me.eof = true;
            return Poll::Ready(Ok(()));
        }
        let k = n.min(buf.remaining());
        let dst = buf.initialize_unfilled_to(k);
        msg.bytes().copy_to(dst);
        buf.advance(k);
        if k < n {
            me.rest.resize(n - k, 0);
            msg.bytes().copy_range_to(k, &mut me.rest);
            me.at = 0;
        }
        drop(msg);
        if k == n {
            // Room left: take the messages that are already there, without waiting, so a
            // reader with a large buffer (hyper's) gets many small writes in one read.
            me.read_more(buf);
        }
        Poll::Ready(Ok(()))
    }
}

impl ByteStream {
    /// Copies whole messages that wait, while they fit in `buf`; stops at the first that
    /// does not fit (it stays queued), at the peer's shutdown, or when none waits.
    fn read_more(&mut self, buf: &mut ReadBuf<'_>) {
        // Bounded: at most this many messages per read.
        for _ in 0..64 {
            if buf.remaining() == 0 {
                return;
            }
            let dst = buf.initialize_unfilled();
            match self.conn.inner.recv(dst) {
                Ok(0) => {
                    self.eof = true;
                    return;
                }
                Ok(n) => buf.advance(n),
                Err(e) if e.kind() == ErrorKind::EndOfStream => {
                    self.eof = true;
                    return;
                }
                // Would block, does not fit (still queued), or an error that the next
                // read reports.
                Err(_) => return,
            }
        }
    }
}

impl AsyncWrite for ByteStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if me.shut {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "write after shutdown",
            )));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = buf.len().min(me.chunk);
        ready!(me.conn.poll_send(cx, &buf[..n]))?;
        // A reply may follow: the spin budget of the next read counts from here.
        me.waiting_since = None;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        Poll::Ready(ready!(me.conn.poll_flush(cx)).map_err(io::Error::from))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if !me.shut {
            ready!(me.conn.poll_send(cx, &[]))?;
            me.shut = true;
        }
        Poll::Ready(ready!(me.conn.poll_flush(cx)).map_err(io::Error::from))
    }
}
