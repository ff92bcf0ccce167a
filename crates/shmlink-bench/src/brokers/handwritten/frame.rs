//! AMQP 0-9-1 framing: frames, method arguments and content headers, parsed from untrusted
//! bytes and encoded; the ids of the methods the client uses.
//!
//! A frame is `type:u8 channel:u16 size:u32 payload[size] 0xCE` (big-endian). [`parse`]
//! returns the first complete frame of the input, `None` when it is not complete yet, or an
//! `InvalidData` error: unknown frame type, size over the negotiated maximum (checked from
//! the header alone, before waiting for the payload), wrong end byte.

use std::io;

/// `type` of a method frame.
pub(crate) const METHOD: u8 = 1;
/// `type` of a content header frame.
pub(crate) const HEADER: u8 = 2;
/// `type` of a content body frame.
pub(crate) const BODY: u8 = 3;
/// `type` of a heartbeat frame.
pub(crate) const HEARTBEAT: u8 = 8;
/// The byte after every frame's payload.
pub(crate) const FRAME_END: u8 = 0xCE;
/// Type, channel and size.
pub(crate) const FRAME_HEADER: usize = 7;
/// Header and end byte: what a frame adds to its payload.
pub(crate) const FRAME_OVERHEAD: usize = FRAME_HEADER + 1;
/// The smallest `frame_max` a peer must accept, and the limit before Connection.Tune.
pub(crate) const FRAME_MIN: u32 = 4096;

/// `AMQP 0-9-1`, what the client sends first.
pub(crate) const PROTOCOL_HEADER: [u8; 8] = *b"AMQP\x00\x00\x09\x01";

// ---------------------------------------------------------------- the methods used

// (class, method) ids.
pub(crate) const CONNECTION_START: (u16, u16) = (10, 10);
pub(crate) const CONNECTION_START_OK: (u16, u16) = (10, 11);
pub(crate) const CONNECTION_TUNE: (u16, u16) = (10, 30);
pub(crate) const CONNECTION_TUNE_OK: (u16, u16) = (10, 31);
pub(crate) const CONNECTION_OPEN: (u16, u16) = (10, 40);
pub(crate) const CONNECTION_OPEN_OK: (u16, u16) = (10, 41);
pub(crate) const CONNECTION_CLOSE: (u16, u16) = (10, 50);
pub(crate) const CONNECTION_CLOSE_OK: (u16, u16) = (10, 51);
pub(crate) const CONNECTION_BLOCKED: (u16, u16) = (10, 60);
pub(crate) const CONNECTION_UNBLOCKED: (u16, u16) = (10, 61);
pub(crate) const CHANNEL_OPEN: (u16, u16) = (20, 10);
pub(crate) const CHANNEL_OPEN_OK: (u16, u16) = (20, 11);
pub(crate) const CHANNEL_CLOSE: (u16, u16) = (20, 40);
pub(crate) const CHANNEL_CLOSE_OK: (u16, u16) = (20, 41);
pub(crate) const EXCHANGE_DECLARE: (u16, u16) = (40, 10);
pub(crate) const EXCHANGE_DECLARE_OK: (u16, u16) = (40, 11);
pub(crate) const QUEUE_DECLARE: (u16, u16) = (50, 10);
pub(crate) const QUEUE_DECLARE_OK: (u16, u16) = (50, 11);
pub(crate) const QUEUE_BIND: (u16, u16) = (50, 20);
pub(crate) const QUEUE_BIND_OK: (u16, u16) = (50, 21);
pub(crate) const BASIC_QOS: (u16, u16) = (60, 10);
pub(crate) const BASIC_QOS_OK: (u16, u16) = (60, 11);
pub(crate) const BASIC_CONSUME: (u16, u16) = (60, 20);
pub(crate) const BASIC_CONSUME_OK: (u16, u16) = (60, 21);
pub(crate) const BASIC_CANCEL: (u16, u16) = (60, 30);
pub(crate) const BASIC_PUBLISH: (u16, u16) = (60, 40);
pub(crate) const BASIC_DELIVER: (u16, u16) = (60, 60);

/// The name of a method for messages.
pub(crate) fn method_name(id: (u16, u16)) -> String {
    let known = [
        (CONNECTION_START, "Connection.Start"),
        (CONNECTION_TUNE, "Connection.Tune"),
        (CONNECTION_OPEN_OK, "Connection.OpenOk"),
        (CONNECTION_CLOSE, "Connection.Close"),
        (CONNECTION_CLOSE_OK, "Connection.CloseOk"),
        (CHANNEL_OPEN_OK, "Channel.OpenOk"),
        (CHANNEL_CLOSE, "Channel.Close"),
        (CHANNEL_CLOSE_OK, "Channel.CloseOk"),
        (EXCHANGE_DECLARE, "Exchange.Declare"),
        (EXCHANGE_DECLARE_OK, "Exchange.DeclareOk"),
        (QUEUE_DECLARE, "Queue.Declare"),
        (QUEUE_DECLARE_OK, "Queue.DeclareOk"),
        (QUEUE_BIND, "Queue.Bind"),
        (QUEUE_BIND_OK, "Queue.BindOk"),
        (BASIC_QOS, "Basic.Qos"),
        (BASIC_QOS_OK, "Basic.QosOk"),
        (BASIC_CONSUME, "Basic.Consume"),
        (BASIC_CONSUME_OK, "Basic.ConsumeOk"),
        (BASIC_CANCEL, "Basic.Cancel"),
        (BASIC_PUBLISH, "Basic.Publish"),
        (BASIC_DELIVER, "Basic.Deliver"),
    ];
    match known.iter().find(|(k, _)| *k == id) {
        Some((_, name)) => (*name).to_owned(),
        None => format!("method {}.{}", id.0, id.1),
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// One frame, its payload borrowed from the input.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frame<'a> {
    pub kind: u8,
    pub channel: u16,
    pub payload: &'a [u8],
}

/// The first complete frame in `input` and its length in bytes; `Ok(None)` when `input`
/// ends first. A frame of more than `frame_max` bytes (with header and end byte) is an
/// error.
pub(crate) fn parse(input: &[u8], frame_max: u32) -> io::Result<Option<(Frame<'_>, usize)>> {
    if input.len() >= 4 && input[..4] == PROTOCOL_HEADER[..4] {
        // A server that does not speak our version answers with the header of one it
        // does, then closes.
        let version = input
            .get(4..8)
            .map(|v| format!(" {v:?}"))
            .unwrap_or_default();
        return Err(invalid(format!(
            "the server refused AMQP 0-9-1 and offered protocol header AMQP{version}"
        )));
    }
    let Some(header) = input.get(..FRAME_HEADER) else {
        return Ok(None);
    };
    let kind = header[0];
    let channel = u16::from_be_bytes([header[1], header[2]]);
    let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]);
    if !matches!(kind, METHOD | HEADER | BODY | HEARTBEAT) {
        return Err(invalid(format!("unknown AMQP frame type {kind}")));
    }
    if u64::from(size) + FRAME_OVERHEAD as u64 > u64::from(frame_max) {
        return Err(invalid(format!(
            "AMQP frame of {size} payload bytes is over the frame size limit of {frame_max}"
        )));
    }
    let size = size as usize; // at most frame_max: fits
    let total = FRAME_OVERHEAD + size;
    let Some(frame) = input.get(..total) else {
        return Ok(None);
    };
    let end = frame[total - 1];
    if end != FRAME_END {
        return Err(invalid(format!(
            "AMQP frame ends with 0x{end:02x} instead of 0xce (type {kind}, channel {channel}, \
             {size} bytes)"
        )));
    }
    Ok(Some((
        Frame {
            kind,
            channel,
            payload: &frame[FRAME_HEADER..total - 1],
        },
        total,
    )))
}

/// Reads method arguments and content headers field by field; running out of bytes is an
/// `InvalidData` error naming `what` was being read.
pub(crate) struct Args<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Args<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Args<'a> {
        Args { bytes, what }
    }

    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(invalid(format!(
                "truncated {}: {} bytes short",
                self.what,
                n - self.bytes.len()
            )));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> io::Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self) -> io::Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self) -> io::Result<u64> {
        let b = self.take(8)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    pub(crate) fn short_str(&mut self) -> io::Result<&'a [u8]> {
        let len = self.u8()?;
        self.take(usize::from(len))
    }

    /// A long string, or a field table (skipped the same way: length and bytes).
    pub(crate) fn long_str(&mut self) -> io::Result<&'a [u8]> {
        let len = self.u32()?;
        self.take(len as usize)
    }
}

/// Encodes one method frame.
pub(crate) struct MethodFrame {
    buf: Vec<u8>,
}

impl MethodFrame {
    pub(crate) fn new(channel: u16, class: u16, method: u16) -> MethodFrame {
        let mut buf = Vec::with_capacity(64);
        buf.push(METHOD);
        buf.extend_from_slice(&channel.to_be_bytes());
        buf.extend_from_slice(&[0; 4]); // size, set by `finish`
        buf.extend_from_slice(&class.to_be_bytes());
        buf.extend_from_slice(&method.to_be_bytes());
        MethodFrame { buf }
    }

    pub(crate) fn u8(mut self, v: u8) -> Self {
        self.buf.push(v);
        self
    }

    pub(crate) fn u16(mut self, v: u16) -> Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub(crate) fn u32(mut self, v: u32) -> Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// A short string; callers check the length (at most 255) first.
    pub(crate) fn short_str(mut self, s: &[u8]) -> Self {
        debug_assert!(s.len() <= 255);
        self.buf.push(s.len().min(255) as u8);
        self.buf.extend_from_slice(&s[..s.len().min(255)]);
        self
    }

    pub(crate) fn long_str(mut self, s: &[u8]) -> Self {
        self.buf.extend_from_slice(&(s.len() as u32).to_be_bytes());
        self.buf.extend_from_slice(s);
        self
    }

    /// An empty field table.
    pub(crate) fn empty_table(self) -> Self {
        self.u32(0)
    }

    /// The frame with its size and end byte.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let size = (self.buf.len() - FRAME_HEADER) as u32;
        self.buf[3..7].copy_from_slice(&size.to_be_bytes());
        self.buf.push(FRAME_END);
        self.buf
    }
}

/// Appends a frame header (type, channel, size) to `out`.
pub(crate) fn push_frame_header(out: &mut Vec<u8>, kind: u8, channel: u16, size: usize) {
    out.push(kind);
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(&(size as u32).to_be_bytes());
}

/// Appends a whole content header frame for class Basic, no properties.
pub(crate) fn push_content_header(out: &mut Vec<u8>, channel: u16, body_size: u64) {
    push_frame_header(out, HEADER, channel, 14);
    out.extend_from_slice(&60u16.to_be_bytes()); // class Basic
    out.extend_from_slice(&0u16.to_be_bytes()); // weight
    out.extend_from_slice(&body_size.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes()); // property flags: none
    out.push(FRAME_END);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        push_frame_header(&mut out, kind, channel, payload.len());
        out.extend_from_slice(payload);
        out.push(FRAME_END);
        out
    }

    #[test]
    fn parses_a_frame_and_leaves_the_next() {
        let mut input = frame(METHOD, 1, b"\x00\x3c\x00\x28abc");
        input.extend(frame(HEARTBEAT, 0, b""));
        let (f, n) = parse(&input, 131072).unwrap().unwrap();
        assert_eq!(
            f,
            Frame {
                kind: METHOD,
                channel: 1,
                payload: b"\x00\x3c\x00\x28abc"
            }
        );
        assert_eq!(n, 15);
        let (f, n) = parse(&input[n..], 131072).unwrap().unwrap();
        assert_eq!(
            f,
            Frame {
                kind: HEARTBEAT,
                channel: 0,
                payload: b""
            }
        );
        assert_eq!(n, 8);
    }

    #[test]
    fn every_split_point_waits_for_more() {
        let input = frame(BODY, 7, &[0x5a; 100]);
        for cut in 0..input.len() {
            assert_eq!(
                parse(&input[..cut], 131072).unwrap(),
                None,
                "prefix of {cut} bytes"
            );
        }
        assert!(parse(&input, 131072).unwrap().is_some());
    }

    #[test]
    fn hostile_sizes_are_refused_from_the_header() {
        // Only the 7 header bytes: the size alone decides, no waiting for 4 GiB.
        let mut huge = Vec::new();
        push_frame_header(&mut huge, BODY, 1, u32::MAX as usize);
        let e = parse(&huge, 131072).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("over the frame size limit"), "{e}");
        // Exactly frame_max is fine, one more is not.
        assert!(parse(&frame(BODY, 1, &[0; 4096 - 8]), 4096)
            .unwrap()
            .is_some());
        assert!(parse(&frame(BODY, 1, &[0; 4096 - 7]), 4096).is_err());
    }

    #[test]
    fn wrong_end_byte_and_type_are_invalid() {
        let mut input = frame(METHOD, 0, b"abcd");
        *input.last_mut().unwrap() = 0xCD;
        let e = parse(&input, 131072).unwrap_err();
        assert!(e.to_string().contains("0xcd instead of 0xce"), "{e}");
        let e = parse(&frame(5, 0, b""), 131072).unwrap_err();
        assert!(e.to_string().contains("unknown AMQP frame type 5"), "{e}");
        let e = parse(b"AMQP\x00\x00\x09\x01", 131072).unwrap_err();
        assert!(e.to_string().contains("refused AMQP 0-9-1"), "{e}");
    }

    #[test]
    fn args_are_bounds_checked() {
        let mut a = Args::new(b"\x00\x05abc", "Test.Method");
        assert_eq!(a.u8().unwrap(), 0);
        let e = a.short_str().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(
            e.to_string()
                .contains("truncated Test.Method: 2 bytes short"),
            "{e}"
        );
        let mut a = Args::new(b"\xff\xff\xff\xff", "Table");
        assert!(a.long_str().is_err());
        let mut a = Args::new(
            b"\x00\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x03\x02hi",
            "T",
        );
        assert_eq!(a.u16().unwrap(), 1);
        assert_eq!(a.u32().unwrap(), 2);
        assert_eq!(a.u64().unwrap(), 3);
        assert_eq!(a.short_str().unwrap(), b"hi");
        assert!(a.u8().is_err());
    }

    #[test]
    fn method_frames_and_content_headers_encode() {
        let f = MethodFrame::new(1, 20, 10).short_str(b"").finish();
        assert_eq!(f, b"\x01\x00\x01\x00\x00\x00\x05\x00\x14\x00\x0a\x00\xce");
        let mut h = Vec::new();
        push_content_header(&mut h, 1, 1 << 20);
        let (f, n) = parse(&h, 4096).unwrap().unwrap();
        assert_eq!(n, h.len());
        assert_eq!(f.kind, HEADER);
        let mut a = Args::new(f.payload, "header");
        assert_eq!(
            (a.u16().unwrap(), a.u16().unwrap(), a.u64().unwrap()),
            (60, 0, 1 << 20)
        );
    }

    /// Random frames (valid ones with random bytes flipped, and random bytes) and all their
    /// prefixes: parsing never panics, and a frame it returns lies within the input.
    #[test]
    fn random_input_never_panics() {
        let mut next = crate::brokers::xorshift(1);
        for _ in 0..20_000 {
            let payload: Vec<u8> = (0..next() % 24).map(|_| next() as u8).collect();
            let mut input = frame((next() % 10) as u8, 1, &payload);
            for _ in 0..next() % 3 {
                let at = (next() % input.len() as u64) as usize;
                input[at] = next() as u8;
            }
            for cut in 0..=input.len() {
                if let Ok(Some((f, n))) = parse(&input[..cut], 4096) {
                    assert!(n <= cut && f.payload.len() + FRAME_OVERHEAD == n);
                    let mut a = Args::new(f.payload, "random");
                    while a.short_str().is_ok() {}
                }
            }
        }
    }
}
