//! Redis pub/sub with the `redis` crate: a [`Publisher`] (`PUBLISH` on the crate's blocking
//! connection, waiting for each reply as a plain client does) and a [`Subscriber`]
//! (`SUBSCRIBE` on the crate's async pub/sub connection, driven by a one-thread tokio
//! runtime, so that [`Subscriber::try_recv`] can look for a message without blocking).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::thread;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, Stream, StreamExt};

use super::{check_publish_size, CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT, MAX_MESSAGE};

/// The crate's error as an `io::Error` naming the broker and its address; an error reply
/// of the server is of kind `Other` with the server's text.
fn error(addr: SocketAddr, e: redis::RedisError) -> io::Error {
    let kind = if e.is_timeout() {
        io::ErrorKind::TimedOut
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        io::ErrorKind::ConnectionAborted
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, format!("redis {addr}: {e}"))
}

fn client(addr: SocketAddr) -> io::Result<redis::Client> {
    redis::Client::open(format!("redis://{addr}/")).map_err(|e| error(addr, e))
}

/// Publishes to one channel with `PUBLISH`, waiting for each reply (the number of
/// subscribers that got the message).
pub struct Publisher {
    addr: SocketAddr,
    conn: redis::Connection,
    channel: String,
}

impl Publisher {
    /// Connects to the Redis server at `addr` to publish to `channel` (checked with a
    /// `PING`).
    pub fn connect(addr: SocketAddr, channel: &str) -> io::Result<Publisher> {
        let mut conn = client(addr)?
            .get_connection_with_timeout(CONNECT_TIMEOUT)
            .map_err(|e| error(addr, e))?;
        conn.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
            .map_err(|e| error(addr, e))?;
        let pong: String = redis::cmd("PING")
            .query(&mut conn)
            .map_err(|e| error(addr, e))?;
        if pong != "PONG" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("redis {addr}: PING answered with {pong:?}"),
            ));
        }
        conn.set_read_timeout(None).map_err(|e| error(addr, e))?;
        Ok(Publisher {
            addr,
            conn,
            channel: channel.to_owned(),
        })
    }

    /// Sends `msg` (binary, up to [`MAX_MESSAGE`] bytes) to every subscriber of the
    /// channel and waits for the reply.
    pub fn publish(&mut self, msg: &[u8]) -> io::Result<()> {
        check_publish_size(msg)?;
        let _receivers: i64 = redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg(msg)
            .query(&mut self.conn)
            .map_err(|e| error(self.addr, e))?;
        Ok(())
    }

    /// How many clients are subscribed to `channel` (`PUBSUB NUMSUB`).
    pub fn subscribers(&mut self, channel: &str) -> io::Result<usize> {
        let counts: Vec<(String, usize)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query(&mut self.conn)
            .map_err(|e| error(self.addr, e))?;
        match counts.as_slice() {
            [(name, n)] if name == channel => Ok(*n),
            other => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("redis {}: PUBSUB NUMSUB answered with {other:?}", self.addr),
            )),
        }
    }

    /// Waits until at least `n` clients are subscribed to this publisher's channel, asking
    /// every millisecond; `TimedOut` after `timeout`.
    pub fn wait_for_subscribers(&mut self, n: usize, timeout: Duration) -> io::Result<()> {
        let start = Instant::now();
        let channel = self.channel.clone();
        loop {
            let have = self.subscribers(&channel)?;
            if have >= n {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redis {}: {have} of {n} subscribers on {channel:?} after {timeout:?}",
                        self.addr
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(1));
        }
    }
}

type Messages = Pin<Box<dyn Stream<Item = redis::Msg> + Send>>;

/// Receives the messages of one channel.
pub struct Subscriber {
    addr: SocketAddr,
    /// Runs the connection's reader; one worker thread.
    runtime: tokio::runtime::Runtime,
    messages: Messages,
    read_timeout: Option<Duration>,
}

/// The runtime a subscriber's connection runs on: one worker thread, so the connection
/// reads while the caller is not inside the runtime.
pub(crate) fn runtime(broker: &str) -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(format!("{broker}-client"))
        .enable_all()
        .build()
}

impl Subscriber {
    /// Subscribes to `channel` on the Redis server at `addr`; returns once the server
    /// confirmed the subscription, so every message published after this returned
    /// reaches the subscriber.
    pub fn connect(addr: SocketAddr, channel: &str) -> io::Result<Subscriber> {
        let client = client(addr)?;
        let runtime = runtime("redis")?;
        let messages = runtime.block_on(async {
            let subscribe = async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            match tokio::time::timeout(CONNECT_TIMEOUT + HANDSHAKE_TIMEOUT, subscribe).await {
                Ok(Ok(pubsub)) => Ok(Box::pin(pubsub.into_on_message()) as Messages),
                Ok(Err(e)) => Err(error(addr, e)),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("redis {addr}: no subscription confirmed for {channel:?}"),
                )),
            }
        })?;
        Ok(Subscriber {
            addr,
            runtime,
            messages,
            read_timeout: None,
        })
    }

    /// How long [`recv`](Self::recv) waits (`None`: for ever); after it, `TimedOut`.
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if timeout == Some(Duration::ZERO) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a read timeout of zero",
            ));
        }
        self.read_timeout = timeout;
        Ok(())
    }

    /// Puts the payload of the next message in `buf` (replacing its contents), waiting
    /// for it.
    pub fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        let next = self.messages.next();
        let msg = match self.read_timeout {
            None => self.runtime.block_on(next),
            Some(t) => self
                .runtime
                .block_on(async { tokio::time::timeout(t, next).await })
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("redis {}: no message within {t:?}", self.addr),
                    )
                })?,
        };
        self.take(msg, buf)
    }

    /// Like [`recv`](Self::recv) if a message has arrived; `Ok(false)` at once if not.
    pub fn try_recv(&mut self, buf: &mut Vec<u8>) -> io::Result<bool> {
        let _in_runtime = self.runtime.enter();
        match self.messages.next().now_or_never() {
            None => Ok(false),
            Some(msg) => self.take(msg, buf).map(|()| true),
        }
    }

    fn take(&self, msg: Option<redis::Msg>, buf: &mut Vec<u8>) -> io::Result<()> {
        let msg = msg.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("redis {}: the connection closed", self.addr),
            )
        })?;
        let payload = msg.get_payload_bytes();
        if payload.len() > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "redis {}: message of {} bytes is over the limit of {MAX_MESSAGE}",
                    self.addr,
                    payload.len()
                ),
            ));
        }
        buf.clear();
        buf.extend_from_slice(payload);
        Ok(())
    }
}
