//! The attachment a bridge puts on every message it sends to Zenoh: who sent it (the
//! origin bridge's id), its place in the origin's sequence, and the topic's ring
//! geometry, so the receiving bridge can create the local topic with the same policy
//! and maximum message size, count what the network dropped, and drop its own messages.
//!
//! Layout (37 bytes, little-endian): `b"SHZ1"`, origin id (16 bytes), sequence (u64),
//! policy (u8: 0 Block, 1 Overwrite), maximum message size (u32), slots (u32).
//! Messages from other Zenoh applications carry no attachment (or another one): the
//! bridge treats them as coming from an unknown origin ([`Header::decode`] gives `None`).

use shmlink::Policy;

/// The attachment's first bytes.
pub const MAGIC: &[u8; 4] = b"SHZ1";
/// The attachment's length.
pub const LEN: usize = 37;

/// What a bridge says about each message it sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The sending bridge's id (random, chosen when the bridge starts).
    pub origin: u128,
    /// The message's sequence number in its origin topic, as the sending bridge counts
    /// them: messages the sending bridge lost locally (`Overwrite` lag) are skipped, so a
    /// gap seen by the receiver is what was lost before the receiver, in total.
    pub seq: u64,
    /// The topic's policy on its origin host.
    pub policy: Policy,
    /// The topic's largest message on its origin host.
    pub max_msg: u32,
    /// The topic's slots on its origin host.
    pub slots: u32,
}

impl Header {
    /// The 37 bytes of the attachment.
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4..20].copy_from_slice(&self.origin.to_le_bytes());
        b[20..28].copy_from_slice(&self.seq.to_le_bytes());
        b[28] = match self.policy {
            Policy::Block => 0,
            Policy::Overwrite => 1,
        };
        b[29..33].copy_from_slice(&self.max_msg.to_le_bytes());
        b[33..37].copy_from_slice(&self.slots.to_le_bytes());
        b
    }

    /// Reads an attachment; `None` for anything that is not exactly a valid one (another
    /// application's attachment, a truncated or hostile one).
    pub fn decode(b: &[u8]) -> Option<Header> {
        if b.len() != LEN || &b[..4] != MAGIC {
            return None;
        }
        let policy = match b[28] {
            0 => Policy::Block,
            1 => Policy::Overwrite,
            _ => return None,
        };
        Some(Header {
            origin: u128::from_le_bytes(b[4..20].try_into().ok()?),
            seq: u64::from_le_bytes(b[20..28].try_into().ok()?),
            policy,
            max_msg: u32::from_le_bytes(b[29..33].try_into().ok()?),
            slots: u32::from_le_bytes(b[33..37].try_into().ok()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hostile_input() {
        let h = Header {
            origin: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10,
            seq: 42,
            policy: Policy::Overwrite,
            max_msg: 1 << 20,
            slots: 64,
        };
        let b = h.encode();
        assert_eq!(Header::decode(&b), Some(h));
        assert_eq!(Header::decode(&b[..LEN - 1]), None);
        assert_eq!(Header::decode(&[]), None);
        let mut bad = b;
        bad[28] = 7;
        assert_eq!(Header::decode(&bad), None);
        let mut bad = b;
        bad[0] = b'X';
        assert_eq!(Header::decode(&bad), None);
        let mut long = b.to_vec();
        long.push(0);
        assert_eq!(Header::decode(&long), None);
    }
}
