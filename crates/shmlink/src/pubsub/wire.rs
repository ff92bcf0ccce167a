//! The records of a topic served over `tcp:`, `tls:` and `auto:`: one record per message
//! of the framed connection (whose hello announces the topic role, so a point-to-point
//! peer is refused before any record is read).
//!
//! ```text
//! subscriber                                  publisher
//!   Subscribe(version, flags, history,   ─▶   auto: same boot id, local ok?
//!             max_msg, boot id)          ◀─     → Local(token, proof, name, path)
//!                                             else Welcome(policy, max_msg, start) or Refuse
//!   (after Local: present the token at the topic's socket, check the proof it answers
//!    with, attach over shm: and close this connection; or Subscribe again with the
//!    local flag cleared to stay here, which voids the token)
//!                                        ◀─   Data(message) | Batch(messages) | Missed(n) | Detached
//!                                        ◀─   FIN (framed): end of stream, after the last Data
//! ```
//!
//! `Batch` carries several messages in one record — each a `u32` length and its bytes
//! — so that the fan-out moves whatever waited in the ring with one write and the
//! subscriber with one read. A batch holds only what was ready: the fan-out never waits
//! to fill one.
//!
//! Every record starts with its kind byte; integers are little-endian; text is UTF-8
//! with a `u16` length. The parser is strict: a record must be exactly as long as its
//! fields say, every length is bounded, every value is checked, and anything else is
//! [`ErrorKind::ProtocolViolation`] naming what was wrong.

use crate::error::{Error, ErrorKind, Result};
use crate::transport::net::{MAX_BOOT_ID, MAX_NAME, MAX_PATH};
use crate::transport::shm::handshake::{Token, TOKEN_LEN};

/// Version of this record format (2: `Batch`; 3: `Local` carries a token and a proof).
pub(crate) const VERSION: u8 = 3;

const KIND_SUBSCRIBE: u8 = 1;
const KIND_WELCOME: u8 = 2;
const KIND_REFUSE: u8 = 3;
const KIND_LOCAL: u8 = 4;
/// A data record's kind: the message follows it.
pub(crate) const KIND_DATA: u8 = 5;
const KIND_MISSED: u8 = 6;
const KIND_DETACHED: u8 = 7;
const KIND_BATCH: u8 = 8;
/// Bytes before each message of a batch: its length.
const ENTRY_HEADER: usize = 4;

/// `Subscribe` flag: the subscriber may attach over shared memory instead.
pub(crate) const FLAG_LOCAL_OK: u8 = 1;
const KNOWN_FLAGS: u8 = FLAG_LOCAL_OK;

/// Longest refusal reason accepted (the boot id's, socket name's and path's limits are
/// the local upgrade's, shared with `auto:`).
const MAX_REASON: usize = 512;

/// Largest record other than `Data` and `Batch`: a `Local` with the longest name and
/// path.
pub(crate) const MAX_CONTROL_RECORD: usize = 1 + 2 * TOKEN_LEN + 2 + MAX_NAME + 2 + MAX_PATH;
/// Largest `Batch` record the fan-out builds (both ends' framed connections take it).
pub(crate) const BATCH_BYTES: usize = 64 * 1024;

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
    /// shared memory (file name in the rendezvous directory, and full path), the
    /// single-use token to present there and the proof the socket must answer with.
    Local {
        token: Token,
        proof: Token,
        name: &'a str,
        path: &'a str,
    },
    /// Publisher → subscriber: one message.
    Data(&'a [u8]),
    /// Publisher → subscriber: this many messages were overwritten before we sent them
    /// (`overwrite` policy; never 0).
    Missed(u64),
    /// Publisher → subscriber: detached for stalling (`block` policy); nothing follows.
    Detached,
    /// Publisher → subscriber: one or more messages in order (the record's body after
    /// its kind byte; [`batch_entry`] walks it).
    Batch(&'a [u8]),
}

/// The message of the batch entry at `at` in a `Batch` record (`record` includes the
/// kind byte; the first entry is at 1): its start and length, or `None` past the end or
/// where the record is malformed (never, once [`Record::parse`] accepted it).
pub(crate) fn batch_entry(record: &[u8], at: usize) -> Option<(usize, usize)> {
    let len = record.get(at..at.checked_add(ENTRY_HEADER)?)?;
    let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
    let start = at + ENTRY_HEADER;
    (start.checked_add(len)? <= record.len()).then_some((start, len))
}

/// A batch being built: messages are appended in place, and [`BatchBuf::record`] hands
/// out a `Batch` record — or, for a lone message, a `Data` record, without moving it.
pub(crate) struct BatchBuf {
    /// `[spare; 4] [KIND_BATCH] ([len: u32] [message])*`. For a lone message the kind
    /// byte of its `Data` record goes at index 8, over the last byte of its length.
    buf: Vec<u8>,
    count: usize,
    /// Whether [`BatchBuf::record`] handed out a lone message as `Data`, whose kind byte
    /// overwrote part of its length: the batch must be cleared before it grows.
    sealed: bool,
}

/// Where a batch record starts in [`BatchBuf::buf`].
const BATCH_AT: usize = 4;

impl BatchBuf {
    pub(crate) fn new() -> BatchBuf {
        let mut b = BatchBuf {
            buf: Vec::new(),
            count: 0,
            sealed: false,
        };
        b.clear();
        b
    }

    /// Empties the batch.
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.buf.extend_from_slice(&[0; BATCH_AT]);
        self.buf.push(KIND_BATCH);
        self.count = 0;
        self.sealed = false;
    }

    /// Messages in the batch.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Bytes the `Batch` record would have with one more message of `len` bytes.
    pub(crate) fn len_with(&self, len: usize) -> usize {
        self.buf.len() - BATCH_AT + ENTRY_HEADER + len
    }

    /// Appends a message that `fill` writes into a buffer of `max` bytes and whose
    /// length it returns; on error nothing is appended.
    pub(crate) fn push_with(
        &mut self,
        max: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<usize>,
    ) -> Result<()> {
        assert!(
            !self.sealed,
            "a batch handed out is cleared before it grows"
        );
        let at = self.buf.len();
        self.buf.resize(at + ENTRY_HEADER + max, 0);
        match fill(&mut self.buf[at + ENTRY_HEADER..]) {
            Ok(n) => {
                let n = n.min(max);
                self.buf[at..at + ENTRY_HEADER].copy_from_slice(&(n as u32).to_le_bytes());
                self.buf.truncate(at + ENTRY_HEADER + n);
                self.count += 1;
                Ok(())
            }
            Err(e) => {
                self.buf.truncate(at);
                Err(e)
            }
        }
    }

    /// Appends a message.
    pub(crate) fn push(&mut self, msg: &[u8]) {
        assert!(
            !self.sealed,
            "a batch handed out is cleared before it grows"
        );
        self.buf
            .extend_from_slice(&(msg.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(msg);
        self.count += 1;
    }

    /// The record to send: `Data` for one message, `Batch` for more (not called empty).
    pub(crate) fn record(&mut self) -> &[u8] {
        debug_assert!(self.count > 0);
        if self.count == 1 {
            self.sealed = true;
            let at = BATCH_AT + 1 + ENTRY_HEADER - 1;
            self.buf[at] = KIND_DATA;
            &self.buf[at..]
        } else {
            &self.buf[BATCH_AT..]
        }
    }
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

    fn token(&mut self, field: &str) -> Result<Token> {
        Ok(self
            .take(TOKEN_LEN, field)?
            .try_into()
            .expect("TOKEN_LEN bytes"))
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
            Record::Local {
                token,
                proof,
                name,
                path,
            } => {
                out.push(KIND_LOCAL);
                out.extend_from_slice(token);
                out.extend_from_slice(proof);
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
            Record::Batch(body) => {
                out.push(KIND_BATCH);
                out.extend_from_slice(body);
            }
        }
        out
    }

    /// Parses one record, strictly (see the module docs). `max_msg` bounds a data
    /// record's message and each of a batch's.
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
            KIND_BATCH => "Batch",
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
                token: r.token("token")?,
                proof: r.token("proof")?,
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
            KIND_BATCH => {
                if body.is_empty() {
                    return Err(Error::violation("topic record Batch: no message"));
                }
                while !r.rest.is_empty() {
                    let b = r.take(ENTRY_HEADER, "a message's length")?;
                    let n = u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize;
                    if n > max_msg {
                        return Err(Error::violation(format!(
                            "topic record Batch: message of {n} bytes, the topic's maximum is {max_msg}"
                        )));
                    }
                    r.take(n, "a message")?;
                }
                Record::Batch(body)
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
/// cleanly, what parses survives a round trip, and a batch that parses is walked by
/// [`batch_entry`] to its last byte.
pub(crate) fn fuzz_records(data: &[u8]) {
    if let Ok(rec) = Record::parse(data, 1 << 20) {
        if let Record::Batch(_) = rec {
            let mut at = 1;
            while at < data.len() {
                let (start, len) = batch_entry(data, at).expect("an accepted batch is whole");
                at = start + len;
            }
            assert_eq!(at, data.len(), "entries end where the record ends");
        }
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
        let mut next = crate::xorshift(0x2545_f491_4f6c_dd1du64);
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
                token: [3; TOKEN_LEN],
                proof: [4; TOKEN_LEN],
                name: "topic-1-ab.sock",
                path: "/run/shmlink/topic-1-ab.sock",
            },
            Record::Data(b"hello"),
            Record::Data(b""),
            Record::Missed(3),
            Record::Detached,
            Record::Batch(&[2, 0, 0, 0, b'h', b'i', 0, 0, 0, 0]),
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
            // Data and Batch end where the record ends (a batch cut between two
            // messages is a shorter batch: see `batches_are_built_walked_and_checked`).
            if !matches!(rec, Record::Data(_) | Record::Batch(_)) {
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
            (
                [&[KIND_LOCAL][..], &[0; 2 * TOKEN_LEN], &[0xff, 0xff]].concat(),
                "at most 255",
            ),
            (vec![KIND_LOCAL, 1, 2], "truncated at token"),
            ([&[KIND_DATA][..], &[7; 65]].concat(), "maximum is 64"),
            (vec![KIND_BATCH], "no message"),
            (vec![KIND_BATCH, 1, 0, 0], "truncated at a message's length"),
            (vec![KIND_BATCH, 2, 0, 0, 0, 1], "truncated at a message"),
            (
                [&[KIND_BATCH, 65, 0, 0, 0][..], &[7; 65]].concat(),
                "maximum is 64",
            ),
            (
                [&[KIND_BATCH][..], &u32::MAX.to_le_bytes(), &[1]].concat(),
                "maximum is 64",
            ),
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
    fn batches_are_built_walked_and_checked() {
        let mut b = BatchBuf::new();
        b.push(b"one");
        // A lone message goes as a Data record.
        assert_eq!(Record::parse(b.record(), 64).unwrap(), Record::Data(b"one"));
        b.clear();
        let msgs: [&[u8]; 4] = [b"one", b"", b"three", &[9; 64]];
        for m in msgs {
            let before = b.len_with(m.len());
            b.push_with(64, |buf| {
                buf[..m.len()].copy_from_slice(m);
                Ok(m.len())
            })
            .unwrap();
            if b.count() > 1 {
                assert_eq!(b.record().len(), before);
            }
        }
        // A failed fill appends nothing.
        let e = b.push_with(64, |_| Err(Error::would_block())).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        assert_eq!(b.count(), 4);
        let rec = b.record().to_vec();
        assert!(matches!(Record::parse(&rec, 64), Ok(Record::Batch(_))));
        let (mut at, mut got) = (1, Vec::new());
        while let Some((start, len)) = batch_entry(&rec, at) {
            got.push(&rec[start..start + len]);
            at = start + len;
        }
        assert_eq!(got, msgs);
        assert_eq!(at, rec.len());
        // Cut anywhere: a shorter batch at a message boundary, else a violation.
        let boundaries = [1 + 4 + 3, 1 + 4 + 3 + 4, 1 + 4 + 3 + 4 + 4 + 5];
        for n in 1..rec.len() {
            match Record::parse(&rec[..n], 64) {
                Ok(Record::Batch(_)) => assert!(boundaries.contains(&n), "cut at {n}"),
                Ok(other) => panic!("{other:?}"),
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::ProtocolViolation);
                    assert!(!boundaries.contains(&n), "cut at {n}: {e}");
                }
            }
        }
        // A message larger than the subscriber's maximum.
        assert!(Record::parse(&rec, 63).is_err());
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
