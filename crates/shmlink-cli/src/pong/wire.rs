//! pong's handshake around the measurement core's run ([`shmlink_measure::protocol`]),
//! for a server and a client started separately (other processes, other containers):
//!
//! ```text
//! client                                   server
//!   Hello {version, mode, size, count, warmup, window, one_in, seed, zero_copy} ─▶
//!                                          ◀─ Ready            (or a failure notice)
//!   the core's run: warm-up, MARK, measured part, STOP ─▶ (data echoed or acknowledged)
//!                                          ◀─ Report {msgs, cpu_ns, verify_ns}
//!   closes                                    waits for the close
//! ```
//!
//! A control message is an 8-byte tag and a JSON object. A server that gives up sends
//! the core's failure notice ([`shmlink_measure::link::failure_notice`]) with its reason
//! in place of its next message.

use serde::{Deserialize, Serialize};
use shmlink_measure::link::Access;
use shmlink_measure::protocol::{PeerReport, MIN_SIZE};
use shmlink_measure::Mode;

/// Version of this handshake, carried in the hello. 3: the run is the measurement
/// core's (MARK, FLUSH and STOP control messages), the report the core's. 4: the hello
/// says which messages are checksummed in full (`one_in`, `seed`) and how both ends
/// move them (`zero_copy`).
pub const VERSION: u64 = 4;

const HELLO: &[u8; 8] = b"PONGHELO";
/// The server's answer to a hello it accepts.
pub const READY: &[u8; 8] = b"PONGREDY";
const REPORT: &[u8; 8] = b"PONGRPRT";

/// The client's description of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`VERSION`] of the client.
    pub version: u64,
    pub mode: Mode,
    /// Bytes per data message.
    pub size: u64,
    /// Measured messages (after the warm-up).
    pub count: u64,
    /// Messages sent before the measured ones.
    pub warmup: u64,
    /// Most unacknowledged messages (1 in latency mode).
    pub window: u64,
    /// One measured message in this many is checksummed in full (1: all of them), the
    /// others have their length and sequence numbers checked
    /// ([`shmlink_measure::verify`]).
    pub one_in: u64,
    /// Chooses the sample; drawn by the client for each run.
    pub seed: u64,
    /// Both ends write messages in place (`reserve`/`commit`) and read them with
    /// `recv_ref`, instead of `send` and `recv`, which copy.
    pub zero_copy: bool,
}

/// The `version` field alone, read first so that a hello of another version is refused
/// with the version named rather than with whatever field changed.
#[derive(Deserialize)]
struct Versioned {
    version: u64,
}

/// `tag` followed by `value` as JSON.
fn encode(tag: &[u8; 8], value: &impl Serialize) -> Vec<u8> {
    let mut out = tag.to_vec();
    serde_json::to_writer(&mut out, value).expect("a control message serialises");
    out
}

/// The JSON after `tag` in `msg`, or what `msg` is instead.
fn body<'a>(msg: &'a [u8], tag: &[u8; 8], what: &str) -> Result<&'a [u8], String> {
    msg.strip_prefix(tag).ok_or_else(|| {
        format!(
            "{}-byte message starting {:02x?} where a {what} was expected",
            msg.len(),
            &msg[..msg.len().min(8)]
        )
    })
}

/// How an end of the run `hello` describes moves its messages: in place for messages
/// under 8 bytes too, where the run's 8-byte control messages would not fit the
/// receiver's buffer ([`shmlink_measure::protocol::MIN_SIZE`]).
pub fn access(hello: &Hello) -> Access {
    if hello.zero_copy || hello.size < MIN_SIZE as u64 {
        Access::InPlace
    } else {
        Access::Copy
    }
}

impl Hello {
    /// Messages sent in all: the warm-up and the measured ones.
    pub fn total(&self) -> u64 {
        self.warmup + self.count
    }

    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        encode(HELLO, self)
    }

    /// Parses and checks a hello.
    pub fn decode(msg: &[u8]) -> Result<Hello, String> {
        let json = body(msg, HELLO, "hello")?;
        let v: Versioned =
            serde_json::from_slice(json).map_err(|e| format!("unreadable hello: {e}"))?;
        if v.version != VERSION {
            return Err(format!(
                "client speaks pong protocol version {}, this server {VERSION}",
                v.version
            ));
        }
        let h: Hello =
            serde_json::from_slice(json).map_err(|e| format!("unreadable hello: {e}"))?;
        if h.count == 0 || h.window == 0 || h.one_in == 0 {
            return Err("hello with count, window or one_in 0".into());
        }
        if h.mode == Mode::Latency && h.window != 1 {
            return Err(format!("latency hello with window {}", h.window));
        }
        Ok(h)
    }
}

/// The report message's bytes.
pub fn encode_report(r: &PeerReport) -> Vec<u8> {
    encode(REPORT, r)
}

/// Parses a report.
pub fn decode_report(msg: &[u8]) -> Result<PeerReport, String> {
    serde_json::from_slice(body(msg, REPORT, "report")?)
        .map_err(|e| format!("unreadable report: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            version: VERSION,
            mode: Mode::Throughput,
            size: 4096,
            count: 10,
            warmup: 1,
            window: 64,
            one_in: 16,
            seed: 7,
            zero_copy: false,
        }
    }

    #[test]
    fn round_trip() {
        assert_eq!(Hello::decode(&hello().encode()), Ok(hello()));
        let r = PeerReport {
            msgs: 1,
            cpu_ns: 2,
            verify_ns: 3,
        };
        assert_eq!(decode_report(&encode_report(&r)), Ok(r));
    }

    #[test]
    fn bad_messages_are_refused() {
        assert!(Hello::decode(b"short").is_err());
        assert!(Hello::decode(READY).unwrap_err().contains("where a hello"));
        let old = Hello {
            version: 99,
            ..hello()
        };
        assert!(Hello::decode(&old.encode())
            .unwrap_err()
            .contains("version 99"));
        let zero = Hello {
            count: 0,
            ..hello()
        };
        assert!(Hello::decode(&zero.encode()).is_err());
        let unsampled = Hello {
            one_in: 0,
            ..hello()
        };
        assert!(Hello::decode(&unsampled.encode()).is_err());
        assert!(Hello::decode(b"PONGHELO{\"version\":4}")
            .unwrap_err()
            .contains("unreadable"));
        assert!(decode_report(&hello().encode()).is_err());
    }
}
