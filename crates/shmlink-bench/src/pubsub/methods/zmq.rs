//! `zmq-ipc`: ZeroMQ publish/subscribe (libzmq, through the `zmq` crate) over `ipc://`
//! (a Unix socket file in the temp directory named after the run's tag). The publisher
//! is an `XPUB` socket — a `PUB` socket that also hands the application the
//! subscriptions it receives, so the run starts only once every subscriber's
//! subscription has arrived (ZeroMQ's "slow joiner": a `PUB` socket drops messages for
//! subscriptions it does not know yet). `ZMQ_XPUB_VERBOSE` passes every subscriber's
//! identical subscription, not only the first. Subscribers are `SUB` sockets subscribed
//! to everything; they poll with `ZMQ_DONTWAIT` for a moment, then block in `recv`.
//! High-water marks are off: the run's pacing is the only flow control.
//!
//! Built with the `zmq` cargo feature (on by default); without it the method is listed
//! and skipped with the reason.

use std::io;

use super::super::{Ctx, Method, Prepared, Receive};

pub struct ZmqIpc;

impl Method for ZmqIpc {
    fn name(&self) -> &'static str {
        "zmq-ipc"
    }

    fn about(&self) -> &'static str {
        "ZeroMQ 4.x XPUB/SUB over ipc:// (libzmq): one send, libzmq's I/O thread fans out"
    }

    fn unavailable(&self) -> Option<String> {
        imp::unavailable()
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        imp::prepare(c)
    }

    fn subscribe(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Receive>> {
        imp::subscribe(c, args)
    }
}

#[cfg(feature = "zmq")]
mod imp {
    use std::io;
    use std::time::{Duration, Instant};

    use super::super::super::{Ctx, Prepared, Publish, Receive};
    use super::super::spin_then_block;
    use crate::method::arg;
    use crate::methods::zmq::imp::{socket, zerr, SocketFile};
    use crate::sys::err;

    pub fn unavailable() -> Option<String> {
        if zmq::has("ipc") == Some(false) {
            let (major, minor, patch) = zmq::version();
            return Some(format!(
                "libzmq {major}.{minor}.{patch} was built without the ipc:// transport"
            ));
        }
        None
    }

    struct Pub {
        socket: zmq::Socket,
        _file: SocketFile,
    }

    impl Publish for Pub {
        fn publish(&mut self, msg: &[u8]) -> io::Result<()> {
            self.socket.send(msg, 0).map_err(zerr("zmq_send"))
        }
    }

    pub fn prepare(c: &Ctx) -> io::Result<Prepared> {
        let socket = socket(zmq::XPUB, "ZMQ_XPUB")?;
        socket
            .set_xpub_verbose(true)
            .map_err(zerr("set ZMQ_XPUB_VERBOSE"))?;
        let path = std::env::temp_dir().join(format!("{}.zmq", c.tag));
        let endpoint = format!("ipc://{}", path.display());
        socket
            .bind(&endpoint)
            .map_err(zerr(format!("bind {endpoint}")))?;
        let file = SocketFile(path);
        let n = c.subscribers;
        Ok(Prepared::same_args(
            n,
            vec![endpoint.clone()],
            move |timeout| {
                // Every subscriber's subscription (a message `\x01` + topic) must be in.
                let deadline = Instant::now() + timeout;
                let mut seen = 0;
                while seen < n {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(err(format!(
                            "{seen} of {n} subscriptions arrived on {endpoint} within {timeout:?}"
                        )));
                    }
                    let ready = socket
                        .poll(zmq::POLLIN, left.as_millis().max(1) as i64)
                        .map_err(zerr("zmq_poll"))?;
                    if ready == 0 {
                        continue;
                    }
                    let m = socket
                        .recv_bytes(0)
                        .map_err(zerr("receive a subscription"))?;
                    if m.first() == Some(&1) {
                        seen += 1;
                    }
                }
                Ok(Box::new(Pub {
                    socket,
                    _file: file,
                }) as Box<dyn Publish>)
            },
        ))
    }

    struct Sub {
        socket: zmq::Socket,
        msg: zmq::Message,
        spin: Duration,
    }

    impl Receive for Sub {
        fn recv(&mut self, read: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
            spin_then_block(
                self.spin,
                self,
                |s| match s.socket.recv(&mut s.msg, zmq::DONTWAIT) {
                    Ok(()) => Ok(Some(())),
                    Err(zmq::Error::EAGAIN) => Ok(None),
                    Err(e) => Err(zerr("zmq_recv")(e)),
                },
                |s| s.socket.recv(&mut s.msg, 0).map_err(zerr("zmq_recv")),
            )?;
            read(&self.msg)
        }
    }

    pub fn subscribe(c: &Ctx, args: &[String]) -> io::Result<Box<dyn Receive>> {
        let endpoint = arg(args, 0, "endpoint")?;
        let socket = socket(zmq::SUB, "ZMQ_SUB")?;
        socket
            .connect(endpoint)
            .map_err(zerr(format!("connect {endpoint}")))?;
        socket
            .set_subscribe(b"")
            .map_err(zerr("set ZMQ_SUBSCRIBE"))?;
        Ok(Box::new(Sub {
            socket,
            msg: zmq::Message::new(),
            spin: c.spin,
        }))
    }
}

#[cfg(not(feature = "zmq"))]
mod imp {
    use std::io;

    use super::super::super::{Ctx, Prepared, Receive};
    use crate::sys::err;

    const REASON: &str = "built without the `zmq` feature (it is on by default; this build \
                          used --no-default-features)";

    pub fn unavailable() -> Option<String> {
        Some(REASON.to_string())
    }

    pub fn prepare(_c: &Ctx) -> io::Result<Prepared> {
        Err(err(REASON))
    }

    pub fn subscribe(_c: &Ctx, _args: &[String]) -> io::Result<Box<dyn Receive>> {
        Err(err(REASON))
    }
}
