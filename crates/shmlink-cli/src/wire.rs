//! The pong control messages exchanged around the data messages of a run.
//!
//! ```text
//! client                                   server
//!   Hello {mode, size, count, warmup, window} ─▶
//!                                          ◀─ Ready            (or Refused {reason})
//!   data #0 … #warmup+count-1             ─▶
//!                                          ◀─ latency: data #i echoed per message
//!                                          ◀─ throughput: Ack {received} (cumulative)
//!                                          ◀─ Report {msgs, bytes, cpu_ns}
//! ```
//!
//! Every control message starts with an 8-byte tag and carries little-endian `u64`
//! fields; decoding checks the tag and the exact length. A server that fails (for example
//! a message that does not verify) sends `Failed {reason}` in place of its next message.

use std::fmt;

/// Version of this protocol, carried in the hello. 2: data messages carry their sequence
/// number in their last 8 bytes too ([`shmlink_bench::payload`]).
pub const VERSION: u64 = 2;

const HELLO: &[u8; 8] = b"PONGHELO";
const READY: &[u8; 8] = b"PONGREDY";
const ACK: &[u8; 8] = b"PONGACK\0";
const REPORT: &[u8; 8] = b"PONGRPRT";
const FAILED: &[u8; 8] = b"PONGFAIL";

/// Longest reason text sent in a `Failed` message.
const MAX_REASON: usize = 4096;

/// What a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One message in flight; the server echoes each message.
    Latency,
    /// Up to `window` messages in flight; the server acknowledges cumulatively.
    Throughput,
}

/// The client's description of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub mode: Mode,
    /// Bytes per data message.
    pub size: u64,
    /// Measured messages (after the warm-up).
    pub count: u64,
    /// Messages sent before the measured ones.
    pub warmup: u64,
    /// Most unacknowledged messages (1 in latency mode).
    pub window: u64,
}

impl Hello {
    /// Messages sent in all: the warm-up and the measured ones.
    pub fn total(&self) -> u64 {
        self.warmup + self.count
    }

    /// The server acknowledges every `ack_every` messages (and the last warm-up and the
    /// last message). At most half the window, so the client never waits for an ack that
    /// the server would only send after more data.
    pub fn ack_every(&self) -> u64 {
        self.window.div_ceil(2).max(1)
    }
}

/// The server's account of the measured part of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// Messages received and verified (warm-up included).
    pub msgs: u64,
    /// Bytes received and verified (warm-up included).
    pub bytes: u64,
    /// User + system CPU time the server used during the measured part.
    pub cpu_ns: u64,
}

/// A control message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    Hello(Hello),
    Ready,
    /// Messages received so far.
    Ack(u64),
    Report(Report),
    /// The server gave up; the reason.
    Failed(String),
}

/// A message that is not the control message expected.
#[derive(Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DecodeError {}

fn put(out: &mut Vec<u8>, fields: &[u64]) {
    for f in fields {
        out.extend_from_slice(&f.to_le_bytes());
    }
}

/// The `N` fields after the tag of `msg`, which must be exactly `8 + 8·N` bytes.
fn fields<const N: usize>(msg: &[u8], what: &str) -> Result<[u64; N], DecodeError> {
    if msg.len() != 8 + 8 * N {
        return Err(DecodeError(format!(
            "{what} message of {} bytes, expected {}",
            msg.len(),
            8 + 8 * N
        )));
    }
    let mut f = [0u64; N];
    for (i, f) in f.iter_mut().enumerate() {
        *f = u64::from_le_bytes(msg[8 + 8 * i..16 + 8 * i].try_into().unwrap());
    }
    Ok(f)
}

impl Control {
    /// What the message is, for error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Control::Hello(_) => "hello",
            Control::Ready => "ready",
            Control::Ack(_) => "ack",
            Control::Report(_) => "report",
            Control::Failed(_) => "failure notice",
        }
    }

    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        match self {
            Control::Hello(h) => {
                out.extend_from_slice(HELLO);
                let mode = match h.mode {
                    Mode::Latency => 0,
                    Mode::Throughput => 1,
                };
                put(
                    &mut out,
                    &[VERSION, mode, h.size, h.count, h.warmup, h.window],
                );
            }
            Control::Ready => out.extend_from_slice(READY),
            Control::Ack(n) => {
                out.extend_from_slice(ACK);
                put(&mut out, &[*n]);
            }
            Control::Report(r) => {
                out.extend_from_slice(REPORT);
                put(&mut out, &[r.msgs, r.bytes, r.cpu_ns]);
            }
            Control::Failed(reason) => {
                out.extend_from_slice(FAILED);
                let mut end = reason.len().min(MAX_REASON);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                out.extend_from_slice(&reason.as_bytes()[..end]);
            }
        }
        out
    }

    /// Parses a control message.
    pub fn decode(msg: &[u8]) -> Result<Control, DecodeError> {
        let Some(tag) = msg.get(..8) else {
            return Err(DecodeError(format!(
                "{}-byte message where a control message was expected",
                msg.len()
            )));
        };
        match tag {
            t if t == HELLO => {
                let [version, mode, size, count, warmup, window] = fields(msg, "hello")?;
                if version != VERSION {
                    return Err(DecodeError(format!(
                        "client speaks pong protocol version {version}, this server {VERSION}"
                    )));
                }
                let mode = match mode {
                    0 => Mode::Latency,
                    1 => Mode::Throughput,
                    m => return Err(DecodeError(format!("unknown mode {m} in hello"))),
                };
                if count == 0 || window == 0 {
                    return Err(DecodeError("hello with count or window 0".into()));
                }
                Ok(Control::Hello(Hello {
                    mode,
                    size,
                    count,
                    warmup,
                    window,
                }))
            }
            t if t == READY => fields::<0>(msg, "ready").map(|_| Control::Ready),
            t if t == ACK => fields(msg, "ack").map(|[n]| Control::Ack(n)),
            t if t == REPORT => fields(msg, "report").map(|[msgs, bytes, cpu_ns]| {
                Control::Report(Report {
                    msgs,
                    bytes,
                    cpu_ns,
                })
            }),
            t if t == FAILED => Ok(Control::Failed(
                String::from_utf8_lossy(&msg[8..msg.len().min(8 + MAX_REASON)]).into_owned(),
            )),
            _ => Err(DecodeError(format!(
                "{}-byte message starting {:02x?} where a control message was expected",
                msg.len(),
                &msg[..8]
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let hello = Hello {
            mode: Mode::Throughput,
            size: 4096,
            count: 10,
            warmup: 1,
            window: 64,
        };
        for c in [
            Control::Hello(hello),
            Control::Ready,
            Control::Ack(77),
            Control::Report(Report {
                msgs: 1,
                bytes: 2,
                cpu_ns: 3,
            }),
            Control::Failed("message #3 failed".into()),
        ] {
            assert_eq!(Control::decode(&c.encode()).unwrap(), c);
        }
    }

    #[test]
    fn bad_messages_are_refused() {
        assert!(Control::decode(b"short").is_err());
        let mut ack = Control::Ack(1).encode();
        ack.push(0);
        assert!(Control::decode(&ack).unwrap_err().0.contains("17 bytes"));
        let mut hello = Control::Hello(Hello {
            mode: Mode::Latency,
            size: 1,
            count: 1,
            warmup: 0,
            window: 1,
        })
        .encode();
        hello[8] = 99; // version
        assert!(Control::decode(&hello)
            .unwrap_err()
            .0
            .contains("version 99"));
        assert!(Control::decode(&[0u8; 16]).is_err());
    }

    #[test]
    fn ack_every_never_exceeds_the_window() {
        for window in 1..200 {
            let h = Hello {
                mode: Mode::Throughput,
                size: 1,
                count: 1,
                warmup: 0,
                window,
            };
            assert!((1..=window).contains(&h.ack_every()));
        }
    }
}
