//! A subscriber over `tcp:`, `tls:` or `auto:`: a framed connection to the publisher's
//! fan-out thread ([`super::fanout`]), which forwards the topic's messages as records
//! ([`super::wire`]). An `auto:` subscriber on the publisher's kernel attaches to the
//! shared memory instead, when the publisher offers its rendezvous socket, that socket
//! takes the single-use token the publisher handed us over the network and answers with
//! the proof that goes with it (so it is the publisher we reached, whose TLS identity we
//! checked if TLS is on), and it admits our credentials.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use super::options::{Policy, PubSubOptions};
use super::shm_subscriber::ShmSubscriber;
use super::stats::SubscriberStats;
use super::wire::{self, Record, BATCH_BYTES, FLAG_LOCAL_OK, MAX_CONTROL_RECORD};
use crate::addr::{Address, UnixName};
use crate::error::{Error, ErrorKind, Result};
use crate::options::{Role, MAX_MSG_SIZE_LIMIT};
use crate::sys;
use crate::transport::net::{self, NetConn, UpgradeSocket};
use crate::transport::shm::handshake::Token;

/// What the framed connection of a topic announces as its largest message: a record
/// of the largest message accepted (one kind byte more), and never less than the largest
/// control record or a full batch.
pub(crate) fn framed_max(max_msg: usize) -> usize {
    (max_msg + 1).max(MAX_CONTROL_RECORD).max(BATCH_BYTES)
}

/// How a network subscription ended; every later call reports it again.
struct Ended {
    kind: ErrorKind,
    msg: String,
}

/// A subscriber that receives the topic over a framed connection.
pub(crate) struct NetSubscriber {
    conn: NetConn,
    transport: crate::Transport,
    policy: Policy,
    max_msg: usize,
    /// Position of the next message.
    position: u64,
    received: u64,
    missed: u64,
    nonblocking: bool,
    recv_timeout: Option<Duration>,
    ended: Option<Ended>,
    /// The message `recv_ref` lends (copied out of the connection).
    lent: Vec<u8>,
    /// The current message: its start and length in the connection's current record.
    msg: (usize, usize),
    /// In a `Batch` record: where its next entry starts.
    batch_next: Option<usize>,
    addr: String,
}

/// What [`connect`] found: the publisher over the network, or, for `auto:`, its
/// shared memory.
pub(crate) enum Connected {
    Net(NetSubscriber),
    Shm(ShmSubscriber),
}

/// Subscribes to the topic at `parsed` (`tcp:`, `tls:` or `auto:`).
pub(crate) fn connect(parsed: &Address, addr: &str, opts: &PubSubOptions) -> Result<Connected> {
    let outer = net::outer(parsed, &opts.base).expect("called for network addresses only");
    let is_auto = outer.is_auto;
    let deadline = Instant::now() + opts.base.connect_timeout;
    let accept = opts.max_msg_size.unwrap_or(MAX_MSG_SIZE_LIMIT);
    let mut base = opts.base.clone().max_msg_size(framed_max(accept));
    base.role = Role::Topic;
    let mut conn = outer.connect(&base)?;
    let boot_id = if is_auto { net::boot_id() } else { Vec::new() };
    let mut flags = if is_auto && !boot_id.is_empty() {
        FLAG_LOCAL_OK
    } else {
        0
    };
    loop {
        let request = Record::Subscribe {
            version: wire::VERSION,
            flags,
            history: opts.subscriber_history(),
            max_msg: opts.max_msg_size.unwrap_or(0) as u64,
            boot_id: &boot_id,
        };
        conn.send(&request.encode(), true)?;
        wait_readable(&mut conn, deadline)?;
        let answer = Record::parse(conn.current(), usize::MAX);
        let next = match answer {
            Ok(Record::Welcome {
                policy,
                max_msg,
                start,
            }) => {
                let policy = if policy == wire::POLICY_BLOCK {
                    Policy::Block
                } else {
                    Policy::Overwrite
                };
                let max_msg = max_msg as usize;
                if max_msg > accept || conn.max_send_size() < max_msg + 1 {
                    return Err(Error::violation(format!(
                        "publisher welcomed us for messages up to {max_msg} bytes, we accept at most {accept}"
                    )));
                }
                conn.release();
                return Ok(Connected::Net(NetSubscriber {
                    transport: outer.transport(),
                    conn,
                    policy,
                    max_msg,
                    position: start,
                    received: 0,
                    missed: 0,
                    nonblocking: false,
                    recv_timeout: opts.recv_timeout,
                    ended: None,
                    lent: Vec::new(),
                    msg: (0, 0),
                    batch_next: None,
                    addr: addr.to_string(),
                }));
            }
            Ok(Record::Refuse { code, reason }) => {
                return Err(Error::new(code.kind(), format!("refused: {reason}")))
            }
            Ok(Record::Local {
                token,
                proof,
                name,
                path,
            }) if flags & FLAG_LOCAL_OK != 0 => {
                Some((token, proof, name.to_string(), path.to_string()))
            }
            Ok(other) => {
                return Err(Error::violation(format!(
                    "publisher answered the subscription with {other:?}"
                )))
            }
            Err(e) => return Err(e),
        };
        conn.release();
        if let Some((token, proof, name, path)) = next {
            if let Some(sub) = attach_local(&name, &path, token, proof, opts) {
                // The publisher drops the connection when it ends without a request.
                let _ = conn.close(false);
                return Ok(Connected::Shm(sub));
            }
            flags &= !FLAG_LOCAL_OK;
        }
    }
}

/// Waits for the next record of the handshake, until `deadline`.
fn wait_readable(conn: &mut NetConn, deadline: Instant) -> Result<()> {
    loop {
        match conn.recv_next(false) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let ready = sys::poll_fd(conn.fd(), sys::Interest::READABLE, Some(deadline))
                    .map_err(|e| Error::io("wait for the publisher's answer", e))?;
                if !ready {
                    return Err(Error::new(
                        ErrorKind::TimedOut,
                        "publisher did not answer the subscription within the connect timeout",
                    ));
                }
            }
            Err(e) if e.kind() == ErrorKind::EndOfStream => {
                return Err(Error::new(
                    ErrorKind::ConnectionRefused,
                    "publisher closed the connection during the subscription",
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

/// Tries the topic's rendezvous socket where this process finds it: under its own
/// rendezvous directory (a shared directory may be mounted elsewhere), then at the
/// publisher's path. We present `token` there and take only a socket that answers with
/// `proof`; the socket checks our credentials like any `shm:` subscriber's. The token is
/// single-use: once a socket took it, a later one refuses it.
fn attach_local(
    name: &str,
    path: &str,
    token: Token,
    proof: Token,
    opts: &PubSubOptions,
) -> Option<ShmSubscriber> {
    UpgradeSocket::candidates(name, path)
        .into_iter()
        .find_map(|p| {
            let text = format!("{}", p.display());
            let parsed = Address::Shm {
                socket: UnixName::Path(p),
                text: text.clone(),
            };
            ShmSubscriber::connect_upgrade(&parsed, &format!("shm:{text}"), token, proof, opts).ok()
        })
}

impl NetSubscriber {
    /// Remembers how the subscription ended.
    fn end(&mut self, e: Error) -> Error {
        if self.ended.is_none() {
            self.ended = Some(Ended {
                kind: e.kind(),
                msg: e.message().to_string(),
            });
        }
        e
    }

    /// Makes the next message current (of a batch, or the next data record) and
    /// returns its length; reports losses, detachment and the end of the stream.
    fn next(&mut self) -> Result<usize> {
        if let Some(at) = self.batch_next {
            // The record was checked whole when it arrived, and `consume` releases it
            // after its last message: an entry is always there.
            let Some(msg) = wire::batch_entry(self.conn.current(), at) else {
                self.batch_next = None;
                self.conn.release();
                let e = Error::violation(format!("{}: batch record ended early", self.addr));
                return Err(self.end(e));
            };
            self.msg = msg;
            return Ok(msg.1);
        }
        if let Some(end) = &self.ended {
            return Err(Error::new(end.kind, end.msg.clone()));
        }
        let e = match self.recv_record() {
            Ok(_) => match Record::parse(self.conn.current(), self.max_msg) {
                Ok(Record::Data(msg)) => {
                    self.msg = (1, msg.len());
                    return Ok(msg.len());
                }
                Ok(Record::Batch(_)) => {
                    self.batch_next = Some(1);
                    return self.next();
                }
                Ok(Record::Missed(n)) if self.policy == Policy::Overwrite => {
                    self.conn.release();
                    self.position += n;
                    self.missed += n;
                    return Err(Error::lagged(n, &self.addr));
                }
                Ok(Record::Detached) if self.policy == Policy::Block => Error::new(
                    ErrorKind::Detached,
                    format!(
                        "{}: the publisher detached this subscriber (the publisher waited for it, and within the stall timeout it did not read what was published when the wait began); subscribe again to resume",
                        self.addr
                    ),
                ),
                Ok(other) => Error::violation(format!(
                    "{}: unexpected record {other:?} under the {:?} policy",
                    self.addr, self.policy
                )),
                Err(e) => e.context(format_args!("{}", self.addr)),
            },
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Err(e),
            Err(e) if e.kind() == ErrorKind::TimedOut && self.recv_timeout.is_some() => {
                return Err(e)
            }
            Err(e) => e,
        };
        self.conn.release();
        Err(self.end(e))
    }

    /// The connection's next record; a blocking wait ends at the receive timeout.
    fn recv_record(&mut self) -> Result<usize> {
        let Some(t) = self.recv_timeout.filter(|_| !self.nonblocking) else {
            return self.conn.recv_next(!self.nonblocking);
        };
        let deadline = Instant::now() + t;
        loop {
            match self.conn.recv_next(false) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let ready =
                        sys::poll_fd(self.conn.fd(), sys::Interest::READABLE, Some(deadline))
                            .map_err(|e| Error::io(format!("{}: poll", self.addr), e))?;
                    if !ready {
                        return Err(super::timed_out(&self.addr));
                    }
                }
                r => return r,
            }
        }
    }

    /// The current message.
    fn current(&self) -> &[u8] {
        let (start, len) = self.msg;
        &self.conn.current()[start..start + len]
    }

    /// Consumes the current message, and its record once it has no more.
    fn consume(&mut self) {
        let end = self.msg.0 + self.msg.1;
        self.batch_next = if end < self.conn.current().len() {
            Some(end)
        } else {
            self.conn.release();
            None
        };
        self.position += 1;
        self.received += 1;
    }

    pub(crate) fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        let len = self.next()?;
        if len > buf.len() {
            return Err(Error::new(
                ErrorKind::MessageTooLarge,
                format!(
                    "message of {len} bytes does not fit the {}-byte buffer (still queued)",
                    buf.len()
                ),
            ));
        }
        buf[..len].copy_from_slice(self.current());
        self.consume();
        Ok(len)
    }

    pub(crate) fn recv_vec(&mut self) -> Result<Vec<u8>> {
        self.next()?;
        let v = self.current().to_vec();
        self.consume();
        Ok(v)
    }

    /// The next message, copied into a buffer the subscriber keeps; returns its
    /// position.
    pub(crate) fn recv_lent(&mut self) -> Result<(&[u8], u64)> {
        self.next()?;
        let mut lent = std::mem::take(&mut self.lent);
        lent.clear();
        lent.extend_from_slice(self.current());
        self.lent = lent;
        let at = self.position;
        self.consume();
        Ok((&self.lent, at))
    }

    pub(crate) fn set_nonblocking(&mut self, nonblocking: bool) {
        self.nonblocking = nonblocking;
    }

    pub(crate) fn is_nonblocking(&self) -> bool {
        self.nonblocking
    }

    /// Counters. The lag is not known over the network: 0.
    pub(crate) fn stats(&self) -> SubscriberStats {
        SubscriberStats {
            received: self.received,
            missed: self.missed,
            lag: 0,
        }
    }

    pub(crate) fn policy(&self) -> Policy {
        self.policy
    }

    pub(crate) fn max_msg_size(&self) -> usize {
        self.max_msg
    }

    pub(crate) fn position(&self) -> u64 {
        self.position
    }

    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    pub(crate) fn transport(&self) -> crate::Transport {
        self.transport
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.conn.fd()
    }
}

impl Drop for NetSubscriber {
    fn drop(&mut self) {
        let _ = self.conn.close(false);
    }
}
