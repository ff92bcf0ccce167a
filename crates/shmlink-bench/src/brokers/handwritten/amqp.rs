//! RabbitMQ pub/sub over AMQP 0-9-1: a [`Publisher`] that publishes to a fanout exchange
//! and a [`Subscriber`] that consumes from its own queue bound to it, one TCP connection
//! and one channel each. The framing is in `super::frame`.
//!
//! Both log in as `guest`/`guest` (RabbitMQ allows it from loopback), negotiate a frame
//! size of at most 128 KiB and heartbeats off (0: neither side sends or expects them;
//! heartbeat frames that come anyway are ignored), and declare the exchange the same way:
//! type `fanout`, not durable, auto-delete (it goes away when its last queue does).

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

// The framing and the method ids.
use super::frame::{self, *};
use super::wire::Wire;
use super::{CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT, MAX_MESSAGE};

const BROKER: &str = "rabbitmq";
/// The one channel each connection opens.
const CHANNEL: u16 = 1;
/// The largest frame this client asks for (RabbitMQ's default is the same).
const FRAME_MAX: u32 = 128 * 1024;
/// The largest frame accepted before Connection.Tune settled the size.
const FRAME_MAX_BEFORE_TUNE: u32 = 64 * 1024;
/// How many publishes between two looks at what the server sent a publisher (a
/// Connection.Close or Channel.Close would otherwise go unnoticed until the socket fails).
const CHECK_EVERY: u32 = 256;
/// The prefetch count a subscriber asks for. RabbitMQ ignores it for no-ack consumers
/// (what the subscribers are); flow is bounded by TCP and RabbitMQ's credit flow.
const PREFETCH: u16 = 1000;

/// One connection with channel 1 open.
struct Connection {
    wire: Wire,
    frame_max: u32,
}

/// What a method frame held: its ids and arguments.
struct Method {
    id: (u16, u16),
    args: Vec<u8>,
}

impl Connection {
    /// Connects, logs in, tunes, opens the virtual host `/` and channel 1.
    fn open(addr: SocketAddr) -> io::Result<Connection> {
        let mut wire = Wire::connect(addr, BROKER, CONNECT_TIMEOUT)?;
        wire.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        wire.write_all(&mut [IoSlice::new(&frame::PROTOCOL_HEADER)])?;
        let mut conn = Connection {
            wire,
            frame_max: FRAME_MAX_BEFORE_TUNE,
        };

        let start = conn.expect(0, CONNECTION_START)?;
        let mut a = Args::new(&start, "Connection.Start");
        let version = (a.u8()?, a.u8()?);
        a.long_str()?; // server properties
        let mechanisms = a.long_str()?;
        if version != (0, 9) {
            return Err(conn.wire.invalid(format!(
                "server speaks AMQP {}-{}, not 0-9",
                version.0, version.1
            )));
        }
        if !mechanisms.split(|&b| b == b' ').any(|m| m == b"PLAIN") {
            return Err(conn.wire.invalid(format!(
                "server offers no PLAIN login (mechanisms {:?})",
                String::from_utf8_lossy(mechanisms)
            )));
        }
        let mut properties = Vec::new();
        properties.push(7u8);
        properties.extend_from_slice(b"product");
        properties.push(b'S');
        properties.extend_from_slice(&13u32.to_be_bytes());
        properties.extend_from_slice(b"shmlink-bench");
        conn.send(
            MethodFrame::new(0, CONNECTION_START_OK.0, CONNECTION_START_OK.1)
                .long_str(&properties)
                .short_str(b"PLAIN")
                .long_str(b"\0guest\0guest")
                .short_str(b"en_US")
                .finish(),
        )?;

        let tune = conn.expect(0, CONNECTION_TUNE)?;
        let mut a = Args::new(&tune, "Connection.Tune");
        // channel_max is 0 (no limit) or at least 1: the one channel used fits.
        let (_channel_max, frame_max, _heartbeat) = (a.u16()?, a.u32()?, a.u16()?);
        let frame_max = if frame_max == 0 {
            FRAME_MAX
        } else {
            frame_max.min(FRAME_MAX)
        };
        if frame_max < frame::FRAME_MIN {
            return Err(conn
                .wire
                .invalid(format!("server frame_max {frame_max} is below 4096")));
        }
        conn.send(
            MethodFrame::new(0, CONNECTION_TUNE_OK.0, CONNECTION_TUNE_OK.1)
                .u16(1) // channel_max
                .u32(frame_max)
                .u16(0) // heartbeats off
                .finish(),
        )?;
        conn.frame_max = frame_max;
        conn.call(
            0,
            MethodFrame::new(0, CONNECTION_OPEN.0, CONNECTION_OPEN.1)
                .short_str(b"/")
                .short_str(b"")
                .u8(0),
            CONNECTION_OPEN_OK,
        )?;
        conn.call(
            CHANNEL,
            MethodFrame::new(CHANNEL, CHANNEL_OPEN.0, CHANNEL_OPEN.1).short_str(b""),
            CHANNEL_OPEN_OK,
        )?;
        Ok(conn)
    }

    /// Declares `exchange`: fanout, not durable, auto-delete.
    fn declare_exchange(&mut self, exchange: &str) -> io::Result<()> {
        let flags = 0b0000_0100; // passive 0, durable 0, auto-delete 1, internal 0, no-wait 0
        self.call(
            CHANNEL,
            MethodFrame::new(CHANNEL, EXCHANGE_DECLARE.0, EXCHANGE_DECLARE.1)
                .u16(0)
                .short_str(exchange.as_bytes())
                .short_str(b"fanout")
                .u8(flags)
                .empty_table(),
            EXCHANGE_DECLARE_OK,
        )?;
        Ok(())
    }

    fn send(&mut self, frame: Vec<u8>) -> io::Result<()> {
        self.wire.write_all(&mut [IoSlice::new(&frame)])
    }

    /// Sends a method and waits for its reply `reply` on `channel`; its arguments.
    fn call(
        &mut self,
        channel: u16,
        method: MethodFrame,
        reply: (u16, u16),
    ) -> io::Result<Vec<u8>> {
        self.send(method.finish())?;
        self.expect(channel, reply)
    }

    /// Reads frames until method `id` arrives on `channel`: heartbeats are skipped, a
    /// Connection.Close or Channel.Close becomes an error with the server's reply, anything
    /// else is a protocol violation.
    fn expect(&mut self, channel: u16, id: (u16, u16)) -> io::Result<Vec<u8>> {
        loop {
            let Some(frame) = self.next_frame(true)? else {
                continue;
            };
            match frame {
                Incoming::Heartbeat => {}
                Incoming::Method(ch, method) if ch == channel && method.id == id => {
                    return Ok(method.args)
                }
                Incoming::Method(ch, method) => {
                    if let Some(e) = self.close_error(ch, &method)? {
                        return Err(e);
                    }
                    return Err(self.wire.invalid(format!(
                        "{} on channel {ch} while waiting for {}",
                        method_name(method.id),
                        method_name(id)
                    )));
                }
                Incoming::Content(ch, kind) => {
                    return Err(self.wire.invalid(format!(
                        "content frame (type {kind}) on channel {ch} while waiting for {}",
                        method_name(id)
                    )));
                }
            }
        }
    }

    /// The next frame outside a delivery: method arguments are copied out, content frames
    /// only named (the callers treat them as violations). `blocking` false: `None` when no
    /// complete frame is readable.
    fn next_frame(&mut self, blocking: bool) -> io::Result<Option<Incoming>> {
        loop {
            let parsed =
                frame::parse(self.wire.data(), self.frame_max).map_err(|e| self.wire.invalid(e))?;
            if let Some((f, used)) = parsed {
                let incoming = match f.kind {
                    METHOD => {
                        let mut a = Args::new(f.payload, "method frame");
                        let id = (a.u16()?, a.u16()?);
                        Incoming::Method(
                            f.channel,
                            Method {
                                id,
                                args: f.payload[4..].to_vec(),
                            },
                        )
                    }
                    HEARTBEAT => Incoming::Heartbeat,
                    kind => Incoming::Content(f.channel, kind),
                };
                self.wire.consume(used);
                return Ok(Some(incoming));
            }
            if blocking {
                self.wire.fill()?;
            } else if !self.wire.try_fill()? {
                return Ok(None);
            }
        }
    }

    /// For a Connection.Close or Channel.Close: answers it (best effort) and returns the
    /// error to report, with the server's reply code and text.
    fn close_error(&mut self, channel: u16, method: &Method) -> io::Result<Option<io::Error>> {
        let (scope, ok) = match method.id {
            CONNECTION_CLOSE if channel == 0 => ("connection", CONNECTION_CLOSE_OK),
            CHANNEL_CLOSE if channel == CHANNEL => ("channel", CHANNEL_CLOSE_OK),
            _ => return Ok(None),
        };
        let mut a = Args::new(&method.args, "Close");
        let code = a.u16()?;
        let text = String::from_utf8_lossy(a.short_str()?).into_owned();
        let cause = (a.u16()?, a.u16()?);
        // Best effort: the error to report is the server's.
        let _ = self.send(MethodFrame::new(channel, ok.0, ok.1).finish());
        let during = if cause == (0, 0) {
            String::new()
        } else {
            format!(" (in reply to {})", method_name(cause))
        };
        Ok(Some(self.wire.context(
            &format!("server closed the {scope}"),
            io::Error::other(format!("{code} {text}{during}")),
        )))
    }

    /// Sends Connection.Close and waits for Connection.CloseOk (skipping whatever else
    /// comes first), at most `HANDSHAKE_TIMEOUT`.
    fn close(mut self) -> io::Result<()> {
        self.wire.set_nonblocking(false)?;
        self.wire.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        self.send(
            MethodFrame::new(0, CONNECTION_CLOSE.0, CONNECTION_CLOSE.1)
                .u16(200)
                .short_str(b"bye")
                .u16(0)
                .u16(0)
                .finish(),
        )?;
        loop {
            if let Some(Incoming::Method(0, m)) = self.next_frame(true)? {
                if m.id == CONNECTION_CLOSE_OK {
                    return Ok(());
                }
                if let Some(e) = self.close_error(0, &m)? {
                    return Err(e);
                }
            }
        }
    }
}

/// A frame as [`Connection::next_frame`] reports it.
enum Incoming {
    Heartbeat,
    Method(u16, Method),
    /// Channel, frame type.
    Content(u16, u8),
}

/// Publishes to a fanout exchange (Basic.Publish, routing key empty, not mandatory).
///
/// Publishing does not wait for the server: messages go out as fast as TCP and RabbitMQ's
/// flow control take them. Every 256 publishes (and in [`check`](Self::check)) the
/// publisher looks, without blocking, for a close from the server, to report it.
pub struct Publisher {
    conn: Connection,
    /// The Basic.Publish frame, the same for every message.
    publish_frame: Vec<u8>,
    glue: Vec<u8>,
    cuts: Vec<usize>,
    since_check: u32,
}

impl Publisher {
    /// Connects to RabbitMQ at `addr` and declares the fanout exchange `exchange` (at most
    /// 255 bytes).
    pub fn connect(addr: SocketAddr, exchange: &str) -> io::Result<Publisher> {
        check_name(exchange)?;
        let mut conn = Connection::open(addr)?;
        conn.declare_exchange(exchange)?;
        conn.wire.set_read_timeout(None)?;
        let publish_frame = MethodFrame::new(CHANNEL, BASIC_PUBLISH.0, BASIC_PUBLISH.1)
            .u16(0)
            .short_str(exchange.as_bytes())
            .short_str(b"")
            .u8(0) // mandatory 0, immediate 0
            .finish();
        Ok(Publisher {
            conn,
            publish_frame,
            glue: Vec::new(),
            cuts: Vec::new(),
            since_check: 0,
        })
    }

    /// Publishes `msg` (up to [`MAX_MESSAGE`] bytes): the method frame, the content header
    /// and the body in frames of at most the negotiated frame size, in one vectored write
    /// (the body is not copied).
    pub fn publish(&mut self, msg: &[u8]) -> io::Result<()> {
        super::check_publish_size(msg)?;
        self.since_check += 1;
        if self.since_check >= CHECK_EVERY {
            self.check()?;
        }
        let chunk = (self.conn.frame_max as usize) - FRAME_OVERHEAD;
        self.glue.clear();
        self.cuts.clear();
        self.glue.extend_from_slice(&self.publish_frame);
        frame::push_content_header(&mut self.glue, CHANNEL, msg.len() as u64);
        for (i, part) in msg.chunks(chunk).enumerate() {
            if i > 0 {
                self.glue.push(FRAME_END);
            }
            frame::push_frame_header(&mut self.glue, BODY, CHANNEL, part.len());
            self.cuts.push(self.glue.len());
        }
        if !msg.is_empty() {
            self.glue.push(FRAME_END);
        }
        let mut bufs = Vec::with_capacity(2 * self.cuts.len() + 1);
        let mut from = 0;
        for (&cut, part) in self.cuts.iter().zip(msg.chunks(chunk)) {
            bufs.push(IoSlice::new(&self.glue[from..cut]));
            bufs.push(IoSlice::new(part));
            from = cut;
        }
        bufs.push(IoSlice::new(&self.glue[from..]));
        self.conn.wire.write_all(&mut bufs)
    }

    /// Reports a Connection.Close or Channel.Close the server sent (without blocking).
    pub fn check(&mut self) -> io::Result<()> {
        self.since_check = 0;
        while let Some(incoming) = self.conn.next_frame(false)? {
            match incoming {
                Incoming::Heartbeat => {}
                Incoming::Method(0, m)
                    if m.id == CONNECTION_BLOCKED || m.id == CONNECTION_UNBLOCKED => {}
                Incoming::Method(ch, m) => {
                    if let Some(e) = self.conn.close_error(ch, &m)? {
                        return Err(e);
                    }
                    return Err(self
                        .conn
                        .wire
                        .invalid(format!("unexpected {} on channel {ch}", method_name(m.id))));
                }
                Incoming::Content(ch, kind) => {
                    return Err(self.conn.wire.invalid(format!(
                        "unexpected content frame type {kind} on channel {ch}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// How long a write (and so [`publish`](Self::publish)) may block (`None`: forever):
    /// RabbitMQ stops reading from publishers it throttles (credit flow, memory or disk
    /// alarms). A publish that timed out may have written part of a message: the connection
    /// is unusable after it.
    pub fn set_write_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.conn.wire.stream().set_write_timeout(timeout)
    }

    /// Closes the connection cleanly: RabbitMQ has routed every message published before
    /// its Connection.CloseOk, which this waits for.
    pub fn close(self) -> io::Result<()> {
        self.conn.close()
    }
}

impl AsRawFd for Publisher {
    fn as_raw_fd(&self) -> RawFd {
        self.conn.wire.stream().as_raw_fd()
    }
}

/// Where a subscriber is within a delivery: method, content header, body frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Content {
    Idle,
    Header,
    Body { remaining: usize },
}

/// Receives what is published to a fanout exchange: an exclusive, auto-delete queue named
/// by the server, bound to the exchange, consumed with no-ack.
pub struct Subscriber {
    conn: Connection,
    queue: String,
    state: Content,
    /// The body being assembled; swapped with the caller's buffer when complete.
    body: Vec<u8>,
}

impl Subscriber {
    /// Connects to RabbitMQ at `addr`, declares the fanout exchange `exchange` (as the
    /// publisher does; whichever comes first creates it), declares its queue, binds it and
    /// starts consuming. Returns after Basic.ConsumeOk: every message published to the
    /// exchange after that reaches this subscriber.
    pub fn connect(addr: SocketAddr, exchange: &str) -> io::Result<Subscriber> {
        check_name(exchange)?;
        let mut conn = Connection::open(addr)?;
        conn.declare_exchange(exchange)?;
        let flags = 0b0000_1100; // passive 0, durable 0, exclusive 1, auto-delete 1, no-wait 0
        let declared = conn.call(
            CHANNEL,
            MethodFrame::new(CHANNEL, QUEUE_DECLARE.0, QUEUE_DECLARE.1)
                .u16(0)
                .short_str(b"")
                .u8(flags)
                .empty_table(),
            QUEUE_DECLARE_OK,
        )?;
        let queue = Args::new(&declared, "Queue.DeclareOk")
            .short_str()?
            .to_vec();
        if queue.is_empty() {
            return Err(conn.wire.invalid("Queue.DeclareOk without a queue name"));
        }
        conn.call(
            CHANNEL,
            MethodFrame::new(CHANNEL, QUEUE_BIND.0, QUEUE_BIND.1)
                .u16(0)
                .short_str(&queue)
                .short_str(exchange.as_bytes())
                .short_str(b"")
                .u8(0) // no-wait 0
                .empty_table(),
            QUEUE_BIND_OK,
        )?;
        conn.call(
            CHANNEL,
            MethodFrame::new(CHANNEL, BASIC_QOS.0, BASIC_QOS.1)
                .u32(0)
                .u16(PREFETCH)
                .u8(0),
            BASIC_QOS_OK,
        )?;
        let flags = 0b0000_0010; // no-local 0, no-ack 1, exclusive 0, no-wait 0
        conn.call(
            CHANNEL,
            MethodFrame::new(CHANNEL, BASIC_CONSUME.0, BASIC_CONSUME.1)
                .u16(0)
                .short_str(&queue)
                .short_str(b"") // consumer tag chosen by the server
                .u8(flags)
                .empty_table(),
            BASIC_CONSUME_OK,
        )?;
        conn.wire.set_read_timeout(None)?;
        let queue = String::from_utf8_lossy(&queue).into_owned();
        Ok(Subscriber {
            conn,
            queue,
            state: Content::Idle,
            body: Vec::new(),
        })
    }

    /// The name the server gave this subscriber's queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Waits for the next message and puts its body in `buf` (replacing what was there).
    /// In non-blocking mode, `WouldBlock` when no complete message has arrived; with a
    /// [read timeout](Self::set_read_timeout), `WouldBlock` or `TimedOut` when it passed.
    pub fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        loop {
            match self.step(buf)? {
                Some(true) => return Ok(()),
                Some(false) => {}
                None => self.conn.wire.fill()?,
            }
        }
    }

    /// The next message if one has arrived, without blocking: `Ok(false)` when none is
    /// complete yet (a partly received one stays buffered). Cheapest in non-blocking mode.
    pub fn try_recv(&mut self, buf: &mut Vec<u8>) -> io::Result<bool> {
        loop {
            match self.step(buf)? {
                Some(true) => return Ok(true),
                Some(false) => {}
                None => {
                    if !self.conn.wire.try_fill()? {
                        return Ok(false);
                    }
                }
            }
        }
    }

    /// Non-blocking mode for [`recv`](Self::recv) (for event loops on [`as_raw_fd`](
    /// AsRawFd::as_raw_fd)).
    pub fn set_nonblocking(&mut self, nonblocking: bool) -> io::Result<()> {
        self.conn.wire.set_nonblocking(nonblocking)
    }

    /// How long a blocking [`recv`](Self::recv) waits at most (`None`: forever).
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.conn.wire.set_read_timeout(timeout)
    }

    /// Closes the connection cleanly (the queue is deleted with it).
    pub fn close(self) -> io::Result<()> {
        self.conn.close()
    }

    /// Handles the first buffered frame: `Some(true)` when it completed a message (now in
    /// `buf`), `Some(false)` when it was something else, `None` when no frame is complete.
    fn step(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<bool>> {
        let wire = &self.conn.wire;
        let Some((f, used)) =
            frame::parse(wire.data(), self.conn.frame_max).map_err(|e| wire.invalid(e))?
        else {
            return Ok(None);
        };
        let (kind, channel) = (f.kind, f.channel);
        let mut complete = false;
        match (kind, channel, self.state) {
            (HEARTBEAT, 0, _) => {}
            (METHOD, CHANNEL, Content::Idle) | (METHOD, 0, _) => {
                let mut a = Args::new(f.payload, "method frame");
                let id = (a.u16()?, a.u16()?);
                if id == BASIC_DELIVER && channel == CHANNEL {
                    // Consumer tag, delivery tag, redelivered, exchange, routing key: only
                    // checked to be well-formed.
                    let mut a = Args::new(&f.payload[4..], "Basic.Deliver");
                    a.short_str()?;
                    a.u64()?;
                    a.u8()?;
                    a.short_str()?;
                    a.short_str()?;
                    self.state = Content::Header;
                } else {
                    let method = Method {
                        id,
                        args: f.payload[4..].to_vec(),
                    };
                    self.conn.wire.consume(used);
                    if let Some(e) = self.conn.close_error(channel, &method)? {
                        return Err(e);
                    }
                    let what = if id == BASIC_CANCEL {
                        " (the server cancelled the consumer)"
                    } else {
                        ""
                    };
                    return Err(self.conn.wire.invalid(format!(
                        "unexpected {} on channel {channel}{what}",
                        method_name(id)
                    )));
                }
            }
            (HEADER, CHANNEL, Content::Header) => {
                let mut a = Args::new(f.payload, "content header");
                let (class, _weight, size) = (a.u16()?, a.u16()?, a.u64()?);
                if class != BASIC_DELIVER.0 {
                    return Err(
                        wire.invalid(format!("content header of class {class}, not Basic (60)"))
                    );
                }
                if size > MAX_MESSAGE as u64 {
                    return Err(wire.invalid(format!(
                        "message body of {size} bytes is over the limit of {MAX_MESSAGE}"
                    )));
                }
                self.body.clear();
                self.body.reserve(size as usize);
                if size == 0 {
                    complete = true;
                } else {
                    self.state = Content::Body {
                        remaining: size as usize,
                    };
                }
            }
            (BODY, CHANNEL, Content::Body { remaining }) => {
                if f.payload.len() > remaining {
                    return Err(wire.invalid(format!(
                        "body frame of {} bytes where {remaining} were left of the message",
                        f.payload.len()
                    )));
                }
                self.body.extend_from_slice(f.payload);
                let remaining = remaining - f.payload.len();
                if remaining == 0 {
                    complete = true;
                } else {
                    self.state = Content::Body { remaining };
                }
            }
            (kind, channel, state) => {
                return Err(wire.invalid(format!(
                    "frame of type {kind} on channel {channel} where the delivery is at {state:?}"
                )));
            }
        }
        self.conn.wire.consume(used);
        if complete {
            self.state = Content::Idle;
            std::mem::swap(buf, &mut self.body);
        }
        Ok(Some(complete))
    }
}

impl AsRawFd for Subscriber {
    fn as_raw_fd(&self) -> RawFd {
        self.conn.wire.stream().as_raw_fd()
    }
}

/// Exchange names are short strings.
fn check_name(exchange: &str) -> io::Result<()> {
    if exchange.len() > 255 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "exchange name of {} bytes (AMQP allows 255)",
                exchange.len()
            ),
        ));
    }
    Ok(())
}
