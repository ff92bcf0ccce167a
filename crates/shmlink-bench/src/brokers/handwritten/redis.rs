//! Redis pub/sub: a [`Publisher`] (`PUBLISH`) and a [`Subscriber`] (`SUBSCRIBE`) over one
//! TCP connection each, speaking RESP2 (`super::resp`).

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::thread;
use std::time::{Duration, Instant};

use super::resp::{self, Value};
use super::wire::Wire;
use super::{CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT};

const BROKER: &str = "redis";

/// Publishes to one channel with `PUBLISH`.
///
/// By default every [`publish`](Self::publish) waits for its reply (the number of
/// subscribers that got the message), which is what a plain Redis client does. With
/// [`set_window`](Self::set_window)`(n)` up to `n` replies may still be outstanding when
/// `publish` returns (pipelining): fewer round trips, and a failed `PUBLISH` is reported by
/// a later call ([`flush`](Self::flush) waits for all).
pub struct Publisher {
    wire: Wire,
    channel: Vec<u8>,
    head: Vec<u8>,
    pending: usize,
    window: usize,
}

impl Publisher {
    /// Connects to the Redis server at `addr` to publish to `channel` (checked with a
    /// `PING`).
    pub fn connect(addr: SocketAddr, channel: &str) -> io::Result<Publisher> {
        let wire = Wire::connect(addr, BROKER, CONNECT_TIMEOUT)?;
        let mut publisher = Publisher {
            wire,
            channel: channel.as_bytes().to_vec(),
            head: Vec::with_capacity(64),
            pending: 0,
            window: 0,
        };
        publisher.wire.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        match publisher.command(&[b"PING"])? {
            Reply::Simple(s) if s == b"PONG" => {}
            other => {
                return Err(publisher
                    .wire
                    .invalid(format!("PING answered with {other:?}")))
            }
        }
        publisher.wire.set_read_timeout(None)?;
        Ok(publisher)
    }

    /// Sends `msg` (binary, up to [`MAX_MESSAGE`](super::MAX_MESSAGE) bytes) to every subscriber of the
    /// channel. Waits for the reply unless a [window](Self::set_window) allows it to be
    /// outstanding.
    pub fn publish(&mut self, msg: &[u8]) -> io::Result<()> {
        super::check_publish_size(msg)?;
        self.head.clear();
        resp::encode_command(
            &mut self.head,
            &[b"PUBLISH", &self.channel],
            Some(msg.len()),
        );
        let mut bufs = [
            IoSlice::new(&self.head),
            IoSlice::new(msg),
            IoSlice::new(b"\r\n"),
        ];
        self.wire.write_all(&mut bufs)?;
        self.pending += 1;
        while self.pending > self.window {
            self.publish_reply()?;
        }
        Ok(())
    }

    /// How many `PUBLISH` replies may be outstanding when [`publish`](Self::publish)
    /// returns: `0` (the default) waits for each reply. Waits for replies beyond the new
    /// window.
    pub fn set_window(&mut self, window: usize) -> io::Result<()> {
        self.window = window;
        while self.pending > self.window {
            self.publish_reply()?;
        }
        Ok(())
    }

    /// Waits for the replies of all published messages.
    pub fn flush(&mut self) -> io::Result<()> {
        while self.pending > 0 {
            self.publish_reply()?;
        }
        Ok(())
    }

    /// How many clients are subscribed to `channel` (`PUBSUB NUMSUB`). Flushes first.
    pub fn subscribers(&mut self, channel: &str) -> io::Result<usize> {
        self.flush()?;
        let reply = self.command(&[b"PUBSUB", b"NUMSUB", channel.as_bytes()])?;
        match reply {
            Reply::Array(items) => match items.as_slice() {
                [Reply::Bulk(name), Reply::Int(n)] if name == channel.as_bytes() => {
                    usize::try_from(*n).map_err(|_| self.wire.invalid(format!("NUMSUB count {n}")))
                }
                _ => Err(self
                    .wire
                    .invalid(format!("PUBSUB NUMSUB answered with {items:?}"))),
            },
            other => Err(self
                .wire
                .invalid(format!("PUBSUB NUMSUB answered with {other:?}"))),
        }
    }

    /// Waits until at least `n` clients are subscribed to this publisher's channel, asking
    /// every millisecond; `TimedOut` after `timeout`.
    pub fn wait_for_subscribers(&mut self, n: usize, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        let channel = String::from_utf8_lossy(&self.channel).into_owned();
        loop {
            let have = self.subscribers(&channel)?;
            if have >= n {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("redis: {have} of {n} subscribers on {channel:?} after {timeout:?}"),
                ));
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// How long a write (and so [`publish`](Self::publish)) may block (`None`: forever).
    /// A publish that timed out may have written part of a command: the connection is
    /// unusable after it.
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.wire.stream().set_write_timeout(timeout)
    }

    /// Reads the reply of the oldest outstanding `PUBLISH`.
    fn publish_reply(&mut self) -> io::Result<()> {
        let reply = read_reply(&mut self.wire)?;
        self.pending -= 1;
        match reply {
            Reply::Int(_) => Ok(()),
            Reply::Error(text) => Err(server_error(&self.wire, "PUBLISH", &text)),
            other => Err(self
                .wire
                .invalid(format!("PUBLISH answered with {other:?}"))),
        }
    }

    /// Sends a command (no publish replies outstanding) and reads its reply.
    fn command(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        debug_assert_eq!(self.pending, 0);
        let mut out = Vec::new();
        resp::encode_command(&mut out, args, None);
        self.wire.write_all(&mut [IoSlice::new(&out)])?;
        let reply = read_reply(&mut self.wire)?;
        if let Reply::Error(text) = &reply {
            let name = String::from_utf8_lossy(args[0]).into_owned();
            return Err(server_error(&self.wire, &name, text));
        }
        Ok(reply)
    }
}

impl AsRawFd for Publisher {
    fn as_raw_fd(&self) -> RawFd {
        self.wire.stream().as_raw_fd()
    }
}

/// Receives the messages published to one channel (`SUBSCRIBE`).
pub struct Subscriber {
    wire: Wire,
    channel: Vec<u8>,
}

impl Subscriber {
    /// Connects to the Redis server at `addr` and subscribes to `channel`. Returns once
    /// Redis confirmed the subscription: every message published after that reaches this
    /// subscriber.
    pub fn connect(addr: SocketAddr, channel: &str) -> io::Result<Subscriber> {
        let mut wire = Wire::connect(addr, BROKER, CONNECT_TIMEOUT)?;
        wire.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let mut out = Vec::new();
        resp::encode_command(&mut out, &[b"SUBSCRIBE", channel.as_bytes()], None);
        wire.write_all(&mut [IoSlice::new(&out)])?;
        match read_reply(&mut wire)? {
            Reply::Array(items) => match items.as_slice() {
                [Reply::Bulk(kind), Reply::Bulk(name), Reply::Int(_)]
                    if kind == b"subscribe" && name == channel.as_bytes() => {}
                _ => return Err(wire.invalid(format!("SUBSCRIBE answered with {items:?}"))),
            },
            Reply::Error(text) => return Err(server_error(&wire, "SUBSCRIBE", &text)),
            other => return Err(wire.invalid(format!("SUBSCRIBE answered with {other:?}"))),
        }
        wire.set_read_timeout(None)?;
        Ok(Subscriber {
            wire,
            channel: channel.as_bytes().to_vec(),
        })
    }

    /// Waits for the next message and puts its payload in `buf` (replacing what was
    /// there). In non-blocking mode, `WouldBlock` when no complete message has arrived; with
    /// a [read timeout](Self::set_read_timeout), `WouldBlock` or `TimedOut` when it passed.
    pub fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        loop {
            if self.take(buf)? {
                return Ok(());
            }
            self.wire.fill()?;
        }
    }

    /// The next message if one has arrived, without blocking: `Ok(false)` when none is
    /// complete yet. Cheapest in non-blocking mode (otherwise it switches the socket to
    /// non-blocking for its read and back).
    pub fn try_recv(&mut self, buf: &mut Vec<u8>) -> io::Result<bool> {
        loop {
            if self.take(buf)? {
                return Ok(true);
            }
            if !self.wire.try_fill()? {
                return Ok(false);
            }
        }
    }

    /// Non-blocking mode for [`recv`](Self::recv) (for event loops on [`as_raw_fd`](
    /// AsRawFd::as_raw_fd)).
    pub fn set_nonblocking(&mut self, nonblocking: bool) -> io::Result<()> {
        self.wire.set_nonblocking(nonblocking)
    }

    /// How long a blocking [`recv`](Self::recv) waits at most (`None`: forever).
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.wire.set_read_timeout(timeout)
    }

    /// Takes the first buffered message, if complete, into `buf`.
    fn take(&mut self, buf: &mut Vec<u8>) -> io::Result<bool> {
        let Some((value, used)) =
            resp::parse(self.wire.data()).map_err(|e| self.wire.invalid(e))?
        else {
            return Ok(false);
        };
        match &value {
            Value::Array(Some(items)) => match items.as_slice() {
                [Value::Bulk(Some(b"message")), Value::Bulk(Some(name)), Value::Bulk(Some(payload))] =>
                {
                    if *name != self.channel.as_slice() {
                        return Err(self.wire.invalid(format!(
                            "message for channel {:?}, subscribed to {:?}",
                            String::from_utf8_lossy(name),
                            String::from_utf8_lossy(&self.channel)
                        )));
                    }
                    buf.clear();
                    buf.extend_from_slice(payload);
                }
                _ => {
                    return Err(self
                        .wire
                        .invalid(format!("unexpected push {:?}", Reply::from(&value))))
                }
            },
            Value::Error(text) => {
                let text = text.to_vec();
                return Err(server_error(&self.wire, "SUBSCRIBE", &text));
            }
            _ => {
                return Err(self
                    .wire
                    .invalid(format!("unexpected push {:?}", Reply::from(&value))))
            }
        }
        self.wire.consume(used);
        Ok(true)
    }
}

impl AsRawFd for Subscriber {
    fn as_raw_fd(&self) -> RawFd {
        self.wire.stream().as_raw_fd()
    }
}

/// A reply detached from the input buffer (replies other than messages are small), with
/// bulk strings shortened in `Debug` for error messages.
#[derive(PartialEq, Eq)]
enum Reply {
    Simple(Vec<u8>),
    Error(Vec<u8>),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<Reply>),
}

impl From<&Value<'_>> for Reply {
    fn from(value: &Value<'_>) -> Reply {
        match value {
            Value::Simple(s) => Reply::Simple(s.to_vec()),
            Value::Error(s) => Reply::Error(s.to_vec()),
            Value::Int(n) => Reply::Int(*n),
            Value::Bulk(Some(b)) => Reply::Bulk(b.to_vec()),
            Value::Bulk(None) | Value::Array(None) => Reply::Null,
            Value::Array(Some(items)) => Reply::Array(items.iter().map(Reply::from).collect()),
        }
    }
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = |b: &[u8]| {
            let shown = String::from_utf8_lossy(&b[..b.len().min(64)]).into_owned();
            if b.len() > 64 {
                format!("{shown}... ({} bytes)", b.len())
            } else {
                shown
            }
        };
        match self {
            Reply::Simple(s) => write!(f, "+{}", text(s)),
            Reply::Error(s) => write!(f, "-{}", text(s)),
            Reply::Int(n) => write!(f, ":{n}"),
            Reply::Bulk(b) => write!(f, "{:?}", text(b)),
            Reply::Null => write!(f, "null"),
            Reply::Array(items) => f.debug_list().entries(items).finish(),
        }
    }
}

/// Reads one complete reply (blocking, or as the stream's mode and timeout say).
fn read_reply(wire: &mut Wire) -> io::Result<Reply> {
    loop {
        if let Some((value, used)) = resp::parse(wire.data()).map_err(|e| wire.invalid(e))? {
            let reply = Reply::from(&value);
            wire.consume(used);
            return Ok(reply);
        }
        wire.fill()?;
    }
}

/// An error reply of the server to `command`.
fn server_error(wire: &Wire, command: &str, text: &[u8]) -> io::Error {
    wire.context(
        command,
        io::Error::other(String::from_utf8_lossy(text).into_owned()),
    )
}
