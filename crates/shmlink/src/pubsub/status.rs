//! A topic's answer to `shmlink ls`: the publisher's control thread answers the `shm:`
//! `Query` packet ([`inspect`](crate::inspect()) sends it to every socket in the rendezvous
//! directory) with a `TopicStatus` packet of its own, framed like the subscribe handshake
//! (`magic: u32 = "SHML"`, the publish/subscribe `version: u16`, `kind: u16 = 20`, little
//! endian), every `str` a `len: u16` and that many bytes of UTF-8:
//!
//! ```text
//! flags: u16 (bit 0: subscribers left out to fit MAX_STATUS; bit 1: exported by its
//! publisher), policy: u32 (1 block, 2 overwrite),
//! slots: u64, max_msg: u64, published: u64, joined: u64, left: u64, detached: u64,
//! address: str, count: u32, then count times:
//!   slot: u32, pid: u32, uid: u32, gid: u32, lag: u64, missed: u64,
//!   remote: str (a network subscriber's address, or empty)
//! ```
//!
//! A listener of an older version answers the query with a refusal (unknown kind), and an
//! older `inspect` reports this answer as a failure (a publish/subscribe kind from what it
//! took for a plain listener): neither side misreads the other. The answer is untrusted
//! on the reading side: its length, every count, every string and the numbers that must
//! fit together (`lag` and `missed` at most `published`) are checked, and anything left
//! over is a violation.

use std::os::fd::{AsFd, OwnedFd};

use super::handshake::{POLICY_BLOCK, POLICY_OVERWRITE, VERSION};
use super::options::Policy;
use super::ring::MAX_SUBSCRIBERS;
use super::topic::Topic;
use crate::error::{Error, ErrorKind, Result};
use crate::sys::socket;
use crate::transport::shm::handshake::{
    Packet as ShmPacket, RefuseCode, MAGIC, MAX_STATUS as MAX_ANSWER,
};

const KIND_TOPIC_STATUS: u16 = 20;
const PREFIX: usize = 8;
const FLAG_TRUNCATED: u16 = 1;
const FLAG_EXPORTED: u16 = 2;
/// Longest text field (an address).
const MAX_TEXT: usize = 4096;
/// Bytes of a subscriber record without its `remote` text.
const SUB_FIXED: usize = 4 * 4 + 8 * 2 + 2;

/// What a publisher reports about its topic to [`inspect`](crate::inspect())
/// ([`SocketState::Topic`](crate::inspect::SocketState::Topic)).
///
/// `Send`, `Sync`, `Clone`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TopicStatus {
    /// The topic's address as it was bound (`shm:NAME`, or the `auto:` address's
    /// shared-memory side).
    pub address: String,
    /// What a full ring does.
    pub policy: Policy,
    /// Messages the ring holds.
    pub slots: u64,
    /// Largest message.
    pub max_msg: u64,
    /// Messages published so far.
    pub published: u64,
    /// Subscribers admitted since the topic was bound.
    pub joined: u64,
    /// Subscribers that went away.
    pub left: u64,
    /// Subscribers the publisher detached (stalled, or broke the protocol).
    pub detached: u64,
    /// The subscribers now, by slot.
    pub subscribers: Vec<TopicSubscriber>,
    /// Some subscribers were left out to keep the answer within 64 KiB.
    pub truncated: bool,
    /// The publishing process sends the topic's messages off the host itself
    /// ([`PubSubOptions::exported`](crate::PubSubOptions::exported)): bridges leave it
    /// alone.
    pub exported: bool,
}

/// One subscriber of a [`TopicStatus`].
///
/// `Send`, `Sync`, `Clone`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TopicSubscriber {
    /// Its slot in the topic.
    pub slot: u32,
    /// Its process as the kernel told the publisher (`SO_PEERCRED`; pid 0 outside the
    /// publisher's PID namespace). For a network subscriber, the publisher's own process
    /// (its fan-out thread reads for it).
    pub cred: crate::inspect::ProcessCred,
    /// Messages published that it has not read yet.
    pub lag: u64,
    /// Messages it lost to overwriting (`overwrite` policy), as it reports them.
    pub missed: u64,
    /// A network subscriber's address (`IP:PORT`).
    pub remote: Option<String>,
}

/// Whether `bytes` is `inspect`'s query (the `shm:` `Query` packet).
pub(crate) fn is_query(bytes: &[u8]) -> bool {
    matches!(ShmPacket::decode(bytes), Ok(ShmPacket::Query))
}

/// Answers a query on `sock` with the topic's status, or refuses a client the topic's
/// credential check did not admit (like a subscriber's request).
pub(crate) fn answer(topic: &Topic, sock: &OwnedFd, admitted: bool) {
    let packet = if admitted {
        encode(&snapshot(topic))
    } else {
        let why = format!("not admitted to {}", topic.addr);
        ShmPacket::Refuse(RefuseCode::Permission, why).encode()
    };
    let _ = socket::send(sock.as_fd(), &packet);
}

/// The topic now, read like [`Publisher::subscribers`](crate::Publisher::subscribers).
fn snapshot(topic: &Topic) -> TopicStatus {
    let table = topic.lock();
    let remotes = topic.remotes();
    let published = topic.ring().written();
    let subscribers = table
        .views(published)
        .map(|v| TopicSubscriber {
            slot: v.slot as u32,
            cred: v.sub.cred.into(),
            lag: v.lag,
            missed: v.missed,
            remote: remotes.get(&v.slot).map(|a| a.to_string()),
        })
        .collect();
    TopicStatus {
        address: topic.addr.clone(),
        policy: topic.policy,
        slots: topic.geom.slots,
        max_msg: topic.geom.max_msg as u64,
        published,
        joined: table.joined,
        left: table.left,
        detached: table.detached,
        subscribers,
        truncated: false,
        exported: topic.opts.exported,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

/// The `TopicStatus` packet; subscribers that would take it past 64 KiB are left out and
/// `truncated` set.
pub(crate) fn encode(s: &TopicStatus) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&KIND_TOPIC_STATUS.to_le_bytes());
    let flags_at = out.len();
    out.extend_from_slice(&0u16.to_le_bytes());
    let policy = match s.policy {
        Policy::Block => POLICY_BLOCK,
        Policy::Overwrite => POLICY_OVERWRITE,
    };
    out.extend_from_slice(&policy.to_le_bytes());
    for v in [
        s.slots,
        s.max_msg,
        s.published,
        s.joined,
        s.left,
        s.detached,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    put_str(&mut out, &s.address);
    let count_at = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut count = 0u32;
    let mut truncated = s.truncated;
    for sub in s.subscribers.iter().take(MAX_SUBSCRIBERS) {
        let mut record = Vec::with_capacity(SUB_FIXED + 32);
        for v in [sub.slot, sub.cred.pid, sub.cred.uid, sub.cred.gid] {
            record.extend_from_slice(&v.to_le_bytes());
        }
        for v in [sub.lag, sub.missed] {
            record.extend_from_slice(&v.to_le_bytes());
        }
        put_str(&mut record, sub.remote.as_deref().unwrap_or(""));
        if out.len() + record.len() > MAX_ANSWER {
            truncated = true;
            break;
        }
        out.extend_from_slice(&record);
        count += 1;
    }
    truncated |= s.subscribers.len() > count as usize;
    let flags =
        if truncated { FLAG_TRUNCATED } else { 0 } | if s.exported { FLAG_EXPORTED } else { 0 };
    out[flags_at..flags_at + 2].copy_from_slice(&flags.to_le_bytes());
    out[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
    out
}

/// Takes fields off the front of an untrusted answer.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        if self.0.len() < n {
            return Err(violation(format!(
                "truncated at {what} ({} bytes left, {n} needed)",
                self.0.len()
            )));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(2, what)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }

    fn str(&mut self, what: &str) -> Result<String> {
        let len = self.u16(what)? as usize;
        if len > MAX_TEXT {
            return Err(violation(format!(
                "{what} of {len} bytes (at most {MAX_TEXT})"
            )));
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| violation(format!("{what} is not UTF-8")))
    }
}

fn violation(why: String) -> Error {
    Error::violation(format!("topic status: {why}"))
}

/// `Some` if `bytes` is a topic's answer (a `TopicStatus` packet), parsed and checked;
/// `None` for any other packet.
pub(crate) fn decode_answer(bytes: &[u8]) -> Option<Result<TopicStatus>> {
    if bytes.len() < PREFIX
        || bytes[..4] != MAGIC.to_le_bytes()
        || bytes[6..8] != KIND_TOPIC_STATUS.to_le_bytes()
    {
        return None;
    }
    Some(decode(bytes))
}

fn decode(bytes: &[u8]) -> Result<TopicStatus> {
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != VERSION {
        return Err(Error::new(
            ErrorKind::VersionMismatch,
            format!("topic status of publish/subscribe protocol version {version}, this side speaks {VERSION}"),
        ));
    }
    if bytes.len() > MAX_ANSWER {
        return Err(violation(format!(
            "{} bytes (at most {MAX_ANSWER})",
            bytes.len()
        )));
    }
    let mut r = Reader(&bytes[PREFIX..]);
    let flags = r.u16("flags")?;
    if flags & !(FLAG_TRUNCATED | FLAG_EXPORTED) != 0 {
        return Err(violation(format!("unknown flags {flags:#06x}")));
    }
    let policy = match r.u32("policy")? {
        POLICY_BLOCK => Policy::Block,
        POLICY_OVERWRITE => Policy::Overwrite,
        p => return Err(violation(format!("unknown policy {p}"))),
    };
    let slots = r.u64("slots")?;
    let max_msg = r.u64("max_msg")?;
    let published = r.u64("published")?;
    let joined = r.u64("joined")?;
    let left = r.u64("left")?;
    let detached = r.u64("detached")?;
    let address = r.str("address")?;
    let count = r.u32("count")? as usize;
    if count > MAX_SUBSCRIBERS {
        return Err(violation(format!(
            "{count} subscribers (a topic has at most {MAX_SUBSCRIBERS})"
        )));
    }
    // Each record takes at least SUB_FIXED bytes: a count the body cannot hold is a lie,
    // found before anything is allocated for it.
    if count * SUB_FIXED > r.0.len() {
        return Err(violation(format!(
            "{count} subscribers in {} bytes",
            r.0.len()
        )));
    }
    let mut subscribers = Vec::with_capacity(count);
    for _ in 0..count {
        let slot = r.u32("slot")?;
        let (pid, uid, gid) = (r.u32("pid")?, r.u32("uid")?, r.u32("gid")?);
        let lag = r.u64("lag")?;
        let missed = r.u64("missed")?;
        let remote = r.str("remote")?;
        if slot as usize >= MAX_SUBSCRIBERS {
            return Err(violation(format!("subscriber slot {slot}")));
        }
        if lag > published || missed > published {
            return Err(violation(format!(
                "subscriber {slot}: lag {lag} or missed {missed} beyond the {published} messages published"
            )));
        }
        subscribers.push(TopicSubscriber {
            slot,
            cred: crate::inspect::ProcessCred { pid, uid, gid },
            lag,
            missed,
            remote: (!remote.is_empty()).then_some(remote),
        });
    }
    if !r.0.is_empty() {
        return Err(violation(format!("{} bytes left over", r.0.len())));
    }
    Ok(TopicStatus {
        address,
        policy,
        slots,
        max_msg,
        published,
        joined,
        left,
        detached,
        subscribers,
        truncated: flags & FLAG_TRUNCATED != 0,
        exported: flags & FLAG_EXPORTED != 0,
    })
}

/// Fuzzing: a topic's answer is refused or parsed from any bytes without panicking, and
/// what parses encodes to the same bytes.
#[cfg(feature = "testing")]
pub(crate) fn fuzz_answer(data: &[u8]) {
    if let Some(Ok(s)) = decode_answer(data) {
        assert_eq!(encode(&s), data, "a parsed answer re-encodes to its bytes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(n: usize) -> TopicStatus {
        TopicStatus {
            address: "shm:topic".into(),
            policy: Policy::Overwrite,
            slots: 1024,
            max_msg: 4000,
            published: 1000,
            joined: 9,
            left: 2,
            detached: 1,
            subscribers: (0..n)
                .map(|i| TopicSubscriber {
                    slot: i as u32,
                    cred: crate::inspect::ProcessCred {
                        pid: 100 + i as u32,
                        uid: 1000,
                        gid: 1000,
                    },
                    lag: i as u64,
                    missed: 2 * i as u64,
                    remote: (i % 2 == 1).then(|| format!("127.0.0.1:{}", 4000 + i)),
                })
                .collect(),
            truncated: false,
            exported: n % 2 == 1,
        }
    }

    #[test]
    fn round_trips() {
        for s in [status(0), status(1), status(2), status(MAX_SUBSCRIBERS)] {
            let bytes = encode(&s);
            assert!(bytes.len() <= MAX_ANSWER);
            assert_eq!(decode_answer(&bytes).unwrap().unwrap(), s);
        }
        assert!(decode_answer(&ShmPacket::Query.encode()).is_none());
        assert!(is_query(&ShmPacket::Query.encode()));
        assert!(!is_query(&encode(&status(1))));
    }

    /// The reader's side of a hostile publisher: every truncation, every flipped byte and
    /// the lies a count or a length can tell are errors, never a panic or a huge
    /// allocation.
    #[test]
    fn truncated_and_garbage_answers_are_errors() {
        let bytes = encode(&status(3));
        for n in PREFIX..bytes.len() {
            assert!(decode_answer(&bytes[..n]).unwrap().is_err(), "cut at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_answer(&longer).unwrap().is_err());
        for i in PREFIX..bytes.len() {
            for v in [0x00, 0xff, 0x80] {
                let mut b = bytes.clone();
                b[i] = v;
                fuzz_answer(&b);
                // Either a consistent status or an error: decoding must not panic.
                if let Some(Ok(s)) = decode_answer(&b) {
                    assert!(s.subscribers.iter().all(|x| x.lag <= s.published));
                }
            }
        }
        let field = |at: usize, v: &[u8]| {
            let mut b = bytes.clone();
            b[at..at + v.len()].copy_from_slice(v);
            decode_answer(&b).unwrap().unwrap_err().to_string()
        };
        // flags, policy, count (after 2 + 4 + 6*8 + 2 + len("shm:topic")).
        assert!(field(8, &[4, 0]).contains("unknown flags"));
        assert!(field(10, &[9, 0, 0, 0]).contains("unknown policy"));
        let count_at = PREFIX + 2 + 4 + 48 + 2 + "shm:topic".len();
        assert!(field(count_at, &u32::MAX.to_le_bytes()).contains("at most 128"));
        assert!(field(count_at, &100u32.to_le_bytes()).contains("100 subscribers in"));
        // Subscriber 1's lag beyond what was published.
        let lag_at = count_at + 4 + SUB_FIXED + 16;
        assert!(field(lag_at, &u64::MAX.to_le_bytes()).contains("beyond"));
        let mut v = bytes.clone();
        v[4] = 9;
        assert_eq!(
            decode_answer(&v).unwrap().unwrap_err().kind(),
            ErrorKind::VersionMismatch
        );
        let mut huge = bytes.clone();
        huge.resize(MAX_ANSWER + 1, 0);
        assert!(decode_answer(&huge).unwrap().is_err());
    }
}
