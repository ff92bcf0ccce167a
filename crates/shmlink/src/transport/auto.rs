//! The `auto:` transport: TCP that becomes shared memory when both ends share a kernel
//! (docs/design.md §5.3, the XWAY idea of one address for local and remote peers).
//!
//! A client connects over `tcp:` (`tls:` when the options carry TLS settings: then the
//! negotiation, token and proof included, is encrypted and both ends authenticated as
//! TLS configures) and the two ends exchange a few messages on that connection before
//! the application sees it:
//!
//! ```text
//! client                                      listener
//!   Hello(boot id)                       ─▶   same boot id and an upgrade socket?
//!                                        ◀─   Offer(token, proof, socket name, path)
//!                                             or NoOffer(reason) → stays on TCP
//!   connect to the upgrade socket (Unix)
//!   Upgrade(params, token)      ─ unix ─▶     token known? credentials allowed?
//!     + client's memfd                        then the client's segment
//!                               ◀─ unix ─     Upgraded(params, proof) + memfd
//!   proof right? → Decision(upgraded)    ─▶   hands out the shm connection
//!   otherwise    → Decision(stay)        ─▶   hands out the TCP connection
//! ```
//!
//! The client alone decides, after it knows whether the upgrade worked, and says so on the
//! TCP connection, which both ends read in order: the listener never guesses, so the two
//! ends cannot end up on different paths (an `Upgraded` the client did not take is
//! dropped with the client's `Decision(stay)`). The token is single-use and names the TCP
//! connection to the listener; the proof, which never travels over the Unix socket,
//! shows the client that the listener behind the socket is the one it reached over TCP,
//! so a socket of another server at the same path (another container's directory, a
//! replayed token) is never taken. The boot id (`/proc/sys/kernel/random/boot_id`) tells
//! whether both ends share a kernel; reaching the socket tells whether they share the
//! rendezvous directory. Everything else stays on TCP: another host, a container without
//! the shared directory, a uid the listener does not allow.
//!
//! **Resumption**: the `Offer` also carries a single-use ticket and its proof (unless the
//! listener has TLS settings or [`Options::auto_resume`] off). A client whose upgrade
//! succeeded keeps them ([`held`]), and its next connect to the same address presents the
//! ticket at the upgrade socket that served it (`Resume`, see `shm::handshake`), without
//! TCP; the answer carries the ticket's proof, checked like the upgrade's, and the next
//! ticket. A refused ticket sends the connect back to the negotiation above.
//!
//! **Across virtual machines** (docs/vms.md): when `$SHMLINK_AUTO_VM` names a `vm:`
//! region (see [`vm::auto_region`]), the client's hello is a `HelloVm` that also carries
//! the region's id (128 random bits in the region's header, the same for every guest and
//! the host that map it), and the listener, which binds a `vm:` listener of its own in its
//! region, answers a client on another kernel whose id matches its own with a `VmOffer`:
//!
//! ```text
//! client                                      listener
//!   HelloVm(boot id, region id)          ─▶   same kernel? → Offer as above
//!                                             same region id? →
//!                                        ◀─   VmOffer(token, proof, listener name)
//!   vm: connect to the name in the region
//!   token                        ─ vm ─▶      token offered on a TCP connection?
//!                                ◀─ vm ─      proof
//!   proof right? → Decision(upgraded)    ─▶   hands out the vm: connection
//!   otherwise    → Decision(stay)        ─▶   hands out the TCP connection
//! ```
//!
//! The token ties the `vm:` connection to this TCP connection (single-use, it travels
//! over TCP first); the proof, sent only on the `vm:` connection that presented the
//! token, shows the client that it reached the listener it talks to over TCP. A third
//! guest on the region that races the client with the token (every guest can read the
//! region) gets at most a connection the listener discards: the real client then misses
//! its proof and both ends stay on TCP.
//!
//! A region carries plaintext that every guest mapping it can read, so an end with TLS
//! settings neither asks for nor offers the `vm:` upgrade unless the region is declared
//! private to the two ends (`Options::vm_region_private`, `$SHMLINK_AUTO_VM_PRIVATE=1`):
//! it stays on TLS. (TLS to `shm:` stays allowed: sealed memfds only the two hold.)

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use super::local::{boot_id, same_kernel, UpgradeSocket, MAX_BOOT_ID, MAX_NAME, MAX_PATH};
use super::shm::handshake::{Token, TOKEN_LEN};
use super::shm::{self, ShmListener};
use super::vm;
use crate::addr::Address;
use crate::error::{Error, ErrorKind, Result};
use crate::options::{Options, WaitPolicy};
use crate::sys::stream::EventFlag;
use crate::sys::{self, Epoll, Event, Interest, TimerFd};
use crate::transport::{net, Accepted, ConnOps, ListenerOps, Transport};
use std::path::{Path, PathBuf};

/// The `auto:` entry in the transport registry.
pub(crate) const TRANSPORT: Transport = Transport {
    name: "auto",
    connect,
    bind,
};

/// Every negotiation message starts with this and [`VERSION`].
const MAGIC: &[u8; 8] = b"SHMLAUTO";
/// 2: the `Offer` carries a resumption ticket.
const VERSION: u16 = 2;
const PREFIX: usize = MAGIC.len() + 4;
const KIND_HELLO: u16 = 1;
const KIND_OFFER: u16 = 2;
const KIND_NO_OFFER: u16 = 3;
const KIND_DECISION: u16 = 4;
const KIND_HELLO_VM: u16 = 5;
const KIND_VM_OFFER: u16 = 6;
/// Bytes of a `vm:` region id.
const REGION_ID_LEN: usize = vm::region::ID_LEN;
/// Longest reason accepted (the other fields' limits are the local upgrade's).
const MAX_REASON: usize = 256;

/// Most connections a listener keeps in negotiation; beyond that the oldest is dropped.
const MAX_DECIDING: usize = 128;
const TOKEN_TCP: u64 = 0;
const TOKEN_SHM: u64 = 1;
const TOKEN_READY: u64 = 2;
const TOKEN_TIMER: u64 = 3;
const TOKEN_VM: u64 = 4;

/// A negotiation message, carried as one message of the TCP connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// Client → listener: the client's kernel boot id (empty if unknown).
    Hello {
        /// `/proc/sys/kernel/random/boot_id`, trimmed.
        boot_id: Vec<u8>,
    },
    /// Client → listener: the client's boot id and the id of the `vm:` region it maps
    /// (`$SHMLINK_AUTO_VM`).
    HelloVm {
        /// `/proc/sys/kernel/random/boot_id`, trimmed (empty with `$SHMLINK_AUTO_SHM=0`).
        boot_id: Vec<u8>,
        /// The region's id (its header's 128 random bits).
        region: [u8; REGION_ID_LEN],
    },
    /// Listener → client: upgrade through the `vm:` region both map.
    VmOffer {
        /// Names this TCP connection on the `vm:` listener; single-use.
        token: Token,
        /// What the `vm:` listener answers to the token.
        proof: Token,
        /// The `vm:` listener's name in the region.
        name: String,
    },
    /// Listener → client: where to upgrade, and with what.
    Offer {
        /// Names this TCP connection on the upgrade socket; single-use.
        token: Token,
        /// What the upgrade socket answers, so the client knows it is this listener.
        proof: Token,
        /// File name of the upgrade socket in the rendezvous directory.
        name: String,
        /// Its absolute path as the listener sees it.
        path: String,
        /// A resumption ticket and its proof for the client's next connect, if the
        /// listener issues them (docs/design.md §5.3).
        ticket: Option<(Token, Token)>,
    },
    /// Listener → client: stay on TCP, and why.
    NoOffer {
        /// Why not (another kernel, no upgrade socket, …).
        reason: String,
    },
    /// Client → listener: whether the client took the upgrade.
    Decision {
        /// `true`: continue on shared memory; `false`: stay on TCP.
        upgraded: bool,
    },
}

impl Msg {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&VERSION.to_le_bytes());
        let put = |out: &mut Vec<u8>, bytes: &[u8]| {
            out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
            out.extend_from_slice(bytes);
        };
        match self {
            Msg::Hello { boot_id } => {
                out.extend_from_slice(&KIND_HELLO.to_le_bytes());
                put(&mut out, boot_id);
            }
            Msg::Offer {
                token,
                proof,
                name,
                path,
                ticket,
            } => {
                out.extend_from_slice(&KIND_OFFER.to_le_bytes());
                out.extend_from_slice(token);
                out.extend_from_slice(proof);
                put(&mut out, name.as_bytes());
                put(&mut out, path.as_bytes());
                match ticket {
                    None => out.push(0),
                    Some((ticket, proof)) => {
                        out.push(1);
                        out.extend_from_slice(ticket);
                        out.extend_from_slice(proof);
                    }
                }
            }
            Msg::HelloVm { boot_id, region } => {
                out.extend_from_slice(&KIND_HELLO_VM.to_le_bytes());
                put(&mut out, boot_id);
                out.extend_from_slice(region);
            }
            Msg::VmOffer { token, proof, name } => {
                out.extend_from_slice(&KIND_VM_OFFER.to_le_bytes());
                out.extend_from_slice(token);
                out.extend_from_slice(proof);
                put(&mut out, name.as_bytes());
            }
            Msg::NoOffer { reason } => {
                out.extend_from_slice(&KIND_NO_OFFER.to_le_bytes());
                put(&mut out, reason.as_bytes());
            }
            Msg::Decision { upgraded } => {
                out.extend_from_slice(&KIND_DECISION.to_le_bytes());
                out.push(u8::from(*upgraded));
            }
        }
        out
    }

    /// Parses a message from an untrusted peer: every length checked, nothing left over.
    pub fn decode(bytes: &[u8]) -> Result<Msg> {
        let bad = |why: String| Error::violation(format!("auto: negotiation: {why}"));
        if bytes.len() < PREFIX || &bytes[..MAGIC.len()] != MAGIC {
            return Err(bad(
                "not an auto: message (is the peer an auto: endpoint?)".into()
            ));
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != VERSION {
            return Err(Error::new(
                ErrorKind::VersionMismatch,
                format!("auto: peer speaks version {version}, this side speaks {VERSION}"),
            ));
        }
        let kind = u16::from_le_bytes([bytes[10], bytes[11]]);
        let mut r = Reader(&bytes[PREFIX..]);
        let msg = match kind {
            KIND_HELLO => Msg::Hello {
                boot_id: r.field(MAX_BOOT_ID, "boot id")?,
            },
            KIND_OFFER => Msg::Offer {
                token: r.token("token")?,
                proof: r.token("proof")?,
                name: r.text(MAX_NAME, "socket name")?,
                path: r.text(MAX_PATH, "socket path")?,
                ticket: match r.take(1, "ticket flag")?[0] {
                    0 => None,
                    1 => Some((r.token("ticket")?, r.token("ticket proof")?)),
                    v => return Err(bad(format!("ticket flag {v} (expected 0 or 1)"))),
                },
            },
            KIND_HELLO_VM => Msg::HelloVm {
                boot_id: r.field(MAX_BOOT_ID, "boot id")?,
                region: r.token("region id")?,
            },
            KIND_VM_OFFER => Msg::VmOffer {
                token: r.token("token")?,
                proof: r.token("proof")?,
                name: r.text(vm::slot::L_NAME_MAX, "vm: listener name")?,
            },
            KIND_NO_OFFER => Msg::NoOffer {
                reason: r.text(MAX_REASON, "reason")?,
            },
            KIND_DECISION => match r.take(1, "decision")?[0] {
                0 => Msg::Decision { upgraded: false },
                1 => Msg::Decision { upgraded: true },
                v => return Err(bad(format!("decision {v} (expected 0 or 1)"))),
            },
            k => return Err(bad(format!("unknown message kind {k}"))),
        };
        let rest = r.0;
        if !rest.is_empty() {
            return Err(bad(format!("{} bytes after the message", rest.len())));
        }
        Ok(msg)
    }
}

/// Takes fields off the front of an untrusted message.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(Error::violation(format!(
                "auto: negotiation: truncated {what}"
            )));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn token(&mut self, what: &str) -> Result<Token> {
        Ok(self
            .take(TOKEN_LEN, what)?
            .try_into()
            .expect("TOKEN_LEN bytes"))
    }

    /// A `u16` length, then that many bytes (at most `max`).
    fn field(&mut self, max: usize, what: &str) -> Result<Vec<u8>> {
        let len = self.take(2, what)?;
        let len = u16::from_le_bytes([len[0], len[1]]) as usize;
        if len > max {
            return Err(Error::violation(format!(
                "auto: negotiation: {what} of {len} bytes (at most {max})"
            )));
        }
        Ok(self.take(len, what)?.to_vec())
    }

    fn text(&mut self, max: usize, what: &str) -> Result<String> {
        String::from_utf8(self.field(max, what)?)
            .map_err(|_| Error::violation(format!("auto: negotiation: {what} is not UTF-8")))
    }
}

/// What an `auto:` address runs over until it is upgraded: `tls:` when TLS options are
/// set, else `tcp:` (the same rule as an `auto:` topic's, see [`net::outer`]).
fn outer(addr: &Address, opts: &Options) -> (Address, &'static Transport) {
    let outer = net::outer(addr, opts)
        .filter(|o| o.is_auto)
        .expect("the registry only hands auto: addresses to the auto transport");
    (outer.addr.clone(), outer.entry())
}

/// Sends one negotiation message.
fn send_msg(conn: &mut dyn ConnOps, msg: &Msg) -> Result<()> {
    conn.send(&msg.encode(), true)
}

/// Receives one negotiation message, waiting until `deadline` as `policy` says.
fn recv_msg(conn: &mut dyn ConnOps, policy: &WaitPolicy, deadline: Instant) -> Result<Msg> {
    Msg::decode(&recv_bytes(conn, policy, deadline)?)
}

/// Receives one message on any transport: polls for `policy`'s spin and yield budget
/// (the listener answers within tens of microseconds, and a client that sleeps meanwhile
/// pays a cross-CPU wake-up), then waits on its fd until `deadline`.
fn recv_bytes(conn: &mut dyn ConnOps, policy: &WaitPolicy, deadline: Instant) -> Result<Vec<u8>> {
    let mut early = None;
    let policy = crate::notify::setup_policy(policy);
    crate::notify::spin_then_yield(&policy, || match conn.recv_next(false) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
        other => {
            early = Some(other);
            Ok(true)
        }
    })?;
    if let Some(got) = early {
        got?;
        return Ok(conn.take_current());
    }
    loop {
        match conn.recv_next(false) {
            Ok(_) => return Ok(conn.take_current()),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let ready = sys::poll_fd(conn.fd(), Interest::READABLE, Some(deadline))
                    .map_err(|e| Error::io("wait for the auto: negotiation", e))?;
                if !ready {
                    return Err(Error::new(
                        ErrorKind::TimedOut,
                        "listener did not answer the auto: negotiation",
                    ));
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// The boot id this process announces: empty with `$SHMLINK_AUTO_SHM=0` (then no
/// listener offers the same-kernel upgrade: for testing `vm:` upgrades on one host).
fn hello_boot_id() -> Vec<u8> {
    match std::env::var("SHMLINK_AUTO_SHM").as_deref() {
        Ok("0") => Vec::new(),
        _ => boot_id(),
    }
}

/// Whether moving this `auto:` end to `vm:` would drop TLS it was asked for: TLS options
/// are set and the region is not declared private to the two ends
/// ([`Options::vm_region_private`] or `$SHMLINK_AUTO_VM_PRIVATE=1`). A region carries
/// plaintext that every guest mapping it and every host process that can open its file
/// reads, so such an end neither asks for nor offers the `vm:` upgrade.
fn vm_would_drop_tls(opts: &Options) -> bool {
    let tls = *opts.configured_tls() != crate::options::TlsOptions::default();
    let private =
        opts.vm_region_private || std::env::var("SHMLINK_AUTO_VM_PRIVATE").is_ok_and(|v| v == "1");
    tls && !private
}

/// The `vm:` region this process offers (`$SHMLINK_AUTO_VM`) and its id, if it has one
/// and it can be mapped; otherwise the client asks for the same-kernel upgrade only.
fn client_region(opts: &Options) -> Option<(PathBuf, [u8; REGION_ID_LEN])> {
    if vm_would_drop_tls(opts) {
        return None;
    }
    let path = vm::auto_region()?.ok()?;
    let id = vm::region_id(&path, opts).ok()?;
    Some((path, id))
}

/// Whether `auto:` ends with these options issue and use resumption tickets:
/// [`Options::auto_resume`] and no TLS settings.
fn resumes(opts: &Options) -> bool {
    opts.auto_resume && *opts.configured_tls() == crate::options::TlsOptions::default()
}

/// The resumption tickets this process holds, per `auto:` address (design §5.3).
mod held {
    use std::path::PathBuf;
    use std::sync::Mutex;
    use std::time::Instant;

    use crate::transport::shm::handshake::Token;
    use crate::transport::shm::tickets::LIFETIME;

    /// Most tickets kept for one address (one per connection open at once is enough).
    const PER_ADDRESS: usize = 8;
    /// Most addresses tickets are kept for.
    const ADDRESSES: usize = 64;

    /// A ticket for the listener behind `socket`.
    pub(super) struct Ticket {
        pub socket: PathBuf,
        pub ticket: Token,
        pub proof: Token,
        /// When the listener forgets it.
        until: Instant,
    }

    /// Address → tickets, newest last.
    static HELD: Mutex<Vec<(String, Vec<Ticket>)>> = Mutex::new(Vec::new());

    /// Keeps a ticket just received for `addr`.
    pub(super) fn put(addr: &str, socket: PathBuf, (ticket, proof): (Token, Token)) {
        // A little before the listener's lifetime ends: a ticket used at the last moment
        // would only cost a refusal.
        let until = Instant::now() + LIFETIME - LIFETIME / 10;
        let t = Ticket {
            socket,
            ticket,
            proof,
            until,
        };
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        match held.iter_mut().find(|(a, _)| a == addr) {
            Some((_, list)) => {
                if list.len() >= PER_ADDRESS {
                    list.remove(0);
                }
                list.push(t);
            }
            None => {
                if held.len() >= ADDRESSES {
                    held.remove(0);
                }
                held.push((addr.to_string(), vec![t]));
            }
        }
    }

    /// Takes the newest live ticket for `addr`.
    pub(super) fn take(addr: &str) -> Option<Ticket> {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        let (_, list) = held.iter_mut().find(|(a, _)| a == addr)?;
        let now = Instant::now();
        list.retain(|t| t.until > now);
        list.pop()
    }

    /// Drops every ticket for `addr` (its listener refused one, or is gone).
    pub(super) fn forget(addr: &str) {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|(a, _)| a != addr);
    }
}

/// A connect with a resumption ticket held for `addr`: straight to the upgrade socket
/// that issued it, no TCP. `None` when there is no ticket or the listener refuses it
/// (then every ticket for `addr` is dropped, and the caller negotiates over TCP); a
/// listener that took the connection and never answered is the connect's timeout.
fn resume(addr: &str, opts: &Options, deadline: Instant) -> Result<Option<Box<dyn ConnOps>>> {
    let Some(t) = held::take(addr) else {
        return Ok(None);
    };
    let ask = shm::Ask::Resume(t.ticket, t.proof);
    match shm::connect_upgrade(&t.socket, opts, ask, deadline) {
        Ok((conn, next)) => {
            if let Some(next) = next {
                held::put(addr, t.socket, next);
            }
            Ok(Some(conn))
        }
        Err(e) if e.kind() == ErrorKind::TimedOut => Err(e),
        Err(_e) => {
            crate::trace::event!(
                debug,
                addr = %addr,
                reason = %_e,
                "auto: resumption refused, negotiating over TCP"
            );
            held::forget(addr);
            Ok(None)
        }
    }
}

fn connect(addr: &Address, opts: &Options) -> Result<Box<dyn ConnOps>> {
    let deadline = Instant::now() + opts.connect_timeout;
    let resumable = resumes(opts);
    let key = addr.to_string();
    if resumable {
        if let Some(conn) = resume(&key, opts, deadline)? {
            return Ok(conn);
        }
    }
    let (outer_addr, transport) = outer(addr, opts);
    let region = client_region(opts);
    let hello = match &region {
        Some((_, id)) => Msg::HelloVm {
            boot_id: hello_boot_id(),
            region: *id,
        },
        None => Msg::Hello {
            boot_id: hello_boot_id(),
        },
    };
    // The hello rides right behind the framed hello, one round trip fewer: the listener
    // reads exactly a hello's bytes (after the TLS handshake on `tls:`), then this
    // message as the connection's first.
    let connect_with = if transport.name == super::tls::TRANSPORT.name {
        super::tls::connect_with
    } else {
        super::tcp::connect_with
    };
    let mut conn = connect_with(&outer_addr, opts, Some(&hello.encode()))?;
    match recv_msg(&mut *conn, &opts.wait, deadline)? {
        Msg::NoOffer { .. } => Ok(conn),
        Msg::VmOffer { token, proof, name } => {
            let Some((path, _)) = &region else {
                return Err(Error::violation(
                    "auto: listener offered a vm: upgrade the client did not ask for",
                ));
            };
            let upgraded = upgrade_vm(&name, path, opts, token, proof, deadline);
            send_msg(
                &mut *conn,
                &Msg::Decision {
                    upgraded: upgraded.is_ok(),
                },
            )?;
            match upgraded {
                Ok(vm) => {
                    let _ = conn.close(false);
                    Ok(vm)
                }
                Err(_e) => {
                    crate::trace::event!(
                        info,
                        peer = %conn.peer_addr(),
                        reason = %_e,
                        "auto: vm: upgrade failed, staying on TCP"
                    );
                    Ok(conn)
                }
            }
        }
        Msg::Offer {
            token,
            proof,
            name,
            path,
            ticket,
        } => {
            let upgraded = upgrade(&name, &path, opts, token, proof, deadline);
            send_msg(
                &mut *conn,
                &Msg::Decision {
                    upgraded: upgraded.is_ok(),
                },
            )?;
            match upgraded {
                Ok((shm, socket)) => {
                    if let (true, Some(ticket)) = (resumable, ticket) {
                        held::put(&key, socket, ticket);
                    }
                    // Dropped without a FIN frame: the listener reads nothing after the
                    // decision (it hands out the shm: connection and drops its end), so
                    // the frame would cost a TCP send here and, arriving with the
                    // decision, a wake-up flag there. The decision went out whole
                    // (blocking send) before the socket closes.
                    drop(conn);
                    Ok(shm)
                }
                Err(_) => Ok(conn),
            }
        }
        other => Err(Error::violation(format!(
            "auto: listener answered the hello with {other:?}"
        ))),
    }
}

/// Tries the upgrade socket where this process finds it: under its own rendezvous
/// directory (a directory shared between containers may be mounted elsewhere), then at
/// the listener's path. Returns the connection and the socket's path that served it.
fn upgrade(
    name: &str,
    path: &str,
    opts: &Options,
    token: Token,
    proof: Token,
    deadline: Instant,
) -> Result<(Box<dyn ConnOps>, PathBuf)> {
    let tried = UpgradeSocket::candidates(name, path);
    let mut last = Error::new(
        ErrorKind::ConnectionRefused,
        "auto: listener offered no usable socket",
    );
    for p in tried {
        match shm::connect_upgrade(&p, opts, shm::Ask::Upgrade(token, proof), deadline) {
            Ok((conn, _)) => return Ok((conn, p)),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Connects to the `vm:` listener `name` in the region at `path`, presents `token` and
/// checks that the answer is `proof`.
fn upgrade_vm(
    name: &str,
    path: &Path,
    opts: &Options,
    token: Token,
    proof: Token,
    deadline: Instant,
) -> Result<Box<dyn ConnOps>> {
    let mut o = opts.clone();
    o.connect_timeout = deadline.saturating_duration_since(Instant::now());
    let mut conn = (vm::TRANSPORT.connect)(&vm::address(name, path), &o)?;
    conn.send(&token, true)?;
    let answer = recv_bytes(&mut *conn, &opts.wait, deadline)?;
    if answer[..] != proof[..] {
        let _ = conn.close(false);
        return Err(Error::violation(
            "auto: the vm: listener did not prove it is the listener reached over TCP",
        ));
    }
    Ok(conn)
}

/// The `vm:` side of an `auto:` listener: its own `vm:` listener in the region
/// `$SHMLINK_AUTO_VM` names, and the `vm:` connections that have not presented a token.
struct VmSide {
    listener: Box<dyn ListenerOps>,
    id: [u8; REGION_ID_LEN],
    name: String,
    /// Connections waiting for their first message (the token), until their deadline.
    pending: Vec<(Box<dyn ConnOps>, Instant)>,
}

/// Binds the `vm:` listener of an `auto:` listener on `port` in the region at `path`.
fn bind_vm(path: &Path, port: &str, opts: &Options) -> Result<VmSide> {
    let id = vm::region_id(path, opts)?;
    let r = super::shm::handshake::random_token()?;
    let tag = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
    let name = format!("auto-{port}-{tag:016x}");
    let listener = (vm::TRANSPORT.bind)(&vm::address(&name, path), opts)?;
    Ok(VmSide {
        listener,
        id,
        name,
        pending: Vec::new(),
    })
}

/// A TCP connection in negotiation on the listener's side.
struct Deciding {
    conn: Box<dyn ConnOps>,
    deadline: Instant,
    /// The token offered, once the hello has been answered with an offer.
    offer: Option<Token>,
    /// The proof for a `vm:` offer (then `offer` holds its token), until a `vm:`
    /// connection presents the token.
    vm_proof: Option<Token>,
    /// The shm (or `vm:`) connection set up with that token, waiting for the client's
    /// decision.
    shm: Option<Accepted>,
    /// The client said it upgraded before the upgrade socket's handshake completed here:
    /// its segment, sent before the decision, is still to be read on that socket.
    upgraded: bool,
}

/// What one negotiation step left to do.
enum Step {
    Wait,
    Drop,
    /// Hand out the TCP connection.
    Tcp,
    /// Hand out this shm connection (the TCP connection is closed).
    Shm(Accepted),
}

/// A bound `auto:` listener: a `tcp:` listener, an upgrade socket in the rendezvous
/// directory, and the connections in negotiation.
///
/// The upgrade socket also answers `shmlink ls` for the whole listener: its registry
/// holds the connections upgraded to shared memory (the upgrade socket's own) and those
/// that stayed on TCP (registered here), and names the listener by its `auto:` address.
struct AutoListener {
    tcp: Box<dyn ListenerOps>,
    /// `"tcp"` or `"tls"`.
    outer: &'static str,
    /// `None` when the upgrade socket could not be created (then every client stays on
    /// TCP, told why).
    shm: Option<ShmListener>,
    /// The upgrade socket's name and path.
    upgrade_socket: UpgradeSocket,
    /// Why there is no upgrade socket.
    no_shm: String,
    /// The `vm:` region side, when `$SHMLINK_AUTO_VM` names a usable region.
    vm: Option<VmSide>,
    /// Why there is none.
    no_vm: String,
    boot_id: Vec<u8>,
    /// The listener's fd: the TCP listener, the upgrade socket, every connection in
    /// negotiation, `ready_flag` and `timer`.
    epoll: Epoll,
    /// Set while `ready` holds connections when `accept` returns (not while it runs: a
    /// connection it finds and hands out at once costs no write and read of the flag).
    ready_flag: EventFlag,
    /// Whether `ready_flag` is set.
    ready_set: bool,
    /// Fires at the earliest negotiation deadline, so that an event loop calls `accept`
    /// (which drops the late client) even when nothing else happens.
    timer: TimerFd,
    /// The deadline `timer` is set for (`None`: disarmed).
    armed: Option<Instant>,
    deciding: HashMap<u64, Deciding>,
    next_token: u64,
    ready: VecDeque<Accepted>,
    timeout: Duration,
    /// How a blocking `accept` waits while negotiations are open.
    wait: WaitPolicy,
    /// The TCP connections of upgrades just handed out, closed at the next `accept`: their
    /// close (a FIN through loopback, the connection's descriptors) stays off the path
    /// between the client's decision and the hand-out.
    upgraded_tcp: Vec<Box<dyn ConnOps>>,
    addr: String,
    events: Vec<Event>,
}

fn bind(addr: &Address, opts: &Options) -> Result<Box<dyn ListenerOps>> {
    let (outer_addr, transport) = outer(addr, opts);
    let tcp = (transport.bind)(&outer_addr, opts)?;
    let bound = tcp.local_addr();
    let host_port = bound.split_once(':').map_or(bound.as_str(), |(_, hp)| hp);
    let addr = format!("auto:{host_port}");
    let port = host_port.rsplit(':').next().unwrap_or("0");
    let upgrade_socket = UpgradeSocket::new("auto", port)?;
    // Never in-process: its clients come with a token from the TCP side (an `auto:`
    // client upgrades over the socket), and a plain `shm:` client in this process must not
    // reach it without one.
    let upgrade_opts = opts.clone().in_process(false);
    let (shm, no_shm) = match ShmListener::bind(&upgrade_socket.address(), &upgrade_opts) {
        Ok(mut l) => {
            l.upgrades = Some(HashMap::new());
            l.tickets = resumes(opts).then(Default::default);
            l.registry.set_auto(addr.clone(), bound.clone());
            (Some(l), String::new())
        }
        Err(e) => (None, format!("the listener has no upgrade socket: {e}")),
    };
    let (vm, no_vm) = match vm::auto_region() {
        Some(_) if vm_would_drop_tls(opts) => (
            None,
            "the listener keeps TLS: its vm: region is not declared private to the two ends \
             (Options::vm_region_private, $SHMLINK_AUTO_VM_PRIVATE=1)"
                .to_string(),
        ),
        None => (
            None,
            "the listener offers no vm: region ($SHMLINK_AUTO_VM unset)".to_string(),
        ),
        Some(Err(e)) => (None, format!("the listener has no vm: region: {e}")),
        Some(Ok(path)) => match bind_vm(&path, port, opts) {
            Ok(v) => (Some(v), String::new()),
            Err(e) => (None, format!("the listener has no vm: region: {e}")),
        },
    };
    let ctx = |e| Error::io("create the auto: listener's epoll set", e);
    let epoll = Epoll::new().map_err(ctx)?;
    let ready_flag = EventFlag::new().map_err(ctx)?;
    let timer = TimerFd::new().map_err(ctx)?;
    let watch = |fd: BorrowedFd<'_>, token| {
        epoll.add(fd.as_raw_fd(), Interest::READABLE, sys::Token(token))
    };
    watch(tcp.fd(), TOKEN_TCP).map_err(ctx)?;
    watch(ready_flag.fd(), TOKEN_READY).map_err(ctx)?;
    watch(timer.fd(), TOKEN_TIMER).map_err(ctx)?;
    if let Some(l) = &shm {
        watch(l.fd(), TOKEN_SHM).map_err(ctx)?;
    }
    if let Some(v) = &vm {
        watch(v.listener.fd(), TOKEN_VM).map_err(ctx)?;
    }
    Ok(Box::new(AutoListener {
        tcp,
        outer: transport.name,
        shm,
        upgrade_socket,
        no_shm,
        vm,
        no_vm,
        boot_id: boot_id(),
        epoll,
        ready_flag,
        ready_set: false,
        timer,
        armed: None,
        deciding: HashMap::new(),
        next_token: TOKEN_VM + 1,
        ready: VecDeque::new(),
        timeout: opts.handshake_timeout,
        wait: opts.wait,
        upgraded_tcp: Vec::new(),
        addr,
        events: Vec::new(),
    }))
}

impl AutoListener {
    /// Takes new TCP connections, completed upgrades and negotiation messages, without
    /// blocking.
    fn poll(&mut self) -> Result<()> {
        loop {
            match self.tcp.accept(false) {
                Ok(accepted) => self.start(accepted.conn),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        // Negotiation messages first: a new client's hello came with its connection, and
        // its offer goes out before the upgrade socket and the `vm:` side are looked at.
        let now = Instant::now();
        self.advance_all(now);
        self.poll_vm(now);
        while let Some((came, conn)) = match &mut self.shm {
            Some(l) => l.step()?,
            None => None,
        } {
            let token = match came {
                // A client that resumed with a ticket: no TCP connection to wait for.
                shm::Came::Resume => {
                    self.ready.push_back(conn);
                    continue;
                }
                shm::Came::Upgrade(token) => token,
                shm::Came::Hello => continue,
            };
            let owner = self
                .deciding
                .iter_mut()
                .find(|(_, d)| d.offer == Some(token));
            match owner {
                // Its decision was read before the upgrade socket finished (a client
                // whose segment followed the answer): the connection is ready now.
                Some((&key, d)) if d.upgraded => self.hand_out(key, conn),
                Some((_, d)) => d.shm = Some(conn),
                None => {}
            }
        }
        // Re-arming also clears an expiry that brought us here; a timer already set for
        // the same deadline, still in the future, is left alone (a system call per poll
        // saved: most polls change no deadline).
        let next = self.deciding.values().map(|d| d.deadline).min();
        if next != self.armed || self.armed.is_some_and(|a| a <= now) {
            self.timer
                .set(next.map(|d| d.saturating_duration_since(now)))
                .map_err(|e| Error::io("auto: listener's deadline timer", e))?;
            self.armed = next;
        }
        Ok(())
    }

    /// Hands out the upgraded connection of negotiation `key`.
    fn hand_out(&mut self, key: u64, conn: Accepted) {
        if let Some(d) = self.finish(key) {
            self.upgraded_tcp.push(d.conn);
        }
        self.ready.push_back(conn);
    }

    /// Reads the negotiation messages that have arrived and acts on them; drops the
    /// negotiations past their deadline.
    fn advance_all(&mut self, now: Instant) {
        let keys: Vec<u64> = self.deciding.keys().copied().collect();
        for key in keys {
            let d = self.deciding.get_mut(&key).expect("key from the map");
            let _timed_out = d.deadline <= now;
            let step = if d.deadline <= now {
                Step::Drop
            } else if d.upgraded {
                d.shm.take().map_or(Step::Wait, Step::Shm)
            } else {
                let step = Self::advance(
                    d,
                    &mut self.shm,
                    &self.boot_id,
                    &self.no_shm,
                    &self.upgrade_socket,
                    (&self.vm, &self.no_vm),
                );
                if d.upgraded {
                    // Nothing more is read on the TCP connection, and its end of stream
                    // (the client drops it after deciding) would keep the set readable
                    // while the upgrade socket reads the client's segment.
                    let _ = self.epoll.delete(d.conn.fd().as_raw_fd());
                }
                step
            };
            match step {
                Step::Wait => {}
                Step::Drop => {
                    let _d = self.finish(key);
                    crate::trace::event!(
                        warn,
                        listener = %self.addr,
                        peer = %_d.as_ref().map(|d| d.conn.peer_addr()).unwrap_or_default(),
                        reason = if _timed_out {
                            "the auto: negotiation timed out"
                        } else {
                            "the auto: negotiation failed: the client left, or sent a message \
                             out of order, malformed or not of an auto: client"
                        },
                        "client refused"
                    );
                }
                Step::Tcp => {
                    if let Some(d) = self.finish(key) {
                        let counters = self
                            .shm
                            .as_mut()
                            .map(|l| l.registry.track(self.outer, None, Some(d.conn.peer_addr())));
                        self.ready.push_back(Accepted {
                            conn: d.conn,
                            counters,
                        });
                    }
                }
                Step::Shm(conn) => self.hand_out(key, conn),
            }
        }
    }

    /// A new TCP connection enters negotiation.
    fn start(&mut self, conn: Box<dyn ConnOps>) {
        if self.deciding.len() >= MAX_DECIDING {
            if let Some(&oldest) = self.deciding.keys().min() {
                drop(self.finish(oldest));
            }
        }
        let key = self.next_token;
        self.next_token += 1;
        if self
            .epoll
            .add(conn.fd().as_raw_fd(), Interest::READABLE, sys::Token(key))
            .is_err()
        {
            return; // dropped: the client sees its connection close
        }
        self.deciding.insert(
            key,
            Deciding {
                conn,
                deadline: Instant::now() + self.timeout,
                offer: None,
                vm_proof: None,
                shm: None,
                upgraded: false,
            },
        );
    }

    /// Takes new `vm:` connections and the tokens they present: a connection whose token
    /// was offered on a TCP connection still in negotiation gets the proof and waits
    /// there for the client's decision; any other (an unknown, replayed or late token,
    /// garbage, silence until the handshake timeout) is closed.
    fn poll_vm(&mut self, now: Instant) {
        let Some(v) = &mut self.vm else { return };
        while let Ok(a) = v.listener.accept(false) {
            let _ = self.epoll.add(
                a.conn.fd().as_raw_fd(),
                Interest::READABLE,
                sys::Token(TOKEN_VM),
            );
            v.pending.push((a.conn, now + self.timeout));
            if v.pending.len() > MAX_DECIDING {
                let (old, _) = v.pending.remove(0);
                let _ = self.epoll.delete(old.fd().as_raw_fd());
            }
        }
        let mut i = 0;
        while i < v.pending.len() {
            let (conn, deadline) = &mut v.pending[i];
            let token = match conn.recv_next(false) {
                Ok(_) => Some(conn.take_current()),
                Err(e) if e.kind() == ErrorKind::WouldBlock && *deadline > now => {
                    i += 1;
                    continue;
                }
                Err(_) => None,
            };
            let (mut conn, _) = v.pending.swap_remove(i);
            let _ = self.epoll.delete(conn.fd().as_raw_fd());
            let owner = token.and_then(|t| {
                self.deciding.values_mut().find(|d| {
                    d.vm_proof.is_some()
                        && d.shm.is_none()
                        && d.offer.is_some_and(|o| o[..] == t[..])
                })
            });
            match owner {
                Some(d) => {
                    let proof = d.vm_proof.take().expect("checked above");
                    if conn.send(&proof, true).is_ok() {
                        d.shm = Some(Accepted::untracked(conn));
                    }
                }
                None => {
                    let _ = conn.close(false);
                }
            }
        }
    }

    /// Ends negotiation `key`: forgets its token, stops watching it and returns it.
    fn finish(&mut self, key: u64) -> Option<Deciding> {
        let d = self.deciding.remove(&key)?;
        let _ = self.epoll.delete(d.conn.fd().as_raw_fd());
        if let (Some(token), Some(l)) = (d.offer, &mut self.shm) {
            if let Some(book) = &mut l.upgrades {
                book.remove(&token);
            }
        }
        Some(d)
    }

    /// Reads the next negotiation message of `d`, if it has arrived, and acts on it.
    fn advance(
        d: &mut Deciding,
        shm: &mut Option<ShmListener>,
        boot_id: &[u8],
        no_shm: &str,
        upgrade_socket: &UpgradeSocket,
        (vm, no_vm): (&Option<VmSide>, &str),
    ) -> Step {
        match d.conn.recv_next(false) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Wait,
            Err(_) => return Step::Drop,
        }
        let msg = Msg::decode(d.conn.current_local());
        d.conn.release();
        let (msg, region) = match msg {
            Ok(Msg::HelloVm {
                boot_id: theirs,
                region,
            }) => (Ok(Msg::Hello { boot_id: theirs }), Some(region)),
            other => (other, None),
        };
        match (msg, d.offer) {
            (Ok(Msg::Hello { boot_id: theirs }), None) => {
                let reason = match (same_kernel(boot_id, &theirs), shm) {
                    // Another kernel that maps our vm: region: offer the upgrade there.
                    (Err(_), _) | (Ok(()), None)
                        if region.is_some() && vm.as_ref().map(|v| v.id) == region =>
                    {
                        let v = vm.as_ref().expect("checked above");
                        let Ok((token, proof)) = super::shm::handshake::random_pair() else {
                            return Step::Drop;
                        };
                        let offer = Msg::VmOffer {
                            token,
                            proof,
                            name: v.name.clone(),
                        };
                        if send_msg(&mut *d.conn, &offer).is_err() {
                            return Step::Drop;
                        }
                        d.offer = Some(token);
                        d.vm_proof = Some(proof);
                        return Step::Wait;
                    }
                    (Err(why), _) => match (region, vm) {
                        (None, _) => why.to_string(),
                        (Some(_), None) => format!("{why}; {no_vm}"),
                        (Some(_), Some(_)) => {
                            format!("{why}; the client maps another vm: region")
                        }
                    },
                    (Ok(()), None) => no_shm.to_string(),
                    (Ok(()), Some(l)) => {
                        let Ok(offer) = upgrade_socket.offer() else {
                            return Step::Drop;
                        };
                        let (token, proof) = (offer.token, offer.proof);
                        let offer = Msg::Offer {
                            token,
                            proof,
                            name: offer.name,
                            path: offer.path,
                            ticket: l.tickets.as_mut().and_then(|t| t.issue().ok()),
                        };
                        if send_msg(&mut *d.conn, &offer).is_err() {
                            return Step::Drop;
                        }
                        if let Some(book) = &mut l.upgrades {
                            book.insert(token, proof);
                        }
                        d.offer = Some(token);
                        return Step::Wait;
                    }
                };
                match send_msg(&mut *d.conn, &Msg::NoOffer { reason }) {
                    Ok(()) => Step::Tcp,
                    Err(_) => Step::Drop,
                }
            }
            (Ok(Msg::Decision { upgraded: true }), Some(_)) => match d.shm.take() {
                Some(conn) => Step::Shm(conn),
                // The upgrade socket has not read the client's segment yet (it was sent
                // before this decision, on the other socket): wait for it, at most until
                // the deadline (a client that claims an upgrade it never made is dropped
                // then).
                None => {
                    d.upgraded = true;
                    Step::Wait
                }
            },
            (Ok(Msg::Decision { upgraded: false }), Some(_)) => {
                d.shm = None;
                Step::Tcp
            }
            // Out of order, malformed or not an auto: client: the connection is dropped.
            _ => Step::Drop,
        }
    }
}

impl AutoListener {
    /// Makes `ready_flag` say whether `ready` holds connections.
    fn sync_ready(&mut self) -> Result<()> {
        let want = !self.ready.is_empty();
        if want != self.ready_set {
            match want {
                true => self.ready_flag.set(),
                false => self.ready_flag.clear(),
            }
            .map_err(|e| Error::io("auto: listener", e))?;
            self.ready_set = want;
        }
        Ok(())
    }

    fn accept_inner(&mut self, blocking: bool) -> Result<Accepted> {
        self.upgraded_tcp.clear();
        loop {
            self.poll()?;
            if let Some(conn) = self.ready.pop_front() {
                return Ok(conn);
            }
            // Nothing to hand out: the upgrade socket makes its next answer's segment now,
            // not while a client waits for it.
            if let Some(l) = &mut self.shm {
                l.prepare();
            }
            if !blocking {
                return Err(Error::would_block());
            }
            // A client in negotiation answers within microseconds, and clients that
            // connect back to back come as soon: look for them for the wait policy's
            // budget before sleeping (a sleeping listener pays a cross-CPU wake-up per
            // message of the negotiation and per new client; docs/design.md §5.1b).
            let (epoll, events) = (&self.epoll, &mut self.events);
            let policy = crate::notify::setup_policy(&self.wait);
            let woke = crate::notify::spin_then_yield(&policy, || {
                epoll
                    .wait(Some(Instant::now()), events)
                    .map_err(|e| Error::io("auto: listener", e))?;
                Ok(!events.is_empty())
            })?;
            if woke {
                continue;
            }
            let deadline = self.deciding.values().map(|d| d.deadline).min();
            self.epoll
                .wait(deadline, &mut self.events)
                .map_err(|e| Error::io("auto: listener", e))?;
        }
    }
}

impl ListenerOps for AutoListener {
    fn accept(&mut self, blocking: bool) -> Result<Accepted> {
        let got = self.accept_inner(blocking);
        // Whatever happened: an event loop sees the fd readable while connections wait.
        self.sync_ready()?;
        got
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.fd()
    }

    fn local_addr(&self) -> String {
        self.addr.clone()
    }
}
