//! What a pub/sub message carries, and the clocks the run reads.
//!
//! A message of `n ≥ 8` bytes is
//!
//! | bytes | content |
//! |---|---|
//! | `0..4` | the publisher's `CLOCK_MONOTONIC` in ns, low 32 bits, little-endian, read just before the publish call |
//! | `4..n` | the suite's data message `seq` of `n - 4` bytes ([`shmlink_measure::payload`]) |
//!
//! The subscriber reads the same clock when the message is in its hands and takes the
//! difference modulo 2³² (exact for latencies under 4.29 s; the run fails long before).
//! The payload part is verified in full at every subscriber, every message: both copies
//! of its sequence number, and from 28 bytes on the checksum over every other byte
//! (shorter messages are compared byte for byte: an 8-byte message carries the low 32
//! bits of the sequence number).

use shmlink_sys::process::{clock_ns, Clock};
use std::time::Duration;

use shmlink_measure::payload::{self, VerifyError};
use shmlink_measure::protocol::Fault;

/// Bytes of the timestamp in front of the payload.
pub const STAMP: usize = 4;
/// Smallest message: the timestamp and 4 bytes of sequence number.
pub const MIN_SIZE: usize = 8;

/// `CLOCK_MONOTONIC` in ns (the same clock in every process of the machine).
#[inline]
pub fn now_ns() -> u64 {
    clock_ns(Clock::Monotonic)
}

/// CPU time of this process (all threads), `CLOCK_PROCESS_CPUTIME_ID`.
pub fn process_cpu() -> Duration {
    Duration::from_nanos(clock_ns(Clock::ProcessCpu))
}

/// CPU time of the calling thread, `CLOCK_THREAD_CPUTIME_ID`.
#[inline]
pub fn thread_cpu() -> Duration {
    Duration::from_nanos(clock_ns(Clock::ThreadCpu))
}

/// Writes the payload of message `seq` over `buf[STAMP..]` (the stamp comes last, just
/// before publishing).
pub fn fill(buf: &mut [u8], seq: u64) {
    payload::write(&mut buf[STAMP..], seq);
}

/// Damages the payload of message `seq` in `buf` as `fault` says, if it hits `seq` (for
/// tests: every subscriber's [`verify`] must catch it).
pub fn damage(buf: &mut [u8], seq: u64, fault: Option<Fault>) {
    if let Some(f) = fault {
        f.damage(&mut buf[STAMP..], seq);
    }
}

/// Writes the current time into `buf[..STAMP]`.
#[inline]
pub fn stamp(buf: &mut [u8]) {
    buf[..STAMP].copy_from_slice(&(now_ns() as u32).to_le_bytes());
}

/// The time from the stamp in `msg` to `now` (ns, from [`now_ns`]).
#[inline]
pub fn latency(msg: &[u8], now: u64) -> u64 {
    let sent = u32::from_le_bytes(msg[..STAMP].try_into().expect("a stamp"));
    u64::from((now as u32).wrapping_sub(sent))
}

/// Checks that `msg` is message `seq` of `size` bytes, reading every byte but the stamp.
pub fn verify(msg: &[u8], seq: u64, size: usize) -> Result<(), VerifyError> {
    if msg.len() != size || size < MIN_SIZE {
        return Err(VerifyError {
            seq,
            size,
            what: format!("got {} bytes", msg.len()),
        });
    }
    payload::verify(&msg[STAMP..], seq, size - STAMP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_verify_and_carry_their_latency() {
        for size in [8, 9, 19, 20, 64, 65536] {
            let mut buf = vec![0u8; size];
            for seq in [0, 1, 77, u32::MAX as u64 + 5] {
                fill(&mut buf, seq);
                stamp(&mut buf);
                verify(&buf, seq, size).unwrap();
                assert!(verify(&buf, seq + 1, size).is_err(), "{size} {seq}");
                let lat = latency(&buf, now_ns());
                assert!(lat < 1_000_000_000, "{lat}");
            }
            buf[size - 1] ^= 1;
            assert!(verify(&buf, u32::MAX as u64 + 5, size).is_err());
        }
        assert!(verify(&[0u8; 7], 0, 7).is_err());
        assert!(verify(&[0u8; 8], 0, 9).is_err());
    }

    #[test]
    fn latency_wraps_at_32_bits() {
        let mut msg = [0u8; 8];
        msg[..4].copy_from_slice(&(u32::MAX - 9).to_le_bytes());
        assert_eq!(latency(&msg, (1u64 << 32) + 10), 20);
    }

    #[test]
    fn clocks_move() {
        let (a, c) = (now_ns(), process_cpu());
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(now_ns() > a && process_cpu() > c && thread_cpu() > Duration::ZERO);
    }
}
