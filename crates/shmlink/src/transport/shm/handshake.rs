//! The `shm:` handshake, one `SOCK_SEQPACKET` packet each way.
//!
//! Every packet starts with `magic: u32 = "SHML"`, `version: u16`, `kind: u16` (little
//! endian). Then:
//!
//! | kind | body |
//! |---|---|
//! | 1 `Hello` (client → server) | `features: u64, ring_c2s: u64, ring_s2c: u64, max_msg: u64` |
//! | 2 `Accept` (server → client, memfd attached with SCM_RIGHTS) | same fields, as the server chose them |
//! | 3 `Refuse` (server → client) | `code: u16, len: u16, reason: [u8; len]` (UTF-8) |
//! | 4 `Upgrade` (client → server, `auto:`) | `Hello`'s fields, then `token: [u8; 16]` |
//! | 5 `Upgraded` (server → client, memfd attached) | `Accept`'s fields, then `proof: [u8; 16]` |
//!
//! `Upgrade` and `Upgraded` move an `auto:` connection from TCP onto shared memory: the
//! token and the proof were handed to the client over the TCP connection; the token
//! names the connection to the listener, the proof shows the client that the listener
//! behind this socket is the one it reached over TCP (see `transport::auto`).
//!
//! `Refuse` keeps its layout in every version, so a client of any version can read why it
//! was refused. Packets are exactly as long as their kind says; anything else is a
//! [`ErrorKind::ProtocolViolation`].

use crate::error::{Error, ErrorKind, Result};

/// "SHML", little endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SHML");
/// This implementation's protocol version.
pub const VERSION: u16 = 1;
/// Longest packet either side sends or accepts.
pub const MAX_PACKET: usize = PREFIX + 4 + MAX_REASON;
/// Longest refusal reason, in bytes.
pub const MAX_REASON: usize = 256;

/// Feature bit: the sender registered for `membarrier(GLOBAL_EXPEDITED)`, so both sides
/// may use [`FenceMode::Asymmetric`](crate::ring::FenceMode::Asymmetric).
pub const FEATURE_ASYM_FENCE: u64 = 1;

const PREFIX: usize = 8;
const PARAMS_LEN: usize = PREFIX + 32;
const KIND_HELLO: u16 = 1;
const KIND_ACCEPT: u16 = 2;
const KIND_REFUSE: u16 = 3;
const KIND_UPGRADE: u16 = 4;
const KIND_UPGRADED: u16 = 5;
/// Bytes of an `auto:` upgrade token or proof.
pub const TOKEN_LEN: usize = 16;

/// An `auto:` upgrade token or proof: random bytes handed out over TCP.
pub type Token = [u8; TOKEN_LEN];

/// Ring sizes and limits, proposed in `Hello` and decided in `Accept`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Feature bits ([`FEATURE_ASYM_FENCE`]); a server answers with the bits both sides
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
        };
        let mut out = Vec::with_capacity(PARAMS_LEN + TOKEN_LEN);
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        match self {
            Packet::Hello(p) | Packet::Accept(p) => encode_params(&mut out, p),
            Packet::Upgrade(p, token) | Packet::Upgraded(p, token) => {
                encode_params(&mut out, p);
                out.extend_from_slice(token);
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
        if version != VERSION {
            return Err(Error::new(
                ErrorKind::VersionMismatch,
                format!("peer speaks protocol version {version}, this side speaks {VERSION}"),
            ));
        }
        let len = match kind {
            KIND_HELLO | KIND_ACCEPT => PARAMS_LEN,
            KIND_UPGRADE | KIND_UPGRADED => PARAMS_LEN + TOKEN_LEN,
            _ => return bad(format!("unknown packet kind {kind}")),
        };
        if bytes.len() != len {
            return bad(format!("packet of {} bytes, expected {len}", bytes.len()));
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let p = Params {
            features: u64_at(8),
            ring_c2s: u64_at(16),
            ring_s2c: u64_at(24),
            max_msg: u64_at(32),
        };
        let token = || -> Token { bytes[PARAMS_LEN..].try_into().expect("checked length") };
        Ok(match kind {
            KIND_HELLO => Packet::Hello(p),
            KIND_ACCEPT => Packet::Accept(p),
            KIND_UPGRADE => Packet::Upgrade(p, token()),
            _ => Packet::Upgraded(p, token()),
        })
    }
}

fn encode_params(out: &mut Vec<u8>, p: &Params) {
    for v in [p.features, p.ring_c2s, p.ring_s2c, p.max_msg] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ] {
            assert_eq!(Packet::decode(&pkt.encode()).unwrap(), pkt);
        }
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
}
