//! The `shm:` handshake over the rendezvous socket (`SOCK_SEQPACKET`): a hello, the
//! listener's answer with its segment, and the client's segment.
//!
//! Every packet starts with `magic: u32 = "SHML"`, `version: u16`, `kind: u16` (little
//! endian). Then:
//!
//! | kind | body |
//! |---|---|
//! | 1 `Hello` (client → server, the client's memfd attached or not) | `features: u64, ring_c2s: u64, ring_s2c: u64, max_msg: u64` |
//! | 2 `Accept` (server → client, the listener's memfd attached with SCM_RIGHTS, then three pipe ends with `FEATURE_PIPE_BELL`) | same fields, as the server chose them |
//! | 3 `Refuse` (server → client) | `code: u16, len: u16, reason: [u8; len]` (UTF-8) |
//! | 4 `Upgrade` (client → server, `auto:`) | `Hello`'s fields, then `token: [u8; 16]` |
//! | 5 `Upgraded` (server → client, memfd and pipe ends attached, as `Accept`) | `Accept`'s fields, then `proof: [u8; 16]` |
//! | 6 `Query` (client → server, `shmlink ls`) | nothing |
//! | 7 `Status` (server → client) | the listener and its connections, below; at most [`MAX_STATUS`] bytes |
//! | 8 `Segment` (client → server, the client's memfd attached) | nothing |
//! | 9 `Resume` (client → server, `auto:`) | `Hello`'s fields, then `ticket: [u8; 16]` |
//! | 10 `Resumed` (server → client, attached as `Accept`) | `Accept`'s fields, then `proof: [u8; 16]`, `next_ticket: [u8; 16]`, `next_proof: [u8; 16]` |
//!
//! A connection is set up in two packets: `Hello` with the client's segment attached
//! (one memfd), and `Accept` with the listener's. Or in three: `Hello` (or `Upgrade`)
//! without a descriptor, `Accept` (or `Upgraded`) with the listener's segment, and, once
//! the client has checked that segment, `Segment` with the client's; also when the
//! listener's ring cap is below the ring the hello's segment holds (the answer names the
//! smaller size, and the client sends a `Segment` of it). A hello with more than one
//! descriptor, or a `Query` with any, is refused. Each segment holds what only its creator writes
//! and is sealed with `F_SEAL_FUTURE_WRITE` (see `segment`); a segment without that seal,
//! of the wrong size, or a `Segment` packet with other than one descriptor is a
//! [`ErrorKind::ProtocolViolation`], and the listener refuses it with a `Refuse`. A client
//! that never sends its segment is dropped when the listener's handshake timeout expires.
//! Version 1 had one segment, written by both sides, and no `Segment` packet.
//!
//! A `Status` body, every `str` a `len: u16` and that many bytes of UTF-8:
//!
//! ```text
//! flags: u16 (bit 0: connections left out to fit MAX_STATUS; bit 1: refusal counts follow
//!   the connections), started_ms: u64,
//! address: str, transport: str ("shm" or "auto"), over: str (auto:'s tcp:/tls: address, or empty),
//! count: u32, then count times:
//!   transport: str, flags: u16 (bit 0: peer credentials known), pid: u32, uid: u32, gid: u32,
//!   accepted_ms: u64, msgs_in: u64, bytes_in: u64, msgs_out: u64, bytes_out: u64,
//!   peer_addr: str (tcp:/tls: peers, or empty)
//! with flag bit 1: refused_version: u64, refused_permission: u64, refused_invalid: u64,
//!   refused_protocol: u64, refused_resources: u64 (clients refused since the bind)
//! ```
//!
//! A listener sets bit 1 only once it has refused a client, so that a reader older than
//! the refusal counts (which takes the bit for a violation) still reads a listener that
//! never refused anyone.
//!
//! Times are milliseconds since the Unix epoch. Unknown flag bits, credentials without
//! their flag, text that is not UTF-8 and bytes left over are violations, as everywhere.
//!
//! `Upgrade` and `Upgraded` move an `auto:` connection from TCP onto shared memory: the
//! token and the proof were handed to the client over the TCP connection; the token
//! names the connection to the listener, the proof shows the client that the listener
//! behind this socket is the one it reached over TCP (see `transport::auto`).
//! `Resume` and `Resumed` set up a later `auto:` connection to the same listener without
//! TCP: the ticket and its proof came with an earlier connection (over TCP in its
//! `Offer`, or in a `Resumed`), single-use like a token; `Resumed` carries the next pair.
//!
//! `Query` and `Status` serve introspection (`crate::status`): the listener checks the
//! querying client's credentials like a hello's, answers from its accept processing and
//! closes the socket.
//!
//! `Refuse` keeps its layout in every version, so a client of any version can read why it
//! was refused. Packets are exactly as long as their kind says; anything else is a
//! [`ErrorKind::ProtocolViolation`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, ErrorKind, Result};
use crate::status::{ConnectionStatus, Counters, ListenerStatus, ProcessCred, Refusals};

/// "SHML", little endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SHML");
/// This implementation's protocol version (2: one segment per side).
pub const VERSION: u16 = 2;
/// Longest packet either side sends or accepts during a handshake.
pub const MAX_PACKET: usize = PREFIX + 4 + MAX_REASON;
/// Longest `Status` packet (64 KiB).
pub const MAX_STATUS: usize = 64 * 1024;
/// Longest text field of a `Status`.
const MAX_TEXT: usize = 4096;
/// Longest refusal reason, in bytes.
pub const MAX_REASON: usize = 256;

/// Feature bit: the sender registered for `membarrier(GLOBAL_EXPEDITED)`, so both sides
/// may use [`FenceMode::Asymmetric`](crate::ring::FenceMode::Asymmetric).
pub const FEATURE_ASYM_FENCE: u64 = 1;
/// Feature bit: doorbell pipes (docs/design.md §4.4). When the answer keeps it, the
/// `Accept`/`Upgraded` packet carries three more descriptors after the memfd, all made by
/// the listener: the client's read end to sleep on, the write end it rings the listener
/// with, and a read end of that second pipe (so ringing never raises SIGPIPE). Without
/// it (an older peer) doorbells are bytes on the control socket, as before.
pub const FEATURE_PIPE_BELL: u64 = 2;

const PREFIX: usize = 8;
const PARAMS_LEN: usize = PREFIX + 32;
const KIND_HELLO: u16 = 1;
const KIND_ACCEPT: u16 = 2;
const KIND_REFUSE: u16 = 3;
const KIND_UPGRADE: u16 = 4;
const KIND_UPGRADED: u16 = 5;
const KIND_QUERY: u16 = 6;
const KIND_STATUS: u16 = 7;
const KIND_SEGMENT: u16 = 8;
const KIND_RESUME: u16 = 9;
const KIND_RESUMED: u16 = 10;
const STATUS_TRUNCATED: u16 = 1;
const STATUS_REFUSALS: u16 = 2;
/// Bytes of the refusal counts.
const REFUSALS_LEN: usize = 5 * 8;
const CONN_HAS_CRED: u16 = 1;
/// Bytes of an `auto:` upgrade token or proof.
pub const TOKEN_LEN: usize = 16;

/// An `auto:` upgrade token or proof: random bytes handed out over TCP.
pub type Token = [u8; TOKEN_LEN];

/// A random token from the kernel.
pub(crate) fn random_token() -> Result<Token> {
    random_bytes()
}

/// A token and a proof, from one `getrandom`.
pub(crate) fn random_pair() -> Result<(Token, Token)> {
    let both: [u8; 2 * TOKEN_LEN] = random_bytes()?;
    let (a, b) = both.split_at(TOKEN_LEN);
    Ok((
        a.try_into().expect("TOKEN_LEN bytes"),
        b.try_into().expect("TOKEN_LEN bytes"),
    ))
}

/// Random bytes from the kernel.
fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut t = [0u8; N];
    let mut got = 0;
    while got < t.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `t`.
        match crate::sys::syscall!(getrandom(t[got..].as_mut_ptr().cast(), t.len() - got, 0)) {
            Ok(n) => got += n as usize,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("getrandom", e)),
        }
    }
    Ok(t)
}

/// Ring sizes and limits, proposed in `Hello` and decided in `Accept`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Feature bits (`FEATURE_ASYM_FENCE`); a server answers with the bits both sides
    /// have, so unknown bits are dropped.
    pub features: u64,
    /// Client-to-server ring size in bytes.
    pub ring_c2s: u64,
    /// Server-to-client ring size in bytes.
    pub ring_s2c: u64,
    /// Largest message the sender of this packet accepts.
    pub max_msg: u64,
}

/// Why a listener refused a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum RefuseCode {
    /// The client speaks another protocol version.
    Version = 1,
    /// The client's credentials are not allowed.
    Permission = 2,
    /// The client asked for something impossible (ring sizes).
    Invalid = 3,
    /// The client's packet was malformed.
    Protocol = 4,
    /// The listener could not set up the connection (out of memory, …).
    Resources = 5,
}

impl RefuseCode {
    fn from_u16(v: u16) -> Option<RefuseCode> {
        Some(match v {
            1 => RefuseCode::Version,
            2 => RefuseCode::Permission,
            3 => RefuseCode::Invalid,
            4 => RefuseCode::Protocol,
            5 => RefuseCode::Resources,
            _ => return None,
        })
    }

    /// The error kind a client reports for this refusal.
    pub fn kind(self) -> ErrorKind {
        match self {
            RefuseCode::Version => ErrorKind::VersionMismatch,
            RefuseCode::Permission => ErrorKind::PermissionDenied,
            RefuseCode::Invalid => ErrorKind::InvalidInput,
            RefuseCode::Protocol => ErrorKind::ProtocolViolation,
            RefuseCode::Resources => ErrorKind::ConnectionRefused,
        }
    }
}

/// A handshake packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    /// Client's proposal.
    Hello(Params),
    /// Server's decision (the memfd travels with it).
    Accept(Params),
    /// Server's refusal.
    Refuse(RefuseCode, String),
    /// Client's proposal for an `auto:` connection, with the token it got over TCP.
    Upgrade(Params, Token),
    /// Server's decision on an upgrade (the memfd travels with it), with the proof.
    Upgraded(Params, Token),
    /// Client's question: what does this listener serve?
    Query,
    /// Server's answer to a query. Encoding leaves out the connections that do not fit
    /// `MAX_STATUS` (64 KiB) and sets `truncated`.
    Status(ListenerStatus),
    /// Client's segment, after the server's answer (the memfd travels with it).
    Segment,
    /// Client's proposal for an `auto:` connection without TCP, with a resumption ticket
    /// an earlier connection to the same listener brought.
    Resume(Params, Token),
    /// Server's decision on a resumption (the memfd travels with it): the ticket's
    /// proof, then the next ticket and its proof.
    Resumed(Params, Token, Token, Token),
}

impl Packet {
    /// The packet's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let kind = match self {
            Packet::Hello(_) => KIND_HELLO,
            Packet::Accept(_) => KIND_ACCEPT,
            Packet::Refuse(..) => KIND_REFUSE,
            Packet::Upgrade(..) => KIND_UPGRADE,
            Packet::Upgraded(..) => KIND_UPGRADED,
            Packet::Query => KIND_QUERY,
            Packet::Status(_) => KIND_STATUS,
            Packet::Segment => KIND_SEGMENT,
            Packet::Resume(..) => KIND_RESUME,
            Packet::Resumed(..) => KIND_RESUMED,
        };
        let mut out = Vec::with_capacity(PARAMS_LEN + 3 * TOKEN_LEN);
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        match self {
            Packet::Hello(p) | Packet::Accept(p) => encode_params(&mut out, p),
            Packet::Upgrade(p, token) | Packet::Upgraded(p, token) | Packet::Resume(p, token) => {
                encode_params(&mut out, p);
                out.extend_from_slice(token);
            }
            Packet::Resumed(p, proof, ticket, next_proof) => {
                encode_params(&mut out, p);
                for t in [proof, ticket, next_proof] {
                    out.extend_from_slice(t);
                }
            }
            Packet::Refuse(code, reason) => {
                let mut end = reason.len().min(MAX_REASON);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                out.extend_from_slice(&(*code as u16).to_le_bytes());
                out.extend_from_slice(&(end as u16).to_le_bytes());
                out.extend_from_slice(&reason.as_bytes()[..end]);
            }
            Packet::Query | Packet::Segment => {}
            Packet::Status(status) => encode_status(&mut out, status),
        }
        out
    }

    /// Parses a packet received from an untrusted peer.
    pub fn decode(bytes: &[u8]) -> Result<Packet> {
        let bad = |why: String| Err(Error::violation(format!("handshake: {why}")));
        if bytes.len() < PREFIX {
            return bad(format!("packet of {} bytes is too short", bytes.len()));
        }
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let magic = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if magic != MAGIC {
            return bad(format!("bad magic {magic:#010x} (not a shmlink peer)"));
        }
        let (version, kind) = (u16_at(4), u16_at(6));
        if kind == KIND_REFUSE {
            let body = &bytes[PREFIX..];
            if body.len() < 4 {
                return bad("truncated refusal".into());
            }
            let code = u16::from_le_bytes([body[0], body[1]]);
            let len = u16::from_le_bytes([body[2], body[3]]) as usize;
            if len > MAX_REASON || body.len() != 4 + len {
                return bad(format!(
                    "refusal of {} bytes claims a {len}-byte reason",
                    body.len()
                ));
            }
            let Some(code) = RefuseCode::from_u16(code) else {
                return bad(format!("unknown refusal code {code}"));
            };
            let reason = String::from_utf8_lossy(&body[4..]).into_owned();
            return Ok(Packet::Refuse(code, reason));
        }
        // Kinds 16 and up belong to publish/subscribe (`pubsub::handshake`), which counts
        // its versions apart: a subscriber that reached a plain listener is the wrong kind
        // of peer, whatever its version.
        if kind >= 16 {
            return bad(format!(
                "packet kind {kind} is publish/subscribe, and this is a plain shm: peer"
            ));
        }
        if version != VERSION {
            return Err(Error::new(
                ErrorKind::VersionMismatch,
                format!("peer speaks protocol version {version}, this side speaks {VERSION}"),
            ));
        }
        let len = match kind {
            KIND_HELLO | KIND_ACCEPT => PARAMS_LEN,
            KIND_UPGRADE | KIND_UPGRADED | KIND_RESUME => PARAMS_LEN + TOKEN_LEN,
            KIND_RESUMED => PARAMS_LEN + 3 * TOKEN_LEN,
            KIND_QUERY | KIND_SEGMENT => PREFIX,
            KIND_STATUS if bytes.len() > MAX_STATUS => {
                return bad(format!(
                    "status of {} bytes (at most {MAX_STATUS})",
                    bytes.len()
                ))
            }
            KIND_STATUS => return decode_status(&bytes[PREFIX..]).map(Packet::Status),
            _ => return bad(format!("unknown packet kind {kind}")),
        };
        if bytes.len() != len {
            return bad(format!("packet of {} bytes, expected {len}", bytes.len()));
        }
        match kind {
            KIND_QUERY => return Ok(Packet::Query),
            KIND_SEGMENT => return Ok(Packet::Segment),
            _ => {}
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let p = Params {
            features: u64_at(8),
            ring_c2s: u64_at(16),
            ring_s2c: u64_at(24),
            max_msg: u64_at(32),
        };
        let token = |i: usize| -> Token {
            let at = PARAMS_LEN + i * TOKEN_LEN;
            bytes[at..at + TOKEN_LEN]
                .try_into()
                .expect("checked length")
        };
        Ok(match kind {
            KIND_HELLO => Packet::Hello(p),
            KIND_ACCEPT => Packet::Accept(p),
            KIND_UPGRADE => Packet::Upgrade(p, token(0)),
            KIND_RESUME => Packet::Resume(p, token(0)),
            KIND_RESUMED => Packet::Resumed(p, token(0), token(1), token(2)),
            _ => Packet::Upgraded(p, token(0)),
        })
    }
}

fn encode_params(out: &mut Vec<u8>, p: &Params) {
    for v in [p.features, p.ring_c2s, p.ring_s2c, p.max_msg] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Appends `text` as a `str` field, cut to [`MAX_TEXT`] bytes on a character boundary.
fn put_text(out: &mut Vec<u8>, text: &str) {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&text.as_bytes()[..end]);
}

/// Appends a `Status` body; connections that would take the packet past [`MAX_STATUS`]
/// are left out and the truncated flag set.
fn encode_status(out: &mut Vec<u8>, s: &ListenerStatus) {
    let flags_at = out.len();
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&millis(s.started).to_le_bytes());
    put_text(out, &s.address);
    put_text(out, &s.transport);
    put_text(out, s.over.as_deref().unwrap_or(""));
    let count_at = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut count = 0u32;
    let mut truncated = s.truncated;
    let mut record = Vec::new();
    for c in &s.connections {
        record.clear();
        put_text(&mut record, &c.transport);
        let (flags, cred) = match c.peer {
            Some(p) => (CONN_HAS_CRED, [p.pid, p.uid, p.gid]),
            None => (0, [0; 3]),
        };
        record.extend_from_slice(&flags.to_le_bytes());
        for v in cred {
            record.extend_from_slice(&v.to_le_bytes());
        }
        let k = &c.counters;
        for v in [
            millis(c.accepted),
            k.msgs_in,
            k.bytes_in,
            k.msgs_out,
            k.bytes_out,
        ] {
            record.extend_from_slice(&v.to_le_bytes());
        }
        put_text(&mut record, c.peer_addr.as_deref().unwrap_or(""));
        if out.len() + record.len() + REFUSALS_LEN > MAX_STATUS {
            truncated = true;
            break;
        }
        out.extend_from_slice(&record);
        count += 1;
    }
    out[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
    let mut flags = if truncated { STATUS_TRUNCATED } else { 0 };
    if s.refusals.total() > 0 {
        flags |= STATUS_REFUSALS;
        for (_, n) in s.refusals.iter() {
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
    out[flags_at..flags_at + 2].copy_from_slice(&flags.to_le_bytes());
}

/// Takes fields off the front of an untrusted `Status` body.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        if self.0.len() < N {
            return Err(Error::violation(format!(
                "handshake: status: truncated {what}"
            )));
        }
        let (head, tail) = self.0.split_at(N);
        self.0 = tail;
        Ok(head.try_into().expect("N bytes"))
    }

    fn u16(&mut self, what: &str) -> Result<u16> {
        self.take(what).map(u16::from_le_bytes)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.take(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.take(what).map(u64::from_le_bytes)
    }

    fn time(&mut self, what: &str) -> Result<SystemTime> {
        let ms = self.u64(what)?;
        UNIX_EPOCH
            .checked_add(Duration::from_millis(ms))
            .ok_or_else(|| Error::violation(format!("handshake: status: {what} {ms} ms")))
    }

    fn text(&mut self, what: &str) -> Result<String> {
        let len = self.u16(what)? as usize;
        if len > MAX_TEXT || len > self.0.len() {
            return Err(Error::violation(format!(
                "handshake: status: {what} of {len} bytes ({} left, at most {MAX_TEXT})",
                self.0.len()
            )));
        }
        let (head, tail) = self.0.split_at(len);
        self.0 = tail;
        String::from_utf8(head.to_vec())
            .map_err(|_| Error::violation(format!("handshake: status: {what} is not UTF-8")))
    }
}

fn decode_status(body: &[u8]) -> Result<ListenerStatus> {
    let bad = |why: String| Err(Error::violation(format!("handshake: status: {why}")));
    let mut f = Fields(body);
    let flags = f.u16("flags")?;
    if flags & !(STATUS_TRUNCATED | STATUS_REFUSALS) != 0 {
        return bad(format!("unknown flags {flags:#x}"));
    }
    let started = f.time("start time")?;
    let address = f.text("address")?;
    let transport = f.text("transport")?;
    let over = Some(f.text("outer address")?).filter(|o| !o.is_empty());
    let count = f.u32("connection count")?;
    let mut connections = Vec::new();
    for _ in 0..count {
        let transport = f.text("connection transport")?;
        let cflags = f.u16("connection flags")?;
        let [pid, uid, gid] = [f.u32("pid")?, f.u32("uid")?, f.u32("gid")?];
        let peer = match cflags {
            CONN_HAS_CRED => Some(ProcessCred { pid, uid, gid }),
            0 if [pid, uid, gid] == [0; 3] => None,
            0 => return bad("peer credentials without their flag".into()),
            _ => return bad(format!("unknown connection flags {cflags:#x}")),
        };
        let accepted = f.time("accept time")?;
        let counters = Counters {
            msgs_in: f.u64("counters")?,
            bytes_in: f.u64("counters")?,
            msgs_out: f.u64("counters")?,
            bytes_out: f.u64("counters")?,
        };
        let peer_addr = Some(f.text("peer address")?).filter(|a| !a.is_empty());
        connections.push(ConnectionStatus {
            transport,
            peer,
            peer_addr,
            accepted,
            counters,
        });
    }
    let mut refusals = Refusals::default();
    if flags & STATUS_REFUSALS != 0 {
        for n in [
            &mut refusals.version,
            &mut refusals.permission,
            &mut refusals.invalid,
            &mut refusals.protocol,
            &mut refusals.resources,
        ] {
            *n = f.u64("refusal counts")?;
        }
    }
    if !f.0.is_empty() {
        return bad(format!("{} bytes after the last connection", f.0.len()));
    }
    Ok(ListenerStatus {
        address,
        transport,
        over,
        started,
        connections,
        truncated: flags & STATUS_TRUNCATED != 0,
        refusals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    /// A status with `n` connections, alternately `shm:` and `tcp:` ones.
    fn status(n: usize) -> ListenerStatus {
        ListenerStatus {
            address: "auto:127.0.0.1:4000".into(),
            transport: "auto".into(),
            over: Some("tcp:127.0.0.1:4000".into()),
            started: at(1_700_000_000_123),
            truncated: false,
            refusals: Refusals::default(),
            connections: (0..n as u64)
                .map(|i| ConnectionStatus {
                    transport: if i % 2 == 0 { "shm" } else { "tcp" }.into(),
                    peer: (i % 2 == 0).then_some(ProcessCred {
                        pid: 100 + i as u32,
                        uid: 1000,
                        gid: 1000,
                    }),
                    peer_addr: (i % 2 == 1).then(|| format!("tcp:127.0.0.1:{}", 50000 + i)),
                    accepted: at(1_700_000_001_000 + i),
                    counters: Counters {
                        msgs_in: i,
                        bytes_in: 64 * i,
                        msgs_out: 2 * i,
                        bytes_out: u64::MAX - i,
                    },
                })
                .collect(),
        }
    }

    #[test]
    fn packets_round_trip() {
        let p = Params {
            features: 1,
            ring_c2s: 4096,
            ring_s2c: 8192,
            max_msg: 99,
        };
        for pkt in [
            Packet::Hello(p),
            Packet::Accept(p),
            Packet::Refuse(RefuseCode::Permission, "uid 5 not allowed".into()),
            Packet::Upgrade(p, [7; TOKEN_LEN]),
            Packet::Upgraded(p, [9; TOKEN_LEN]),
            Packet::Resume(p, [5; TOKEN_LEN]),
            Packet::Resumed(p, [1; TOKEN_LEN], [2; TOKEN_LEN], [3; TOKEN_LEN]),
            Packet::Query,
            Packet::Segment,
            Packet::Status(status(0)),
            Packet::Status(status(5)),
            Packet::Status(ListenerStatus {
                address: "shm:é".into(),
                transport: "shm".into(),
                over: None,
                truncated: true,
                ..status(1)
            }),
            Packet::Status(ListenerStatus {
                refusals: Refusals {
                    version: 1,
                    permission: u64::MAX,
                    invalid: 0,
                    protocol: 7,
                    resources: 2,
                },
                ..status(2)
            }),
        ] {
            assert_eq!(Packet::decode(&pkt.encode()).unwrap(), pkt);
        }
    }

    #[test]
    fn refusal_counts_are_sent_only_once_there_are_some() {
        // A listener that never refused anyone answers as before the counts existed (an
        // older reader takes the flag for a violation).
        let plain = Packet::Status(status(1)).encode();
        assert_eq!(u16::from_le_bytes([plain[8], plain[9]]), 0);
        let mut refused = status(1);
        refused.refusals.permission = 3;
        let bytes = Packet::Status(refused.clone()).encode();
        assert_eq!(bytes.len(), plain.len() + REFUSALS_LEN);
        assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), STATUS_REFUSALS);
        assert_eq!(Packet::decode(&bytes).unwrap(), Packet::Status(refused));
        // The flag without the counts, or the counts without the flag: violations.
        let mut short = bytes.clone();
        short.truncate(bytes.len() - 8);
        assert!(Packet::decode(&short).is_err());
        let mut unflagged = bytes.clone();
        unflagged[8] = 0;
        assert!(Packet::decode(&unflagged).is_err());
        // Cut to fit with the counts too.
        let mut big = status(5000);
        big.refusals.version = 1;
        let bytes = Packet::Status(big).encode();
        assert!(bytes.len() <= MAX_STATUS);
        let Packet::Status(s) = Packet::decode(&bytes).unwrap() else {
            panic!()
        };
        assert!(s.truncated);
        assert_eq!(s.refusals.version, 1);
    }

    #[test]
    fn a_status_is_cut_to_fit_and_says_so() {
        let bytes = Packet::Status(status(5000)).encode();
        assert!(bytes.len() <= MAX_STATUS && bytes.len() > MAX_STATUS - 200);
        let Packet::Status(s) = Packet::decode(&bytes).unwrap() else {
            panic!()
        };
        assert!(s.truncated);
        assert!(s.connections.len() > 500 && s.connections.len() < 5000);
        assert_eq!(
            s.connections[..],
            status(5000).connections[..s.connections.len()]
        );
    }

    #[test]
    fn long_reasons_are_cut_on_a_char_boundary() {
        let pkt = Packet::Refuse(RefuseCode::Invalid, "é".repeat(200));
        let Packet::Refuse(_, r) = Packet::decode(&pkt.encode()).unwrap() else {
            panic!()
        };
        assert_eq!(r.len(), 256);
    }

    #[test]
    fn malformed_packets_are_violations() {
        let good = Packet::Hello(Params {
            features: 0,
            ring_c2s: 4096,
            ring_s2c: 4096,
            max_msg: 1,
        })
        .encode();
        let mut other_version = good.clone();
        other_version[4] = 9;
        assert_eq!(
            Packet::decode(&other_version).unwrap_err().kind(),
            ErrorKind::VersionMismatch
        );
        for bad in [
            &good[..3],
            &good[..20],
            &[good.as_slice(), &[0]].concat()[..],
            b"GET / HTTP/1.1\r\n\r\n",
            &[0u8; 40][..],
        ] {
            assert_eq!(
                Packet::decode(bad).unwrap_err().kind(),
                ErrorKind::ProtocolViolation
            );
        }
        let mut refuse = Packet::Refuse(RefuseCode::Invalid, "x".into()).encode();
        refuse[10] = 200; // claims a longer reason than it carries
        assert!(Packet::decode(&refuse).is_err());
    }

    /// Every single-byte change and every cut of a status either parses into something
    /// that survives a round trip or is refused: the fuzz target's check, on every byte.
    #[test]
    fn corrupted_statuses_never_panic() {
        let good = Packet::Status(status(3)).encode();
        for i in 0..good.len() {
            for v in [0u8, 1, 0x7f, 0x80, 0xff, good[i] ^ 1] {
                let mut b = good.clone();
                b[i] = v;
                crate::testing::fuzz_handshake(&b);
            }
            crate::testing::fuzz_handshake(&good[..i]);
        }
    }

    #[test]
    fn malformed_queries_and_statuses_are_violations() {
        let query = Packet::Query.encode();
        assert_eq!(query.len(), PREFIX);
        let good = Packet::Status(status(2)).encode();
        let flip = |at: usize, v: u8| {
            let mut b = good.clone();
            b[at] = v;
            b
        };
        // Offsets in `good`: flags at 8, started at 10, address length at 18 (19 bytes),
        // transport at 39 (4), over at 45 (18), count at 65, the first connection at 69:
        // transport length (3 bytes), flags at 74, pid at 76 ...
        assert_eq!(u32::from_le_bytes(good[65..69].try_into().unwrap()), 2);
        let mut bad_utf8 = good.clone();
        bad_utf8[20] = 0xff;
        let mut over_max = good.clone();
        over_max.resize(MAX_STATUS + 1, 0);
        let mut cred_without_flag = good.clone();
        cred_without_flag[74] = 0;
        for (what, bad) in [
            ("query with a body", [query.as_slice(), &[0]].concat()),
            ("status without a body", query[..].to_vec()),
            ("truncated status", good[..good.len() - 1].to_vec()),
            ("status with bytes after", [good.as_slice(), &[0]].concat()),
            ("unknown status flag", flip(8, 4)),
            ("refusal flag without the counts", flip(8, 2)),
            ("count too high", flip(65, 3)),
            ("count too low", flip(65, 1)),
            ("address longer than the packet", flip(19, 0xff)),
            ("address not UTF-8", bad_utf8),
            ("unknown connection flag", flip(74, 3)),
            ("credentials without their flag", cred_without_flag),
            ("status over 64 KiB", over_max),
        ] {
            let mut bad = bad;
            if what == "status without a body" {
                bad[6] = KIND_STATUS as u8;
            }
            assert_eq!(
                Packet::decode(&bad).map_err(|e| e.kind()),
                Err(ErrorKind::ProtocolViolation),
                "{what}"
            );
        }
    }
}
