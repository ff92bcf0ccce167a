//! The two drivers and the peer's side of them, the same for every method and for
//! `shmlink pong`.
//!
//! Every message the driver sends has the run's size; its first 8 bytes are the sequence
//! number (see [`crate::payload`]) or one of three control tags:
//!
//! ```text
//! driver                                   peer
//!   data #0 … (warm-up: a time or a count) ─▶ verified; latency: answered with data #i,
//!                                             throughput: Ack(n) every ceil(window/2)
//!   FLUSH   (throughput, when the count   ─▶ answers Ack(received)
//!            sent is not a multiple of the
//!            ack interval)
//!   MARK                                  ─▶ starts its CPU clock; answers MARK
//!                                            (latency) or Ack(received) (throughput)
//!   data … (measured: a time or a count)  ─▶ as above; FLUSH as above at the end
//!   STOP                                  ─▶ stops its clock and returns its
//!                                            [`PeerReport`] (the bench's peer prints
//!                                            it on stdout, pong's server sends it back)
//! ```
//!
//! Acks are 8-byte little-endian counts of messages received. Messages shorter than a
//! control tag ([`MIN_SIZE`]) need an endpoint that keeps message boundaries and receives
//! in place ([`Endpoint::in_place`]): control messages are then 8 bytes long and told
//! from data by their length. A peer that fails tells the driver why where the endpoint
//! can ([`Endpoint::tell_failure`]). Every data message's length
//! and both copies of its sequence number are checked, and every byte of the first laps,
//! of a random sample and of every zero-copy row's message is checksummed (see
//! [`crate::verify`], which also says what is timed).

use std::io;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::clock::Clock;
use crate::endpoint::Endpoint;
use crate::mode::Mode;
use crate::payload::{self, MIN_CHECKSUMMED, TRAILER};
use crate::sys::{cpu_time, err};
use crate::verify::{Checker, Sampling};

/// Control tag: the warm-up is over.
pub const MARK: u64 = u64::MAX - 1;
/// Control tag: the run is over.
pub const STOP: u64 = u64::MAX;
/// Control tag (throughput): acknowledge what you received now.
pub const FLUSH: u64 = u64::MAX - 2;
/// Smallest message for every endpoint: room for the sequence number or a control tag.
/// Endpoints that receive in place take any size (see the module's docs).
pub const MIN_SIZE: usize = 8;
/// Fewest measured messages of a time-bounded run.
const MIN_MEASURED: u64 = 10;
/// Most round-trip samples kept (a time-bounded run stops there).
const MAX_SAMPLES: u64 = 20_000_000;

/// When the measured part ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// After exactly this many messages (round trips in latency mode).
    Count(u64),
    /// After this many milliseconds (and at least a few messages).
    Millis(u64),
}

/// When the warm-up ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Warmup {
    /// After this time, and at least one message (the bench).
    Time(Duration),
    /// After exactly this many messages, possibly none (`shmlink pong`).
    Count(u64),
}

/// What the driver does in a run.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Bytes per data message.
    pub size: usize,
    pub mode: Mode,
    /// Messages in flight in throughput mode (1 in latency mode).
    pub window: u64,
    pub warmup: Warmup,
    pub stop: Stop,
    /// Which messages are checksummed in full.
    pub sampling: Sampling,
    /// The sample's seed (the peer gets the same one).
    pub seed: u64,
    /// A fault the driver injects into the data it sends (throughput mode).
    pub fault: Option<Fault>,
}

/// What the driver measured.
#[derive(Debug)]
pub struct Measured {
    /// Round-trip times in ns (latency mode).
    pub rtts: Option<Vec<u64>>,
    /// Measured messages.
    pub count: u64,
    pub elapsed: Duration,
    /// This process's CPU time in the measured part.
    pub cpu: Duration,
    /// Time spent checksumming in the measured part (round trips whose copy-row
    /// messages were sampled are not in `rtts`).
    pub verify: Duration,
}

/// The control tag of `msg` in a run of `size`-byte messages, or `None` for a data
/// message.
fn tag_of(msg: &[u8], size: usize) -> Option<u64> {
    if msg.len() < MIN_SIZE || (size < MIN_SIZE && msg.len() == size) {
        return None;
    }
    let tag = u64::from_le_bytes(msg[..8].try_into().expect("checked above"));
    [MARK, STOP, FLUSH].contains(&tag).then_some(tag)
}

/// A control message with `tag` in a run of `size`-byte messages: the run's size, or a
/// tag's 8 bytes where messages are shorter.
fn control(size: usize, tag: u64) -> Vec<u8> {
    let mut msg = vec![0u8; size.max(MIN_SIZE)];
    msg[..8].copy_from_slice(&tag.to_le_bytes());
    msg
}

/// Sends data message `seq` of `out.len()` bytes: generated into `out` and sent, or, for
/// a zero-copy method, generated straight into its buffer, then damaged as `fault` says.
/// `full`: generated in full ([`payload::write`]); else only the bytes the receiver
/// checks of a message outside its sample ([`payload::write_ends`]).
fn send_data(
    ep: &mut dyn Endpoint,
    out: &mut [u8],
    seq: u64,
    fault: Option<Fault>,
    full: bool,
) -> io::Result<()> {
    let fill = |buf: &mut [u8]| {
        if full {
            payload::write(buf, seq);
        } else {
            payload::write_ends(buf, seq);
        }
        if let Some(f) = fault {
            f.damage(buf, seq);
        }
    };
    match ep.in_place() {
        Some(zc) => zc.send_in_place(out.len(), &mut { fill }),
        None => {
            fill(out);
            ep.send(out)
        }
    }
}

/// The data messages one end of a latency run sends, generated ahead: after sending
/// message `seq`, an end generates `seq + 1` while the other end answers, so the
/// generation (a checksum over the whole payload) is off the round trip's critical path
/// (it used to be on it at both ends). The bytes and their checks are the same; zero-copy
/// endpoints still generate in place, inside the round trip, as that is what they measure.
struct Outgoing {
    buf: Vec<u8>,
    /// The message `buf` holds, if generated ahead.
    ready: Option<u64>,
}

impl Outgoing {
    fn new(size: usize) -> Outgoing {
        Outgoing {
            buf: vec![0u8; size],
            ready: None,
        }
    }

    /// Sends data message `seq` (damaged as `fault` says, if it hits `seq`).
    fn send(&mut self, ep: &mut dyn Endpoint, seq: u64, fault: Option<Fault>) -> io::Result<()> {
        let fault = fault.filter(|f| f.hits(seq));
        if ep.in_place().is_some() || self.ready != Some(seq) {
            self.ready = None;
            return send_data(ep, &mut self.buf, seq, fault, true);
        }
        self.ready = None;
        ep.send(&self.buf)
    }

    /// Generates data message `seq` ahead (copying endpoints only): in full if the
    /// receiver checksums it (`full`, [`Checker::full`] from the seed both ends share),
    /// else only what the receiver reads of it, its ends ([`payload::write_ends`]).
    fn prepare(&mut self, ep: &mut dyn Endpoint, seq: u64, fault: Option<Fault>, full: bool) {
        if ep.in_place().is_none() {
            if full {
                payload::write(&mut self.buf, seq);
            } else {
                payload::write_ends(&mut self.buf, seq);
            }
            if let Some(f) = fault.filter(|f| f.hits(seq)) {
                f.damage(&mut self.buf, seq);
            }
            self.ready = Some(seq);
        }
    }
}

/// Receives one message of `inb.len()` bytes and returns what `look` makes of it: read
/// into `inb`, or, for a zero-copy method, looked at where it arrived.
fn recv_msg<T>(
    ep: &mut dyn Endpoint,
    inb: &mut [u8],
    mut look: impl FnMut(&[u8]) -> io::Result<T>,
) -> io::Result<T> {
    match ep.in_place() {
        Some(zc) => {
            let size = inb.len();
            let mut out = None;
            zc.recv_in_place(&mut |msg| {
                if msg.len() != size && !(size < MIN_SIZE && msg.len() == MIN_SIZE) {
                    return Err(err(format!(
                        "received a {}-byte message, expected {size} bytes",
                        msg.len()
                    )));
                }
                out = Some(look(msg)?);
                Ok(())
            })?;
            Ok(out.expect("recv_in_place called the reader"))
        }
        None => {
            ep.recv(inb)?;
            look(inb)
        }
    }
}

/// Whether `n` is a multiple of `every` (> 0), asked once per message at both ends of a
/// throughput run: a mask for the usual power of two (a 64-bit division per message was
/// a visible part of the harness's per-message cost).
#[inline(always)]
fn multiple_of(n: u64, every: u64) -> bool {
    if every.is_power_of_two() {
        n & (every - 1) == 0
    } else {
        n % every == 0
    }
}

fn check(checker: &mut Checker, msg: &[u8], seq: u64) -> io::Result<()> {
    checker.check(msg, seq).map_err(|e| err(e.to_string()))
}

impl Plan {
    fn done(&self, n: u64, t0: Instant) -> bool {
        match self.stop {
            Stop::Count(c) => n >= c,
            Stop::Millis(ms) => {
                n >= MAX_SAMPLES || (n >= MIN_MEASURED && t0.elapsed() >= Duration::from_millis(ms))
            }
        }
    }

    /// Whether the measured part of a throughput run may end after `n` messages: a
    /// time-bounded one ends on an ack boundary (no FLUSH inside the measured time).
    fn done_streaming(&self, n: u64, t0: Instant) -> bool {
        (matches!(self.stop, Stop::Count(_)) || multiple_of(n, self.ack_every()))
            && self.done(n, t0)
    }

    /// Whether the warm-up is over after `n` messages. A timed one also needs one message
    /// and (throughput) an ack boundary. (The checksummed laps at the start of a run
    /// normally lie inside it; where they do not, the measured part pays for their
    /// checksums.)
    fn warm(&self, n: u64, t0: Instant) -> bool {
        match self.warmup {
            Warmup::Count(c) => n >= c,
            Warmup::Time(d) => {
                n >= 1
                    && (self.mode == Mode::Latency || multiple_of(n, self.ack_every()))
                    && t0.elapsed() >= d
            }
        }
    }

    fn ack_every(&self) -> u64 {
        self.window.div_ceil(2).max(1)
    }
}

/// Runs the driver's side of a run on `ep`. If it fails after the peer gave up, the
/// error leads with the peer's reason (where the endpoint carries one).
pub fn drive(ep: &mut dyn Endpoint, plan: &Plan) -> io::Result<Measured> {
    match plan.mode {
        Mode::Latency => latency(ep, plan),
        Mode::Throughput => throughput(ep, plan),
    }
    .map_err(|e| {
        if e.to_string().contains("peer failed: ") {
            return e;
        }
        match ep.peer_failure() {
            Some(reason) => err(format!("peer failed: {reason} (here: {e})")),
            None => e,
        }
    })
}

/// The driver's side of a latency run's round trips. A copying endpoint's answers are
/// checked one round trip late: answer `seq - 1` while the peer works on message `seq`
/// (two buffers), so the check is off the round trip's critical path, as the peer's is
/// (`answer`). In place, an answer is checked where it lies, before it is released.
struct Rounds {
    out: Outgoing,
    inb: [Vec<u8>; 2],
    /// The answer received and not checked yet (copying endpoints).
    pending: Option<u64>,
    deferred: bool,
}

impl Rounds {
    fn round_trip(
        &mut self,
        ep: &mut dyn Endpoint,
        checker: &mut Checker,
        seq: u64,
    ) -> io::Result<()> {
        self.out
            .send(ep, seq, None)
            .map_err(|e| err(format!("send #{seq}: {e}")))?;
        self.settle(checker)?;
        self.out.prepare(ep, seq + 1, None, checker.full(seq + 1));
        if self.deferred {
            ep.recv(&mut self.inb[(seq & 1) as usize])
                .map_err(|e| err(format!("receive answer #{seq}: {e}")))?;
            self.pending = Some(seq);
            return Ok(());
        }
        recv_msg(ep, &mut self.inb[0], |msg| {
            check(checker, msg, seq).map_err(|e| err(format!("answer: {e}")))
        })
        .map_err(|e| err(format!("receive answer #{seq}: {e}")))
    }

    /// Checks the answer received last, if not yet.
    fn settle(&mut self, checker: &mut Checker) -> io::Result<()> {
        match self.pending.take() {
            Some(p) => check(checker, &self.inb[(p & 1) as usize], p)
                .map_err(|e| err(format!("receive answer #{p}: answer: {e}"))),
            None => Ok(()),
        }
    }
}

fn latency(ep: &mut dyn Endpoint, plan: &Plan) -> io::Result<Measured> {
    // Calibrated before the peer's clocks start (it waits for the first message).
    let clock = Clock::new();
    let deferred = ep.in_place().is_none();
    let mut rounds = Rounds {
        out: Outgoing::new(plan.size),
        inb: [vec![0u8; plan.size], vec![0u8; plan.size]],
        pending: None,
        deferred,
    };
    let mut checker = Checker::new(plan.size, plan.sampling, plan.seed, !deferred);
    let mut seq = 0;
    let t_warm = Instant::now();
    while !plan.warm(seq, t_warm) {
        rounds.round_trip(ep, &mut checker, seq)?;
        seq += 1;
    }
    rounds.settle(&mut checker)?;
    let mut mark = control(plan.size, MARK);
    ep.send(&mark)?;
    ep.recv(&mut mark)?;
    if tag_of(&mark, plan.size) != Some(MARK) {
        return Err(err("the peer did not answer the end-of-warm-up mark"));
    }

    checker.reset_spent();
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    // With copying endpoints, both ends check message `seq - 1` during round trip `seq`
    // (`Rounds`, `answer`): a full check of it is not timed, like one of `seq`.
    let (rtts, n) = timed_loop(&clock, plan.stop, seq, |seq| {
        let keep = checker.timed(seq) && (!deferred || seq == 0 || checker.timed(seq - 1));
        (keep, rounds.round_trip(ep, &mut checker, seq))
    })?;
    rounds.settle(&mut checker)?;
    let elapsed = t0.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    ep.send(&control(plan.size, STOP))?;
    // The last message: nothing waits on this connection after it to publish it.
    ep.flush()?;
    Ok(Measured {
        rtts: Some(rtts),
        count: n,
        elapsed,
        cpu,
        verify: checker.spent(),
    })
}

/// The measured round trips: `rt(seq)` for seq = `seq0`, `seq0 + 1`, ... until `stop`,
/// returning (whether to keep its time, its result). One clock read per round trip: the
/// read that ends one starts the next, so a round trip's time is the interval between
/// two reads and timing costs one read (about 10 ns with the TSC), the keep check and
/// the push ([`timing_cost`] times this same loop around empty round trips). A round
/// trip that is not kept (its messages were checksummed) still ends with a read, so the
/// checksum is never charged to the next one. Returns the kept times in ns and the
/// count of round trips.
#[inline(always)]
fn timed_loop(
    clock: &Clock,
    stop: Stop,
    seq0: u64,
    mut rt: impl FnMut(u64) -> (bool, io::Result<()>),
) -> io::Result<(Vec<u64>, u64)> {
    let (limit, deadline) = match stop {
        Stop::Count(c) => (c, u64::MAX),
        Stop::Millis(ms) => (MAX_SAMPLES, clock.ticks(ms * 1_000_000)),
    };
    let mut rtts = rtts_buffer(limit);
    let start = clock.now();
    let mut prev = start;
    let mut n = 0;
    while n < limit {
        let (keep, res) = rt(seq0 + n);
        let now = clock.now();
        res?;
        if keep {
            // Ticks here, nanoseconds after the loop: no conversion inside it.
            rtts.push(now.wrapping_sub(prev));
        }
        prev = now;
        n += 1;
        if n >= MIN_MEASURED && now.wrapping_sub(start) >= deadline {
            break;
        }
    }
    for r in &mut rtts {
        *r = clock.ns(0, *r);
    }
    Ok((rtts, n))
}

/// An empty vector for `limit` round-trip times whose first million slots are already
/// paged in: a page fault inside the loop (one per 512 samples, microseconds each on a
/// VM) would be charged to a round trip.
fn rtts_buffer(limit: u64) -> Vec<u64> {
    let mut v = vec![1u64; limit.min(1 << 20) as usize];
    std::hint::black_box(&mut v);
    v.clear();
    v
}

/// What timing one round trip costs the latency driver, in ns: the median, over
/// `rounds` batches of `per_round` empty round trips (nothing sent), of the time per
/// round trip of the loop [`drive`] measures every round trip in. This is the part of a
/// reported round trip that is the harness's, not the method's.
pub fn timing_cost(rounds: usize, per_round: u64) -> f64 {
    let checker = Checker::new(64, Sampling::DEFAULT, 1, false);
    let clock = Clock::new();
    let mut per = Vec::with_capacity(rounds);
    for _ in 0..rounds.max(1) {
        let t0 = Instant::now();
        let r = timed_loop(&clock, Stop::Count(per_round), 0, |seq| {
            std::hint::black_box(seq);
            (checker.timed(seq), Ok(()))
        });
        per.push(t0.elapsed().as_nanos() as f64 / per_round.max(1) as f64);
        std::hint::black_box(&r);
    }
    per.sort_by(f64::total_cmp);
    per[per.len() / 2]
}

/// Receives the next cumulative ack, which must lie in `acked+1 ..= sent`.
fn recv_ack(ep: &mut dyn Endpoint, acked: u64, sent: u64) -> io::Result<u64> {
    let mut ack = [0u8; 8];
    ep.recv(&mut ack)
        .map_err(|e| err(format!("receive ack after {sent} sent: {e}")))?;
    match u64::from_le_bytes(ack) {
        n if n > acked && n <= sent => Ok(n),
        n => Err(err(format!(
            "ack for {n} messages after {acked} acknowledged and {sent} sent"
        ))),
    }
}

/// Waits until all `sent` messages are acknowledged: the acks due at every interval,
/// then, if `sent` is not on an interval, the answer to a FLUSH.
fn settle(ep: &mut dyn Endpoint, plan: &Plan, sent: u64, acked: &mut u64) -> io::Result<()> {
    let due = sent - sent % plan.ack_every();
    while *acked < due {
        *acked = recv_ack(ep, *acked, sent)?;
    }
    if *acked < sent {
        ep.send(&control(plan.size, FLUSH))?;
        *acked = recv_ack(ep, *acked, sent)?;
        if *acked != sent {
            return Err(err(format!(
                "the peer answered a flush with ack {} after {sent} messages",
                *acked
            )));
        }
    }
    Ok(())
}

fn throughput(ep: &mut dyn Endpoint, plan: &Plan) -> io::Result<Measured> {
    let mut out = vec![0u8; plan.size];
    // The peer's sample (the same seed): those messages are generated in full, the rest
    // carry what the peer checks of them, their sequence number at both ends.
    let sample = Checker::new(plan.size, plan.sampling, plan.seed, ep.in_place().is_some());
    let every = plan.ack_every();
    let (mut sent, mut acked) = (0u64, 0u64);
    let mut send = |ep: &mut dyn Endpoint, sent: &mut u64, acked: &mut u64| -> io::Result<()> {
        if *sent - *acked >= plan.window {
            // A batching endpoint publishes the window before it waits for its ack.
            ep.flush()?;
        }
        while *sent - *acked >= plan.window {
            *acked = recv_ack(ep, *acked, *sent)?;
        }
        let fault = plan.fault.filter(|f| f.hits(*sent));
        send_data(ep, &mut out, *sent, fault, sample.full(*sent))
            .map_err(|e| err(format!("send #{}: {e}", *sent)))?;
        *sent += 1;
        if multiple_of(*sent, every) {
            // A batching endpoint publishes each ack interval's messages as soon as they
            // are written, so the peer takes them while the next ones are written (not
            // only once the window is full, which left the peer idle meanwhile).
            ep.flush()?;
        }
        Ok(())
    };
    let t_warm = Instant::now();
    while !plan.warm(sent, t_warm) {
        send(ep, &mut sent, &mut acked)?;
    }
    ep.flush()?;
    settle(ep, plan, sent, &mut acked)?;
    ep.send(&control(plan.size, MARK))?;
    let mut ack = [0u8; 8];
    ep.recv(&mut ack)?;
    if u64::from_le_bytes(ack) != sent {
        return Err(err(format!(
            "the peer answered the mark with ack {} after {sent} messages",
            u64::from_le_bytes(ack)
        )));
    }

    let start = sent;
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    while !plan.done_streaming(sent - start, t0) {
        send(ep, &mut sent, &mut acked)?;
    }
    ep.flush()?;
    settle(ep, plan, sent, &mut acked)?;
    let elapsed = t0.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    ep.send(&control(plan.size, STOP))?;
    // The last message: nothing waits on this connection after it to publish it.
    ep.flush()?;
    Ok(Measured {
        rtts: None,
        count: sent - start,
        elapsed,
        cpu,
        verify: Duration::ZERO, // the peer checks the data
    })
}

/// What the peer reports (one JSON line on its stdout).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerReport {
    /// Data messages received between the mark and the stop.
    pub msgs: u64,
    /// The peer's CPU time (user + sys) between the mark and the stop.
    pub cpu_ns: u64,
    /// The peer's time spent checksumming between the mark and the stop.
    #[serde(default)]
    pub verify_ns: u64,
}

/// A fault the peer injects, for tests of failure handling (`SHMLINK_BENCH_FAULT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Exit with status 3 on receiving data message #n (a crash mid-run).
    Exit(u64),
    /// Flip the last byte of data message #n: the peer's answer in latency mode, the
    /// driver's message in throughput mode.
    Corrupt(u64),
    /// From data message #n on, flip one byte in the middle of every message (between
    /// the header and the trailer, so only a full checksum sees it), as the sender of
    /// [`Fault::Corrupt`].
    Scribble(u64),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Exit(n) => write!(f, "exit:{n}"),
            Fault::Corrupt(n) => write!(f, "corrupt:{n}"),
            Fault::Scribble(n) => write!(f, "scribble:{n}"),
        }
    }
}

impl Fault {
    /// Parses `exit:N`, `corrupt:N` or `scribble:N`.
    pub fn parse(text: &str) -> Option<Fault> {
        let (what, n) = text.split_once(':')?;
        let n = n.parse().ok()?;
        match what {
            "exit" => Some(Fault::Exit(n)),
            "corrupt" => Some(Fault::Corrupt(n)),
            "scribble" => Some(Fault::Scribble(n)),
            _ => None,
        }
    }

    /// The first data message this fault damages (`None` for [`Fault::Exit`]): a run
    /// with fewer messages never injects it.
    pub fn first_damaged(self) -> Option<u64> {
        match self {
            Fault::Exit(_) => None,
            Fault::Corrupt(n) | Fault::Scribble(n) => Some(n),
        }
    }

    /// Whether this fault damages data message `seq`.
    pub fn hits(self, seq: u64) -> bool {
        match self {
            Fault::Exit(_) => false,
            Fault::Corrupt(n) => seq == n,
            Fault::Scribble(n) => seq >= n,
        }
    }

    /// Damages `msg`, data message `seq` ([`crate::payload`]), if this fault hits it.
    pub fn damage(self, msg: &mut [u8], seq: u64) {
        if !self.hits(seq) || msg.is_empty() {
            return;
        }
        let at = match self {
            Fault::Scribble(_) if msg.len() > MIN_CHECKSUMMED => {
                let body = msg.len() - MIN_CHECKSUMMED;
                payload::HEADER + (seq.wrapping_mul(7919) % body as u64) as usize
            }
            Fault::Scribble(_) => msg.len() / 2,
            _ => msg.len() - 1,
        };
        debug_assert!(
            !matches!(self, Fault::Scribble(_))
                || msg.len() < MIN_CHECKSUMMED
                || (payload::HEADER..msg.len() - TRAILER).contains(&at),
            "a scribble stays between header and trailer"
        );
        msg[at] ^= 1;
    }
}

/// The peer's side: answers until STOP. On failure the driver is told why where the
/// endpoint can ([`Endpoint::tell_failure`]).
pub fn serve(
    ep: &mut dyn Endpoint,
    size: usize,
    mode: Mode,
    window: u64,
    sample: (Sampling, u64),
    fault: Option<Fault>,
) -> io::Result<PeerReport> {
    let res = answer(ep, size, mode, window, sample, fault);
    if let Err(e) = &res {
        ep.tell_failure(&e.to_string());
    }
    res
}

fn answer(
    ep: &mut dyn Endpoint,
    size: usize,
    mode: Mode,
    window: u64,
    (sampling, seed): (Sampling, u64),
    fault: Option<Fault>,
) -> io::Result<PeerReport> {
    let every = window.div_ceil(2).max(1);
    let mut checker = Checker::new(size, sampling, seed, ep.in_place().is_some());
    let mut inb = vec![0u8; size];
    let mut answers = Outgoing::new(size);
    let mut expected = 0u64;
    let mut at_mark = 0;
    let mut cpu0 = cpu_time();
    // A latency run's copying peer answers a data message first and checks it after
    // (it lies in `inb`): the check is then off the round trip, which the driver's
    // `latency` accounts for. In place, the message is checked where it lies, before
    // it is released.
    let deferred = mode == Mode::Latency && ep.in_place().is_none();
    loop {
        let tag = recv_msg(ep, &mut inb, |msg| {
            let tag = tag_of(msg, size);
            if tag.is_none() && !deferred {
                check(&mut checker, msg, expected)?;
            }
            Ok(tag)
        })
        .map_err(|e| err(format!("receive #{expected}: {e}")))?;
        match tag {
            Some(STOP) => break,
            Some(MARK) => {
                cpu0 = cpu_time();
                checker.reset_spent();
                at_mark = expected;
                match mode {
                    Mode::Latency => ep.send(&control(size, MARK))?,
                    Mode::Throughput => ep.send(&expected.to_le_bytes())?,
                }
            }
            Some(_) if mode == Mode::Latency => {
                return Err(err("a flush in a latency run"));
            }
            Some(_) => ep
                .send(&expected.to_le_bytes())
                .map_err(|e| err(format!("ack {expected} after a flush: {e}")))?,
            None => {
                if fault == Some(Fault::Exit(expected)) {
                    eprintln!("peer: injected fault: exiting at message #{expected}");
                    std::process::exit(3);
                }
                expected += 1;
                match mode {
                    Mode::Latency => {
                        let seq = expected - 1;
                        answers
                            .send(ep, seq, fault)
                            .map_err(|e| err(format!("answer #{seq}: {e}")))?;
                        if deferred {
                            check(&mut checker, &inb, seq)
                                .map_err(|e| err(format!("receive #{seq}: {e}")))?;
                        }
                        answers.prepare(ep, expected, fault, checker.full(expected));
                    }
                    Mode::Throughput if multiple_of(expected, every) => {
                        ep.send(&expected.to_le_bytes())
                            .map_err(|e| err(format!("ack {expected}: {e}")))?;
                    }
                    Mode::Throughput => {}
                }
            }
        }
    }
    Ok(PeerReport {
        msgs: expected - at_mark,
        cpu_ns: cpu_time().saturating_sub(cpu0).as_nanos() as u64,
        verify_ns: checker.spent().as_nanos() as u64,
    })
}
