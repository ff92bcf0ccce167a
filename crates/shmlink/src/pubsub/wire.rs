//! The records of a topic served over `tcp:`, `tls:` and `auto:`: one record per message
//! of the framed connection (whose hello announces the topic role, so a point-to-point
//! peer is refused before any record is read).
//!
//! ```text
//! subscriber                                  publisher
//!   Subscribe(version, flags, history,   ─▶   auto: same boot id, local ok? → Local(name, path)
//!             max_msg, boot id)          ◀─   else Welcome(policy, max_msg, start) or Refuse
//!   (after Local: attach over shm: and close this connection, or Subscribe
//!    again with the local flag cleared to stay here)
//!                                        ◀─   Data(message) | Missed(n) | Detached
//!                                        ◀─   FIN (framed): end of stream, after the last Data
//! ```
//!
//! Every record starts with its kind byte; integers are little-endian; text is UTF-8
//! with a `u16` length. The parser is strict: a record must be exactly as long as its
//! fields say, every length is bounded, every value is checked, and anything else is
//! [`ErrorKind::ProtocolViolation`] naming what was wrong.

use crate::error::{Error, ErrorKind, Result};

/// Version of this record format.
pub(crate) const VERSION: u8 = 1;

const KIND_SUBSCRIBE: u8 = 1;
const KIND_WELCOME: u8 = 2;
const KIND_REFUSE: u8 = 3;
const KIND_LOCAL: u8 = 4;
/// A data record's kind: the message follows it.
pub(crate) const KIND_DATA: u8 = 5;
const KIND_MISSED: u8 = 6;
const KIND_DETACHED: u8 = 7;

/// `Subscribe` flag: the subscriber may attach over shared memory instead.
pub(crate) const FLAG_LOCAL_OK: u8 = 1;
const KNOWN_FLAGS: u8 = FLAG_LOCAL_OK;

/// Longest boot id, socket name, socket path and refusal reason accepted.
pub(crate) const MAX_BOOT_ID: usize = 64;
const MAX_NAME: usize = 255;
const MAX_PATH: usize = 4096;
const MAX_REASON: usize = 512;

/// Largest record other than `Data`: a `Local` with the longest name and path.
pub(crate) const MAX_CONTROL_RECORD: usize = 1 + 2 + MAX_NAME + 2 + MAX_PATH;

/// The `Welcome` policy byte.
pub(crate) const POLICY_BLOCK: u8 = 1;
/// The `Welcome` policy byte.
pub(crate) const POLICY_OVERWRITE: u8 = 2;

/// Why a publisher refused a subscriber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RefuseCode {
    /// The topic has its maximum of subscribers.
    Full = 1,
    /// The subscriber's options do not fit the topic (its maximum message size).
    Unsuitable = 2,
    /// Another record version.
    Version = 3,
    /// The topic is closing.
    Closing = 4,
}

impl RefuseCode {
    fn from_byte(b: u8) -> Option<RefuseCode> {
        Some(match b {
            1 => RefuseCode::Full,
            2 => RefuseCode::Unsuitable,
            3 => RefuseCode::Version,
            4 => RefuseCode::Closing,
            _ => return None,
        })
    }

    /// The error the subscriber reports.
    pub(crate) fn kind(self) -> ErrorKind {
        match self {
            RefuseCode::Full | RefuseCode::Closing => ErrorKind::ConnectionRefused,
            RefuseCode::Unsuitable => ErrorKind::InvalidInput,
            RefuseCode::Version => ErrorKind::VersionMismatch,
        }
    }
}

/// One record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    /// Subscriber → publisher: the request.
    Subscribe {
        version: u8,
        flags: u8,
        /// Past messages wanted (`u64::MAX`: all the publisher offers).
        history: u64,
        /// Largest message the subscriber accepts (0: any).
        max_msg: u64,
        boot_id: &'a [u8],
    },
    /// Publisher → subscriber: admitted.
    Welcome {
        policy: u8,
        max_msg: u64,
        /// Position of the first message that will follow.
        start: u64,
    },
    /// Publisher → subscriber: not admitted, and why.
    Refuse { code: RefuseCode, reason: &'a str },
    /// Publisher → `auto:` subscriber: the topic's rendezvous socket, to attach over
    /// shared memory (file name in the rendezvous directory, and full path).
    Local { name: &'a str, path: &'a str },
    /// Publisher → subscriber: one message.
    Data(&'a [u8]),
    /// Publisher → subscriber: this many messages were overwritten before we sent them
    /// (`overwrite` policy; never 0).
    Missed(u64),
    /// Publisher → subscriber: detached for stalling (`block` policy); nothing follows.
    Detached,
}

/// A bounds-checked reader over one record.
struct Reader<'a> {
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8]> {
        if self.rest.len() < n {
            return Err(Error::violation(format!(
                "topic record {}: truncated at {field} (needs {n} bytes, {} left)",
                self.what,
                self.rest.len()
            )));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self, field: &str) -> Result<u8> {
        Ok(self.take(1, field)?[0])
    }

    fn u64(&mut self, field: &str) -> Result<u64> {
        let b = self.take(8, field)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn bytes(&mut self, max: usize, field: &str) -> Result<&'a [u8]> {
        let b = self.take(2, field)?;
        let n = u16::from_le_bytes([b[0], b[1]]) as usize;
        if n > max {
            return Err(Error::violation(format!(
                "topic record {}: {field} of {n} bytes, at most {max} allowed",
                self.what
            )));
        }
        self.take(n, field)
    }

    fn text(&mut self, max: usize, field: &str) -> Result<&'a str> {
        let b = self.bytes(max, field)?;
        std::str::from_utf8(b).map_err(|_| {
            Error::violation(format!("topic record {}: {field} is not UTF-8", self.what))
        })
    }

    fn end(self) -> Result<()> {
        if !self.rest.is_empty() {
            return Err(Error::violation(format!(
                "topic record {}: {} bytes after its last field",
                self.what,
                self.rest.len()
            )));
        }
        Ok(())
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8], max: usize) {
    let b = &b[..b.len().min(max)];
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

/// Cuts `s` to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut n = s.len().min(max);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

impl<'a> Record<'a> {
    /// The record's bytes. Text longer than its bound is cut (the publisher's own paths
    /// and reasons); a boot id too.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32);
        match self {
            Record::Subscribe {
                version,
                flags,
                history,
                max_msg,
                boot_id,
            } => {
                out.push(KIND_SUBSCRIBE);
                out.push(*version);
                out.push(*flags);
                out.extend_from_slice(&history.to_le_bytes());
                out.extend_from_slice(&max_msg.to_le_bytes());
                put_bytes(&mut out, boot_id, MAX_BOOT_ID);
            }
            Record::Welcome {
                policy,
                max_msg,
                start,
            } => {
                out.push(KIND_WELCOME);
                out.push(*policy);
                out.extend_from_slice(&max_msg.to_le_bytes());
                out.extend_from_slice(&start.to_le_bytes());
            }
            Record::Refuse { code, reason } => {
                out.push(KIND_REFUSE);
                out.push(*code as u8);
                put_bytes(&mut out, cut(reason, MAX_REASON).as_bytes(), MAX_REASON);
            }
            Record::Local { name, path } => {
                out.push(KIND_LOCAL);
                put_bytes(&mut out, cut(name, MAX_NAME).as_bytes(), MAX_NAME);
                put_bytes(&mut out, cut(path, MAX_PATH).as_bytes(), MAX_PATH);
            }
            Record::Data(msg) => {
                out.push(KIND_DATA);
                out.extend_from_slice(msg);
            }
            Record::Missed(n) => {
                out.push(KIND_MISSED);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Record::Detached => out.push(KIND_DETACHED),
        }
        out
    }

    /// Parses one record, strictly (see the module docs). `max_msg` bounds a data
    /// record's message.
    pub(crate) fn parse(bytes: &'a [u8], max_msg: usize) -> Result<Record<'a>> {
        let Some((&kind, body)) = bytes.split_first() else {
            return Err(Error::violation("topic record: empty"));
        };
        let what = match kind {
            KIND_SUBSCRIBE => "Subscribe",
            KIND_WELCOME => "Welcome",
            KIND_REFUSE => "Refuse",
            KIND_LOCAL => "Local",
            KIND_DATA => "Data",
            KIND_MISSED => "Missed",
            KIND_DETACHED => "Detached",
            k => {
                return Err(Error::violation(format!(
                    "topic record of unknown kind {k}"
                )))
            }
        };
        let mut r = Reader { rest: body, what };
        let rec = match kind {
            KIND_SUBSCRIBE => {
                let version = r.u8("version")?;
                let flags = r.u8("flags")?;
                if version == VERSION && flags & !KNOWN_FLAGS != 0 {
                    return Err(Error::violation(format!(
                        "topic record Subscribe: unknown flags {flags:#04x}"
                    )));
                }
                Record::Subscribe {
                    version,
                    flags,
                    history: r.u64("history")?,
                    max_msg: r.u64("max_msg")?,
                    boot_id: r.bytes(MAX_BOOT_ID, "boot id")?,
                }
            }
            KIND_WELCOME => {
                let policy = r.u8("policy")?;
                if policy != POLICY_BLOCK && policy != POLICY_OVERWRITE {
                    return Err(Error::violation(format!(
                        "topic record Welcome: unknown policy {policy}"
                    )));
                }
                let max_msg = r.u64("max_msg")?;
                if max_msg > crate::options::MAX_MSG_SIZE_LIMIT as u64 {
                    return Err(Error::violation(format!(
                        "topic record Welcome: max_msg {max_msg} beyond the limit of {}",
                        crate::options::MAX_MSG_SIZE_LIMIT
                    )));
                }
                let start = r.u64("start")?;
                if start > super::ring::MAX_POSITION {
                    return Err(Error::violation(format!(
                        "topic record Welcome: start {start} beyond any possible position"
                    )));
                }
                Record::Welcome {
                    policy,
                    max_msg,
                    start,
                }
            }
            KIND_REFUSE => {
                let b = r.u8("code")?;
                let code = RefuseCode::from_byte(b).ok_or_else(|| {
                    Error::violation(format!("topic record Refuse: unknown code {b}"))
                })?;
                Record::Refuse {
                    code,
                    reason: r.text(MAX_REASON, "reason")?,
                }
            }
            KIND_LOCAL => Record::Local {
                name: r.text(MAX_NAME, "name")?,
                path: r.text(MAX_PATH, "path")?,
            },
            KIND_DATA => {
                if body.len() > max_msg {
                    return Err(Error::violation(format!(
                        "topic record Data: message of {} bytes, the topic's maximum is {max_msg}",
                        body.len()
                    )));
                }
                return Ok(Record::Data(body));
            }
            KIND_MISSED => {
                let n = r.u64("count")?;
                if n == 0 || n > super::ring::MAX_POSITION {
                    return Err(Error::violation(format!(
                        "topic record Missed: impossible count {n}"
                    )));
                }
                Record::Missed(n)
            }
            _ => Record::Detached,
        };
        r.end()?;
        Ok(rec)
    }
}

/// Fuzz entry point ([`crate::testing::fuzz_handshake`]): any bytes parse or fail
/// cleanly, and what parses survives a round trip.
pub(crate) fn fuzz_records(data: &[u8]) {
    if let Ok(rec) = Record::parse(data, 1 << 20) {
        let bytes = rec.encode();
        assert_eq!(bytes, data, "a parsed record re-encodes to its bytes");
        assert_eq!(Record::parse(&bytes, 1 << 20).expect("re-parses"), rec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzz entry point over valid records with bytes flipped, cut and appended,
    /// and over pseudo-random bytes (a debug build, where overflow panics).
    #[test]
    fn records_survive_mutation() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for rec in samples() {
            let good = rec.encode();
            for _ in 0..2000 {
                let mut b = good.clone();
                match next() % 3 {
                    0 if !b.is_empty() => {
                        let i = next() as usize % b.len();
                        b[i] ^= 1 << (next() % 8);
                    }
                    1 => b.truncate(next() as usize % (b.len() + 1)),
                    _ => b.push(next() as u8),
                }
                fuzz_records(&b);
            }
        }
        for _ in 0..20_000 {
            let len = next() as usize % 40;
            let b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            fuzz_records(&b);
        }
    }

    fn samples() -> Vec<Record<'static>> {
        vec![
            Record::Subscribe {
                version: VERSION,
                flags: FLAG_LOCAL_OK,
                history: u64::MAX,
                max_msg: 100,
                boot_id: b"0123-abcd",
            },
            Record::Welcome {
                policy: POLICY_OVERWRITE,
                max_msg: 4080,
                start: 17,
            },
            Record::Refuse {
                code: RefuseCode::Full,
                reason: "full",
            },
            Record::Local {
                name: "topic-1-ab.sock",
                path: "/run/shmlink/topic-1-ab.sock",
            },
            Record::Data(b"hello"),
            Record::Data(b""),
            Record::Missed(3),
            Record::Detached,
        ]
    }

    #[test]
    fn records_round_trip() {
        for rec in samples() {
            assert_eq!(Record::parse(&rec.encode(), 64).unwrap(), rec);
        }
    }

    #[test]
    fn every_truncation_and_every_extension_is_a_violation() {
        for rec in samples() {
            let bytes = rec.encode();
            if !matches!(rec, Record::Data(_)) {
                for n in 0..bytes.len() {
                    let e = Record::parse(&bytes[..n], 64).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::ProtocolViolation, "{rec:?} cut at {n}");
                }
                let mut longer = bytes.clone();
                longer.push(0);
                let e = Record::parse(&longer, 64).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::ProtocolViolation, "{rec:?} + 1 byte");
                assert!(e.to_string().contains("after its last field"), "{e}");
            }
        }
    }

    #[test]
    fn hostile_values_are_named() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "empty"),
            (vec![0], "unknown kind 0"),
            (vec![200, 1, 2], "unknown kind 200"),
            (
                [&[KIND_WELCOME, 9][..], &[0; 16]].concat(),
                "unknown policy",
            ),
            (
                [
                    &[KIND_WELCOME, POLICY_BLOCK][..],
                    &u64::MAX.to_le_bytes(),
                    &[0; 8],
                ]
                .concat(),
                "max_msg",
            ),
            (
                [
                    &[KIND_WELCOME, POLICY_BLOCK][..],
                    &[0; 8],
                    &u64::MAX.to_le_bytes(),
                ]
                .concat(),
                "start",
            ),
            (
                [&[KIND_MISSED][..], &0u64.to_le_bytes()].concat(),
                "count 0",
            ),
            (
                [&[KIND_MISSED][..], &u64::MAX.to_le_bytes()].concat(),
                "impossible count",
            ),
            (vec![KIND_REFUSE, 99, 0, 0], "unknown code"),
            (vec![KIND_REFUSE, 1, 2, 0, 0xff, 0xfe], "not UTF-8"),
            (vec![KIND_LOCAL, 0xff, 0xff], "at most 255"),
            ([&[KIND_DATA][..], &[7; 65]].concat(), "maximum is 64"),
            (
                [&[KIND_SUBSCRIBE, VERSION, 0x80][..], &[0; 16], &[0, 0]].concat(),
                "unknown flags",
            ),
            (
                [
                    &[KIND_SUBSCRIBE, VERSION, 0][..],
                    &[0; 16],
                    &[65, 0],
                    &[1; 65],
                ]
                .concat(),
                "at most 64",
            ),
        ];
        for (bytes, want) in cases {
            let e = Record::parse(&bytes, 64).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ProtocolViolation, "{bytes:?}");
            assert!(e.to_string().contains(want), "{bytes:?}: {e}");
        }
    }

    #[test]
    fn over_long_text_is_cut_on_a_character_boundary() {
        let long = "é".repeat(400); // 800 bytes
        let rec = Record::Refuse {
            code: RefuseCode::Closing,
            reason: &long,
        };
        match Record::parse(&rec.encode(), 0).unwrap() {
            Record::Refuse { reason, .. } => assert_eq!(reason.len(), MAX_REASON),
            other => panic!("{other:?}"),
        }
    }
}
