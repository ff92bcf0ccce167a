//! What a run measures.

use serde::{Deserialize, Serialize};

/// What a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Ping-pong: one message in flight, the peer answers each with one of the same size.
    Latency,
    /// A window of messages in flight; the peer acknowledges cumulatively.
    Throughput,
}

impl Mode {
    /// The name used on the command line and in output.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Latency => "latency",
            Mode::Throughput => "throughput",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_as_its_name() {
        for m in [Mode::Latency, Mode::Throughput] {
            let json = serde_json::to_string(&m).unwrap();
            assert_eq!(json, format!("\"{}\"", m.name()));
            assert_eq!(serde_json::from_str::<Mode>(&json).unwrap(), m);
        }
    }
}
