//! The subscribe handshake: one `SOCK_SEQPACKET` packet each way on the topic's
//! rendezvous socket, framed like the `shm:` handshake (`magic: u32 = "SHML"`,
//! `version: u16`, `kind: u16`, little endian) with kinds of its own:
//!
//! | kind | body |
//! |---|---|
//! | 16 `Subscribe` (subscriber → publisher) | `features: u64, history: u64, max_msg: u64` |
//! | 17 `Subscribed` (publisher → subscriber, three descriptors: topic, bell, cursor page) | `slot: u32, policy: u32, slots: u64, slot_size: u64, max_msg: u64, header_len: u64, start: u64` |
//! | 18 `Upgrade` (`auto:` subscriber → publisher) | `Subscribe`'s fields, then `token: [u8; 16]` |
//! | 19 `Upgraded` (publisher → `auto:` subscriber, three descriptors) | `Subscribed`'s fields, then `proof: [u8; 16]` |
//! | 3 `Refuse` (publisher → subscriber) | the `shm:` refusal: `code: u16, len: u16, reason` |
//! | 20 `TopicStatus` (publisher → `shmlink ls`, answering the `shm:` `Query`) | the topic and its subscribers (see `pubsub::status`) |
//!
//! `history` is how many past messages the subscriber wants replayed (`u64::MAX`: all the
//! publisher keeps); `max_msg` the largest message it accepts (0: any). `start` is the
//! position of the first message it will read. Packets are exactly as long as their
//! kind says. `Upgrade` and `Upgraded` move an `auto:` subscriber from its network
//! subscription onto shared memory, as the point-to-point `auto:` upgrade does: the token
//! was handed out over that (TCP/TLS) subscription and is single-use, and the proof shows
//! the subscriber that the socket it found belongs to the publisher it reached over the
//! network. The socket of an `auto:` topic answers nothing else. A plain `shm:` client that reaches a publisher is refused with a reason,
//! and a subscriber that reaches a plain `shm:` listener is refused by it (unknown kind).

use crate::error::{Error, ErrorKind, Result};
use crate::transport::shm::handshake::{Packet as ShmPacket, RefuseCode, Token, MAGIC, TOKEN_LEN};

/// The publish/subscribe protocol version (independent of the `shm:` one).
pub const VERSION: u16 = 1;
/// Longest packet either side sends or accepts (a refusal with the longest reason).
pub const MAX_PACKET: usize = crate::transport::shm::handshake::MAX_PACKET;

const PREFIX: usize = 8;
const KIND_REFUSE: u16 = 3;
const KIND_SHM_HELLO: u16 = 1;
const KIND_SHM_UPGRADE: u16 = 4;
const KIND_SUBSCRIBE: u16 = 16;
const KIND_SUBSCRIBED: u16 = 17;
const KIND_UPGRADE: u16 = 18;
const KIND_UPGRADED: u16 = 19;
const SUBSCRIBE_LEN: usize = PREFIX + 24;
const SUBSCRIBED_LEN: usize = PREFIX + 8 + 40;

/// A [`Subscribe`] feature bit: the subscriber is woken after the others
/// (`PubSubOptions::background`).
pub const FEATURE_BACKGROUND: u64 = 1;

/// Publish/subscribe policy numbers on the wire and in the topic header.
pub const POLICY_BLOCK: u32 = 1;
/// See [`POLICY_BLOCK`].
pub const POLICY_OVERWRITE: u32 = 2;

/// What a subscriber asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subscribe {
    /// Feature bits (`FEATURE_BACKGROUND`; unknown ones are ignored).
    pub features: u64,
    /// Past messages wanted (`u64::MAX`: everything the publisher keeps).
    pub history: u64,
    /// Largest message the subscriber accepts (0: any).
    pub max_msg: u64,
}

/// What the publisher set up for a subscriber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subscribed {
    /// The subscriber's slot in the topic (its bell bit).
    pub slot: u32,
    /// `POLICY_BLOCK` (1) or `POLICY_OVERWRITE` (2).
    pub policy: u32,
    /// Slot count.
    pub slots: u64,
    /// Bytes per slot.
    pub slot_size: u64,
    /// Largest message.
    pub max_msg: u64,
    /// Bytes before the first slot in the topic segment.
    pub header_len: u64,
    /// Position of the first message the subscriber reads.
    pub start: u64,
}

/// A handshake packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    /// Subscriber's request.
    Subscribe(Subscribe),
    /// Publisher's answer (the three descriptors travel with it).
    Subscribed(Subscribed),
    /// An `auto:` subscriber's request, with the token the publisher handed it over the
    /// network.
    Upgrade(Subscribe, Token),
    /// The publisher's answer to an upgrade (the three descriptors travel with it), with
    /// the proof that goes with the token.
    Upgraded(Subscribed, Token),
    /// Publisher's refusal.
    Refuse(RefuseCode, String),
    /// A plain `shm:` client's hello or upgrade: the wrong kind of peer.
    ShmClient,
}

fn prefix(out: &mut Vec<u8>, kind: u16) {
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
}

impl Packet {
    /// The packet's bytes (`ShmClient` is never sent: it encodes as empty).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SUBSCRIBED_LEN + TOKEN_LEN);
        let subscribe = |out: &mut Vec<u8>, kind, s: &Subscribe| {
            prefix(out, kind);
            for v in [s.features, s.history, s.max_msg] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        };
        let subscribed = |out: &mut Vec<u8>, kind, s: &Subscribed| {
            prefix(out, kind);
            out.extend_from_slice(&s.slot.to_le_bytes());
            out.extend_from_slice(&s.policy.to_le_bytes());
            for v in [s.slots, s.slot_size, s.max_msg, s.header_len, s.start] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        };
        match self {
            Packet::Subscribe(s) => subscribe(&mut out, KIND_SUBSCRIBE, s),
            Packet::Subscribed(s) => subscribed(&mut out, KIND_SUBSCRIBED, s),
            Packet::Upgrade(s, token) => {
                subscribe(&mut out, KIND_UPGRADE, s);
                out.extend_from_slice(token);
            }
            Packet::Upgraded(s, proof) => {
                subscribed(&mut out, KIND_UPGRADED, s);
                out.extend_from_slice(proof);
            }
            Packet::Refuse(code, reason) => {
                return ShmPacket::Refuse(*code, reason.clone()).encode();
            }
            Packet::ShmClient => {}
        }
        out
    }

    /// Parses a packet received from an untrusted peer.
    pub fn decode(bytes: &[u8]) -> Result<Packet> {
        let bad = |why: String| Err(Error::violation(format!("subscribe handshake: {why}")));
        if bytes.len() < PREFIX {
            return bad(format!("packet of {} bytes is too short", bytes.len()));
        }
        let magic = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
        if magic != MAGIC {
            return bad(format!("bad magic {magic:#010x} (not a shmlink peer)"));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        let kind = u16::from_le_bytes([bytes[6], bytes[7]]);
        match kind {
            KIND_REFUSE => {
                return match ShmPacket::decode(bytes)? {
                    ShmPacket::Refuse(code, reason) => Ok(Packet::Refuse(code, reason)),
                    other => bad(format!("refusal decoded as {other:?}")),
                }
            }
            KIND_SHM_HELLO | KIND_SHM_UPGRADE => return Ok(Packet::ShmClient),
            KIND_SUBSCRIBE | KIND_SUBSCRIBED | KIND_UPGRADE | KIND_UPGRADED => {}
            _ => return bad(format!("unknown packet kind {kind}")),
        }
        if version != VERSION {
            return Err(Error::new(
                ErrorKind::VersionMismatch,
                format!(
                    "peer speaks publish/subscribe protocol version {version}, this side speaks {VERSION}"
                ),
            ));
        }
        let want = match kind {
            KIND_SUBSCRIBE => SUBSCRIBE_LEN,
            KIND_SUBSCRIBED => SUBSCRIBED_LEN,
            KIND_UPGRADE => SUBSCRIBE_LEN + TOKEN_LEN,
            _ => SUBSCRIBED_LEN + TOKEN_LEN,
        };
        if bytes.len() != want {
            return bad(format!("packet of {} bytes, expected {want}", bytes.len()));
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let token = |at: usize| -> Token { bytes[at..].try_into().expect("checked length") };
        let subscribe = || Subscribe {
            features: u64_at(8),
            history: u64_at(16),
            max_msg: u64_at(24),
        };
        let subscribed = || Subscribed {
            slot: u32_at(8),
            policy: u32_at(12),
            slots: u64_at(16),
            slot_size: u64_at(24),
            max_msg: u64_at(32),
            header_len: u64_at(40),
            start: u64_at(48),
        };
        Ok(match kind {
            KIND_SUBSCRIBE => Packet::Subscribe(subscribe()),
            KIND_SUBSCRIBED => Packet::Subscribed(subscribed()),
            KIND_UPGRADE => Packet::Upgrade(subscribe(), token(SUBSCRIBE_LEN)),
            _ => Packet::Upgraded(subscribed(), token(SUBSCRIBED_LEN)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::handshake::Params;

    #[test]
    fn packets_round_trip() {
        for p in [
            Packet::Subscribe(Subscribe {
                features: 0,
                history: u64::MAX,
                max_msg: 64,
            }),
            Packet::Subscribed(Subscribed {
                slot: 3,
                policy: POLICY_OVERWRITE,
                slots: 1024,
                slot_size: 128,
                max_msg: 112,
                header_len: 4096,
                start: 77,
            }),
            Packet::Upgrade(
                Subscribe {
                    features: 0,
                    history: 5,
                    max_msg: 0,
                },
                [7; TOKEN_LEN],
            ),
            Packet::Upgraded(
                Subscribed {
                    slot: 1,
                    policy: POLICY_BLOCK,
                    slots: 64,
                    slot_size: 128,
                    max_msg: 112,
                    header_len: 4096,
                    start: 0,
                },
                [9; TOKEN_LEN],
            ),
            Packet::Refuse(RefuseCode::Resources, "topic full".into()),
        ] {
            let bytes = p.encode();
            assert_eq!(Packet::decode(&bytes).unwrap(), p);
            // The fuzz entry point over every truncation and every flipped bit.
            for n in 0..bytes.len() {
                crate::testing::fuzz_handshake(&bytes[..n]);
                for bit in 0..8 {
                    let mut b = bytes.clone();
                    b[n] ^= 1 << bit;
                    crate::testing::fuzz_handshake(&b);
                }
            }
        }
    }

    #[test]
    fn malformed_packets_are_violations_and_shm_clients_are_recognised() {
        let good = Packet::Subscribe(Subscribe {
            features: 0,
            history: 0,
            max_msg: 0,
        })
        .encode();
        let mut other = good.clone();
        other[4] = 9;
        assert_eq!(
            Packet::decode(&other).unwrap_err().kind(),
            ErrorKind::VersionMismatch
        );
        let upgrade = Packet::Upgrade(
            Subscribe {
                features: 0,
                history: 0,
                max_msg: 0,
            },
            [1; TOKEN_LEN],
        )
        .encode();
        for bad in [
            &good[..7],
            &good[..20],
            &[&good[..], &[0]].concat()[..],
            b"GET / HTTP/1.1",
            // An upgrade without its whole token, or with a byte more.
            &upgrade[..upgrade.len() - 1],
            &[&upgrade[..], &[0]].concat()[..],
        ] {
            assert_eq!(
                Packet::decode(bad).unwrap_err().kind(),
                ErrorKind::ProtocolViolation
            );
        }
        let hello = ShmPacket::Hello(Params {
            features: 0,
            ring_c2s: 4096,
            ring_s2c: 4096,
            max_msg: 1,
        });
        assert_eq!(Packet::decode(&hello.encode()).unwrap(), Packet::ShmClient);
    }
}
