//! `floor-line`: the physical floor of a small message. One cache line per direction and
//! nothing else: no ring, no record header, no position, no wake-up. Whatever a transport
//! does, a message still has to move the line it is written in from the sender's core to
//! the receiver's; this row is what that costs on the machine at hand (docs/benchmarks.md,
//! "The floor rows").
//!
//! The two lines (64-byte aligned, 128 bytes apart so that the prefetcher's 128-byte
//! pairs never couple them) start as all ones. A message of up to 56 bytes goes after a
//! word the sender changes for each message; one of 57 to 64 bytes fills the line, and its
//! own first 8 bytes are that word: consecutive such messages must differ there (the
//! bench's payload starts with its sequence number; `send` refuses one that does not).
//! The sender writes the bytes after the word, then stores the word (release); the
//! receiver spins on the word (acquire) until it changes, and copies the message out of
//! the line, which that first read brought into its cache. A line holds one message:
//! the sender writes the next one only after the peer's answer (latency) or its
//! acknowledgement (throughput, with a window of one) said the last one was taken.
//! Busy polls, with `sched_yield` when both ends share a CPU.

use std::hint;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use super::floor::{memfd, Map};
use crate::method::{arg, Ctx, Endpoint, Method, Prepared, SizeLimit};
use crate::sys::{err, inherited_fd};

/// Bytes of a line.
const LINE: usize = 64;
/// Bytes of the word that says a new message is in the line.
const WORD: usize = 8;
/// Offsets of the two directions' lines in the mapping.
const AT: [usize; 2] = [0, 128];
/// Bytes of the mapping (one page).
const MAP_LEN: usize = 4096;
/// The word of a line nothing was written to yet.
const FRESH: u64 = u64::MAX;

/// One end: writes line `me`, reads the other.
struct FloorLine {
    tx: *mut u8,
    rx: *const u8,
    /// The word last stored to `tx` and last seen in `rx`.
    tx_word: u64,
    rx_word: u64,
    same_core: bool,
    _map: Map,
}

// SAFETY: `tx` and `rx` point into `_map`, which moves with them.
unsafe impl Send for FloorLine {}

impl FloorLine {
    fn new(map: Map, me: usize, same_core: bool) -> FloorLine {
        // SAFETY: both lines lie inside the mapping (AT[1] + LINE <= MAP_LEN).
        let (tx, rx) = unsafe { (map.ptr.add(AT[me]), map.ptr.add(AT[1 - me])) };
        FloorLine {
            tx,
            rx,
            tx_word: FRESH,
            rx_word: FRESH,
            same_core,
            _map: map,
        }
    }
}

/// The word at the start of `line`.
///
/// # Safety
/// `line` is 8-aligned and lies in a live mapping.
unsafe fn word(line: *const u8) -> &'static AtomicU64 {
    // SAFETY: forwarded to the caller; an AtomicU64 has the layout of a u64.
    unsafe { &*line.cast::<AtomicU64>() }
}

/// Refuses a message the line cannot carry.
fn check_len(len: usize) -> io::Result<()> {
    if len > LINE {
        return Err(err(format!(
            "a {len}-byte message does not fit one {LINE}-byte line"
        )));
    }
    Ok(())
}

impl Endpoint for FloorLine {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        check_len(msg.len())?;
        let (w, body) = if msg.len() > LINE - WORD {
            let w = u64::from_le_bytes(msg[..WORD].try_into().expect("8 bytes"));
            if w == self.tx_word {
                return Err(err(format!(
                    "a {}-byte message fills the line, so its first 8 bytes are the flag: \
                     they must differ from the last message's ({w:#x})",
                    msg.len()
                )));
            }
            (w, &msg[WORD..])
        } else {
            (self.tx_word.wrapping_add(1), msg)
        };
        // SAFETY: `body` (at most LINE - WORD bytes) goes after the word, inside our own
        // line of the mapping, which the peer reads only once the word changes.
        unsafe { std::ptr::copy_nonoverlapping(body.as_ptr(), self.tx.add(WORD), body.len()) };
        // SYNC POINT: Release pairs with the Acquire load in `recv`: the bytes written
        // above are visible once the word is.
        // SAFETY: the line is 64-aligned inside the live mapping.
        unsafe { word(self.tx) }.store(w, Ordering::Release);
        self.tx_word = w;
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        check_len(buf.len())?;
        // SAFETY: the line is 64-aligned inside the live mapping.
        let flag = unsafe { word(self.rx) };
        let w = loop {
            // SYNC POINT: Acquire pairs with the Release store in `send`.
            let w = flag.load(Ordering::Acquire);
            if w != self.rx_word {
                break w;
            }
            if self.same_core {
                std::thread::yield_now();
            } else {
                hint::spin_loop();
            }
        };
        self.rx_word = w;
        let n = buf.len();
        let body = if n > LINE - WORD {
            buf[..WORD].copy_from_slice(&w.to_le_bytes());
            &mut buf[WORD..]
        } else {
            buf
        };
        // SAFETY: the bytes after the word lie in the peer's line, which it does not write
        // again before we answer; `body` is our own buffer.
        unsafe { std::ptr::copy_nonoverlapping(self.rx.add(WORD), body.as_mut_ptr(), body.len()) };
        Ok(())
    }
}

pub struct FloorLineMethod;

impl Method for FloorLineMethod {
    fn name(&self) -> &'static str {
        "floor-line"
    }

    fn about(&self) -> &'static str {
        "the physical floor: one cache line per direction, a flag word, busy polling"
    }

    fn busy_polls(&self) -> bool {
        true
    }

    fn size_limit(&self) -> Option<SizeLimit> {
        Some(SizeLimit {
            max: LINE,
            why: "one cache line per direction",
        })
    }

    fn max_window(&self, _size: usize) -> Option<u64> {
        Some(1)
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        let fd = memfd(MAP_LEN)?;
        let map = Map::new(&fd, MAP_LEN)?;
        for at in AT {
            // SAFETY: both lines lie in the new mapping, which the peer maps only later.
            unsafe { word(map.ptr.add(at)) }.store(FRESH, Ordering::Relaxed);
        }
        let end = FloorLine::new(map, 0, c.same_core);
        Ok(Prepared::ready(
            vec![fd.as_raw_fd().to_string()],
            vec![fd],
            end,
        ))
    }

    fn connect(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        let fd = inherited_fd(arg(args, 0, "memfd")?)?;
        let map = Map::new(&fd, MAP_LEN)?;
        Ok(Box::new(FloorLine::new(map, 1, c.same_core)))
    }
}
