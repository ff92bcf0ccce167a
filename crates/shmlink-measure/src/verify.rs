//! Which messages of a point-to-point run are checksummed in full, and what that costs.
//!
//! Every data message of every method has its length and both copies of its sequence
//! number checked ([`payload::check_ends`]). On top of that every byte is checksummed
//! ([`payload::verify`]) for
//!
//! - the first [`laps`] messages of the run: at least two laps of the largest ring any
//!   method here runs at that size (1 MiB, see [`LAP_BYTES`]), so records that wrap
//!   around a ring's end are checked twice over; normally all inside the warm-up;
//! - a pseudo-random one in [`Sampling::one_in`] of the rest, chosen from a seed that
//!   the driver draws at the start of each run and hands to the peer's checker only, so
//!   the method (which sees neither the seed nor the choice) cannot tell which messages
//!   are read in full; driver and peer pick the same sequence numbers, so both
//!   directions of a round trip are checksummed together;
//!
//! A zero-copy (`-zc`) row's receiver has no copy of a message, so every message it
//! does not checksum it reads in full in place ([`payload::read_all`]): the read is what
//! a copying row's copy does too, and it is part of what the row measures.
//!
//! In latency mode a round trip whose messages were sampled is not timed (the checksums
//! would otherwise be charged to the method): its round-trip time is left out of the
//! percentiles, and since the method cannot see the choice, the timed round trips are a
//! fair sample of all of them. The laps at the start are timed (they normally lie in the
//! warm-up). In throughput mode the receiver's checksums lie inside the measured
//! interval; the time spent in them is reported ([`Checker::spent`]) so its share can be
//! read off.

use std::io;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::checksum::fmix64;
use crate::payload::{self, VerifyError};
use crate::sys::{err, random_bytes};

/// Bytes of the largest ring a method runs (the shared-memory rings of `shmlink-*` and
/// `shm-*`; a larger message gets a ring of at most four times its size, which 32
/// messages cover twice).
pub const LAP_BYTES: usize = 1 << 20;
/// Fewest messages checksummed at the start of a run.
const MIN_FULL: u64 = 32;

/// The first messages of a run of `size`-byte messages that are checksummed in full:
/// at least two laps of a [`LAP_BYTES`] ring, and at least 32.
pub fn laps(size: usize) -> u64 {
    (2 * LAP_BYTES.div_ceil(size.max(1)) as u64).max(MIN_FULL)
}

/// How many measured messages are checksummed in full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sampling {
    /// One in this many, chosen at random (1: every message, all timed).
    pub one_in: u64,
}

impl Sampling {
    /// What `shmlink-bench` runs with: one message in 16.
    pub const DEFAULT: Sampling = Sampling { one_in: 16 };
    /// Every byte of every message (round trips then are timed with their checksums).
    pub const ALL: Sampling = Sampling { one_in: 1 };
}

/// A fresh seed for a run's sample, from the kernel's random source.
pub fn fresh_seed() -> io::Result<u64> {
    let mut seed = [0u8; 8];
    random_bytes(&mut seed).map_err(|e| err(format!("draw the sample's seed: {e}")))?;
    Ok(u64::from_le_bytes(seed))
}

/// One end's checks of the data messages it receives.
pub struct Checker {
    size: usize,
    seed: u64,
    one_in: u64,
    laps: u64,
    in_place: bool,
    spent: Duration,
}

impl Checker {
    /// The checks of a run of `size`-byte messages; `in_place`: the method is a
    /// zero-copy row (every message is read in full in place).
    pub fn new(size: usize, sampling: Sampling, seed: u64, in_place: bool) -> Checker {
        Checker {
            size,
            seed,
            one_in: sampling.one_in.max(1),
            laps: laps(size),
            in_place,
            spent: Duration::ZERO,
        }
    }

    /// Whether message `seq` is in the random sample.
    pub fn sampled(&self, seq: u64) -> bool {
        // The hash scaled to 0..one_in by a multiply (the high half of the product) rather
        // than reduced by a division, which cost more than the rest of a 64 B message's
        // checks: 0 with a chance of 1 in `one_in`.
        let h = fmix64(self.seed ^ seq.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        self.one_in == 1 || (u128::from(h) * u128::from(self.one_in)) >> 64 == 0
    }

    /// Whether every byte of message `seq` is checksummed.
    pub fn full(&self, seq: u64) -> bool {
        seq < self.laps || self.sampled(seq)
    }

    /// Whether round trip `seq` is timed (latency mode): all but the sampled round
    /// trips, unless every message is sampled.
    pub fn timed(&self, seq: u64) -> bool {
        self.one_in == 1 || seq < self.laps || !self.sampled(seq)
    }

    /// Checks that `msg` is data message `seq`, in full where [`Checker::full`] says so;
    /// otherwise its ends, and for a zero-copy row every byte is read.
    pub fn check(&mut self, msg: &[u8], seq: u64) -> Result<(), VerifyError> {
        if !self.full(seq) {
            if self.in_place {
                payload::read_all(msg);
            }
            return payload::check_ends(msg, seq, self.size);
        }
        if self.one_in == 1 {
            // Every message: the checks are part of what is measured (pong), and two
            // clock reads per message would be too.
            return payload::verify(msg, seq, self.size);
        }
        let t = Instant::now();
        let res = payload::verify(msg, seq, self.size);
        self.spent += t.elapsed();
        res
    }

    /// Time spent in full checksums since the last [`Checker::reset_spent`] (zero when
    /// every message is checked: [`Sampling::ALL`]).
    pub fn spent(&self) -> Duration {
        self.spent
    }

    /// Starts counting [`Checker::spent`] afresh (at the start of the measured part).
    pub fn reset_spent(&mut self) {
        self.spent = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_cover_two_rings_and_at_least_32_messages() {
        assert_eq!(laps(64), 2 * (1 << 20) / 64);
        assert_eq!(laps(1000), 2 * 1049);
        assert_eq!(laps(1 << 20), 32);
        assert_eq!(laps(16 << 20), 32);
    }

    #[test]
    fn the_sample_is_about_one_in_16_and_depends_on_the_seed() {
        let a = Checker::new(64, Sampling::DEFAULT, 1, false);
        let b = Checker::new(64, Sampling::DEFAULT, 2, false);
        let range = laps(64)..laps(64) + 160_000;
        let n = range.clone().filter(|&s| a.sampled(s)).count();
        assert!((9_000..11_000).contains(&n), "{n} of 160000");
        assert!(range.clone().all(|s| a.full(s) == a.sampled(s)));
        assert!(range.clone().all(|s| a.timed(s) != a.sampled(s)));
        let same = range.filter(|&s| a.sampled(s) && b.sampled(s)).count();
        assert!(
            same < n / 4,
            "seeds 1 and 2 pick {same} of the same messages"
        );
        assert!((0..laps(64)).all(|s| a.full(s) && a.timed(s)), "the laps");
    }

    #[test]
    fn sample_all_checks_and_times_every_message() {
        let all = Checker::new(64, Sampling::ALL, 7, false);
        for s in (0..100).chain(1 << 40..(1 << 40) + 100) {
            assert!(all.full(s) && all.timed(s));
        }
    }

    #[test]
    fn a_corrupt_body_is_caught_only_by_a_full_check() {
        let mut c = Checker::new(4096, Sampling::DEFAULT, 3, false);
        let seq = (laps(4096)..).find(|&s| !c.sampled(s)).unwrap();
        let mut msg = vec![0u8; 4096];
        payload::write(&mut msg, seq);
        msg[2000] ^= 4;
        assert!(c.check(&msg, seq).is_ok(), "ends only");
        let seq = (laps(4096)..).find(|&s| c.sampled(s)).unwrap();
        payload::write(&mut msg, seq);
        msg[2000] ^= 4;
        assert!(c.check(&msg, seq).is_err(), "sampled: checksummed");
        msg[2000] ^= 4;
        msg[4095] ^= 1;
        assert!(c.check(&msg, seq).is_err(), "the trailer");
    }
}
