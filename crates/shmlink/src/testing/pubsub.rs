//! The pub/sub hooks: a fake publisher's answer ([`FakeTopic`]), a subscriber with raw
//! access to what it was given ([`HostileSubscriber`]), and the fuzz entry points of the
//! subscriber's reader and handshake, all built on the topic's private layout.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::sys::{memfd, socket};

use super::socket_path;
use crate::pubsub::handshake::{
    Packet as SubPacket, Subscribe as SubRequest, MAX_PACKET as SUB_MAX_PACKET, POLICY_BLOCK,
};
use crate::pubsub::ring::PAYLOAD_OFFSET;
use crate::pubsub::segment::{BellSegment, CursorSegment};
use crate::pubsub::shm_subscriber::ShmSubscriber as PubSubscriber;
use crate::sys::memfd::Region;

/// What a fake publisher announces: the numbers of its `Subscribed` answer, the same
/// numbers again in the topic segment's header (they may disagree), and the real size of
/// the topic memfd it passes.
#[derive(Clone, Copy, Debug)]
pub struct FakeTopic {
    /// Slot count, slot size, largest message and header length in the answer.
    pub announced: [u64; 4],
    /// The same four in the topic segment's header.
    pub in_header: [u64; 4],
    /// Bytes of the topic memfd (sealed against resizing).
    pub file_size: usize,
}

impl FakeTopic {
    /// An honest topic of `slots` slots of `slot_size` bytes: everything agrees.
    pub fn honest(slots: u64, slot_size: u64) -> FakeTopic {
        let hl = crate::pubsub::segment::header_len();
        let numbers = [
            slots,
            slot_size,
            slot_size - PAYLOAD_OFFSET as u64,
            hl as u64,
        ];
        FakeTopic {
            announced: numbers,
            in_header: numbers,
            file_size: hl + (slots * slot_size) as usize,
        }
    }

    /// The `Subscribed` packet and its three descriptors (topic, bell page, cursor
    /// page), for [`fake_listener`].
    pub fn answer(&self) -> (Vec<u8>, Vec<OwnedFd>) {
        use std::os::unix::fs::FileExt;
        let [slots, slot_size, max_msg, header_len] = self.announced;
        let packet = SubPacket::Subscribed(crate::pubsub::handshake::Subscribed {
            slot: 0,
            policy: POLICY_BLOCK,
            slots,
            slot_size,
            max_msg,
            header_len,
            start: 0,
        });
        let topic = memfd::create_unsealed("fake-topic", self.file_size).expect("memfd");
        let [s, z, m, h] = self.in_header;
        let ident = crate::pubsub::segment::ident_bytes(POLICY_BLOCK, s, z, m, h);
        let file = std::fs::File::from(topic);
        file.write_all_at(&ident, 0)
            .expect("write the topic header");
        let topic = OwnedFd::from(file);
        memfd::add_seals(topic.as_fd(), memfd::SEALS).expect("seal");
        let page = || memfd::create_sealed("fake-page", crate::sys::page_size()).expect("memfd");
        (packet.encode(), vec![topic, page(), page()])
    }
}

/// A subscriber that completes a genuine subscribe handshake and then has raw access to
/// what it was given — the topic memfd, the bell page, its cursor page and the socket —
/// to attack the topic like a buggy or malicious process.
pub struct HostileSubscriber {
    sock: OwnedFd,
    topic: OwnedFd,
    topic_len: usize,
    bell: Region,
    page: Region,
    /// Our slot in the topic (our bell bit).
    slot: usize,
}

impl HostileSubscriber {
    /// Subscribes to the topic at `addr` (a `shm:` address).
    pub fn connect(addr: &str) -> Result<HostileSubscriber> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let sock =
            socket::connect(&socket_path(addr)?, deadline).map_err(|e| Error::io(addr, e))?;
        let req = SubPacket::Subscribe(SubRequest {
            features: 0,
            history: 0,
            max_msg: 0,
        });
        socket::send(sock.as_fd(), &req.encode()).map_err(|e| Error::io("request", e))?;
        let mut buf = [0u8; SUB_MAX_PACKET];
        let mut fds = Vec::new();
        let n = socket::recv_until(sock.as_fd(), &mut buf, &mut fds, deadline)
            .map_err(|e| Error::io("answer", e))?;
        let SubPacket::Subscribed(ok) = SubPacket::decode(&buf[..n])? else {
            return Err(Error::violation("publisher did not accept"));
        };
        let [topic, bell, page] = <[OwnedFd; 3]>::try_from(fds)
            .map_err(|_| Error::violation("expected three descriptors"))?;
        let page_size = crate::sys::page_size();
        let map = |fd: &OwnedFd| {
            Region::map(fd.as_fd(), page_size, true).map_err(|e| Error::io("mmap", e))
        };
        let (bell, page) = (map(&bell)?, map(&page)?);
        let topic_len = (ok.header_len + ok.slots * ok.slot_size) as usize;
        Ok(HostileSubscriber {
            sock,
            topic,
            topic_len,
            bell,
            page,
            slot: ok.slot as usize,
        })
    }

    /// Tries everything that could change the topic's messages for the other
    /// subscribers; returns what each attempt got (`Ok` would be a hole).
    pub fn attack_topic(&self) -> Vec<(&'static str, io::Result<()>)> {
        let fd = self.topic.as_fd();
        let mut out = Vec::new();
        out.push((
            "mmap read-write",
            Region::map(fd, self.topic_len, true).map(drop),
        ));
        let mprotect = Region::map(fd, self.topic_len, false).and_then(|ro| ro.make_writable());
        out.push(("mprotect read-only mapping to read-write", mprotect));
        let w = memfd::write_at(fd, 4096, &[0xffu8; 8]).and_then(|n| {
            if n == 8 {
                Ok(())
            } else {
                Err(io::Error::other(format!("wrote {n} of 8 bytes")))
            }
        });
        out.push(("pwrite", w));
        out.push(("ftruncate", memfd::truncate(fd, 4096)));
        // Reopening through /proc gives a new open file on the same sealed inode.
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let reopen = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .and_then(|f| Region::map(f.as_fd(), self.topic_len, true).map(drop));
        out.push(("reopen through /proc and mmap read-write", reopen));
        out
    }

    /// Writes `count` random 8-byte values at random places of the bell page and of our
    /// cursor page (everything this subscriber can write), driven by the xorshift state
    /// `seed`.
    pub fn scribble(&self, seed: &mut u64, count: usize) {
        let mut next = || {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed
        };
        let words = crate::sys::page_size() / 8;
        for _ in 0..count {
            let (place, value) = (next(), next());
            let value = match place % 4 {
                0 => value % 4096,
                1 => 0,
                _ => value,
            };
            let region = if place & 256 == 0 {
                &self.bell
            } else {
                &self.page
            };
            let off = ((place >> 16) as usize % words) * 8;
            // SAFETY: `off + 8` lies inside the one-page writable mapping.
            unsafe {
                region
                    .base()
                    .as_ptr()
                    .add(off)
                    .cast::<u64>()
                    .write_volatile(value)
            };
        }
    }

    /// Sends `bytes` to the publisher on the control socket (doorbell floods, garbage).
    pub fn send(&self, bytes: &[u8]) -> io::Result<usize> {
        socket::send(self.sock.as_fd(), bytes)
    }

    /// Our cursor page, as the publisher shares it with us.
    fn cursor_page(&self) -> &crate::pubsub::ring::CursorPage {
        // SAFETY: `page` maps the one-page cursor page (page-aligned, writable) for as
        // long as `self` lives; a CursorPage is all atomics, valid for any bytes.
        unsafe { &*self.page.base().as_ptr().cast() }
    }

    /// Our cursor as it stands in the cursor page.
    pub fn cursor(&self) -> u64 {
        self.cursor_page().load_cursor()
    }

    /// Moves our cursor to `cursor` without reading anything and without ringing the
    /// publisher (a subscriber that trickles progress).
    pub fn store_cursor(&self, cursor: u64) {
        self.cursor_page().advance(cursor, 0, false);
    }

    /// Announces sleep exactly as a genuine subscriber does (wake-me flag, bell bit),
    /// whether or not anything is left to read: repeated after every message, it asks
    /// the publisher for a doorbell per message.
    pub fn announce_sleep(&self) {
        // SAFETY: `bell` maps the one-page bell page (page-aligned, writable) for as long
        // as `self` lives; a BellPage is all atomics, valid for any bytes.
        let bell = unsafe { &*self.bell.base().as_ptr().cast() };
        crate::pubsub::ring::arm_subscriber(self.cursor_page(), bell, self.slot);
    }

    /// Takes every doorbell waiting in our socket; how many there were.
    pub fn take_doorbells(&self) -> usize {
        let mut buf = [0u8; 64];
        let mut n = 0;
        while socket::recv(self.sock.as_fd(), &mut buf).is_ok_and(|len| len > 0) {
            n += 1;
        }
        n
    }
}

/// Fuzz entry point: a subscriber given a topic by a hostile or broken publisher — an
/// announcement with arbitrary numbers, then shared memory holding arbitrary bytes that
/// keep changing — must refuse the announcement, or deliver messages or fail with an
/// error: never panic, hang, or touch memory outside its mapping.
///
/// Layout of `data`: 1 byte of flags (bit 0: the publisher's socket is closed; bit 1:
/// `block` policy; bit 2: take the announcement's numbers raw instead of folding them
/// into plausible ranges; bit 3: the segment's header disagrees with the announcement),
/// four words of announcement (slots, slot size, largest message, header length) and one
/// of file-size error, then 8-byte words: first the slot area, then, round after round,
/// `written`, `closed`, a slot word's index and value, and the cursor page's detach mark.
pub fn fuzz_pubsub_reader(data: &[u8]) {
    use crate::pubsub::handshake::{Subscribed, POLICY_OVERWRITE};
    use crate::pubsub::segment::header_len;
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut words = super::fuzz_words(rest);
    let mut take = || words.next().unwrap_or(0);
    let hl = header_len() as u64;
    let raw = [take(), take(), take(), take()];
    let announced = if flags & 4 != 0 {
        raw
    } else {
        // Mostly-valid numbers, so the reading below runs often.
        let slots = 1 << (raw[0] % 6);
        let slot_size = 8 * (2 + raw[1] % 32);
        let max_msg = raw[2] % (slot_size - PAYLOAD_OFFSET as u64 + 2);
        let header = if raw[3] % 8 == 0 { raw[3] } else { hl };
        [slots, slot_size, max_msg, header]
    };
    let [slots, slot_size, max_msg, header] = announced;
    let policy_code = if flags & 2 != 0 {
        POLICY_BLOCK
    } else {
        POLICY_OVERWRITE
    };
    let ok = Subscribed {
        slot: 0,
        policy: policy_code,
        slots,
        slot_size,
        max_msg,
        header_len: header,
        start: 0,
    };
    // The file: what the announcement implies, off by a fuzzed amount now and then.
    let error = take();
    let in_header = if flags & 8 != 0 { raw } else { announced };
    let Some((topic, writer, file)) = fuzz_topic(policy_code, announced, in_header, error) else {
        return;
    };
    let base = writer.base().as_ptr();
    let Ok((seg, policy)) = crate::pubsub::shm_subscriber::attach_topic(&ok, &topic) else {
        return; // refused: the outcome a lying announcement must have
    };
    let geom = seg.geometry();
    assert!(geom.valid());
    assert_eq!(hl as usize + geom.data_len(), file);
    let (Ok((bell, _)), Ok((page, _))) = (
        BellSegment::create("fuzz-bell"),
        CursorSegment::create("fuzz-cursor"),
    ) else {
        return;
    };
    let header = hl as usize;
    let slot_words = geom.data_len() / 8;
    let write = |off: usize, v: u64| {
        // SAFETY: every offset used below lies inside the writable mapping of the
        // segment (the header page or the slot area, which `attach_topic` matched to
        // the file's size), 8-aligned.
        unsafe { base.add(off).cast::<u64>().write_volatile(v) }
    };
    for i in 0..slot_words {
        let Some(w) = words.next() else { break };
        write(header + i * 8, w);
    }
    let page_base = page.base().as_ptr();
    let (ours, theirs) = socket::seqpacket_pair().expect("socketpair");
    let _peer = (flags & 1 == 0).then_some(theirs);
    let mut sub = PubSubscriber::over(seg, bell, page, ours, policy, geom.max_msg);
    let mut buf = vec![0u8; geom.max_msg.min(256)];
    for _ in 0..64 {
        let mut step = || words.next();
        if let Some(written) = step() {
            write(crate::pubsub::segment::WRITTEN_OFFSET, written);
        }
        if let Some(closed) = step() {
            write(crate::pubsub::segment::CLOSED_OFFSET, closed & 1);
        }
        if let (Some(at), Some(v)) = (step(), step()) {
            write(header + (at as usize % slot_words) * 8, v);
        }
        if let Some(mark) = step() {
            // SAFETY: the detach mark lies in the mapped cursor page, 4-aligned.
            unsafe {
                page_base
                    .add(crate::pubsub::ring::CursorPage::DETACHED_OFFSET)
                    .cast::<u32>()
                    .write_volatile(mark as u32 & 1)
            };
        }
        match sub.recv(&mut buf) {
            Ok(n) => assert!(n <= geom.max_msg),
            Err(e) => match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::Lagged | ErrorKind::MessageTooLarge => {}
                _ => break,
            },
        }
    }
}

/// Fuzz entry point: the subscriber's side of the subscribe handshake against a hostile
/// or broken publisher. The answer packet (`Subscribed`, or `Upgraded` to an `auto:`
/// subscriber), its numbers, the descriptors that travel with it and what they hold all
/// come from the input; the subscriber must refuse, or come up consistent with what it
/// asked for — never panic, hang or map past a file's end.
///
/// Layout of `data`: 1 byte of flags (bit 0: the subscriber upgrades with a token and
/// the answer is `Upgraded`; bit 1: the proof is wrong; bit 2: the numbers are raw
/// instead of folded into plausible ranges; bit 3: the topic header disagrees with the
/// answer; bits 4–5: descriptors sent (3, 3, 2 or 4); bit 6: the answer is the raw rest
/// of the input instead of a packet built from the words; bit 7: the cursor page starts
/// elsewhere than the answer says), then words: slot, policy, slots, slot size, largest
/// message, header length, start, file-size error, the subscriber's own message limit.
pub fn fuzz_pubsub_handshake(data: &[u8]) {
    pubsub_handshake_accepted(data);
}

/// [`fuzz_pubsub_handshake`]; returns whether the subscriber accepted the answer.
fn pubsub_handshake_accepted(data: &[u8]) -> bool {
    use crate::pubsub::handshake::{Subscribed, POLICY_OVERWRITE};
    use crate::pubsub::segment::header_len;
    let Some((&flags, rest)) = data.split_first() else {
        return false;
    };
    let mut words = super::fuzz_words(rest);
    let mut take = || words.next().unwrap_or(0);
    let raw = [take(), take(), take(), take(), take(), take(), take()];
    let (error, limit) = (take(), take());
    let hl = header_len() as u64;
    let built = if flags & 4 != 0 {
        Subscribed {
            slot: raw[0] as u32,
            policy: raw[1] as u32,
            slots: raw[2],
            slot_size: raw[3],
            max_msg: raw[4],
            header_len: raw[5],
            start: raw[6],
        }
    } else {
        let slot_size = 8 * (2 + raw[3] % 32);
        Subscribed {
            slot: (raw[0] % 80) as u32,
            policy: [POLICY_BLOCK, POLICY_OVERWRITE, 0, 3][raw[1] as usize % 4],
            slots: 1 << (raw[2] % 6),
            slot_size,
            max_msg: raw[4] % (slot_size - PAYLOAD_OFFSET as u64 + 2),
            header_len: if raw[5] % 8 == 0 { raw[5] } else { hl },
            start: raw[6] % 4096,
        }
    };
    let (token, proof) = ([0x5a; 16], [0xa5; 16]);
    let upgrade = (flags & 1 != 0).then_some((token, proof));
    let packet = if flags & 64 != 0 {
        rest[..rest.len().min(SUB_MAX_PACKET)].to_vec()
    } else if upgrade.is_some() {
        let sent = if flags & 2 != 0 { token } else { proof };
        SubPacket::Upgraded(built, sent).encode()
    } else {
        SubPacket::Subscribed(built).encode()
    };
    // The descriptors describe what the packet announces, where it parses.
    let ok = match SubPacket::decode(&packet) {
        Ok(SubPacket::Subscribed(ok) | SubPacket::Upgraded(ok, _)) => ok,
        _ => built,
    };
    let announced = [ok.slots, ok.slot_size, ok.max_msg, ok.header_len];
    let in_header = if flags & 8 != 0 {
        [raw[2], raw[3], raw[4], raw[5]]
    } else {
        announced
    };
    let Some((topic, _map, _file)) = fuzz_topic(ok.policy, announced, in_header, error) else {
        return false;
    };
    let (Ok((_bell, bell_fd)), Ok((page, page_fd))) = (
        BellSegment::create("fuzz-bell"),
        CursorSegment::create("fuzz-cursor"),
    ) else {
        return false;
    };
    page.get()
        .init(ok.start.wrapping_add((flags >> 7) as u64 * (1 + error % 7)));
    let fds = [topic.as_raw_fd(), bell_fd.as_raw_fd(), page_fd.as_raw_fd()];
    let fds: &[_] = match (flags >> 4) & 3 {
        2 => &fds[..2],
        3 => &[fds[0], fds[1], fds[2], fds[2]],
        _ => &fds,
    };
    let (ours, theirs) = socket::seqpacket_pair().expect("socketpair");
    if socket::send_with_fds(theirs.as_fd(), &packet, fds).is_err() {
        return false;
    }
    let opts = crate::PubSubOptions {
        max_msg_size: (limit % 4 == 0).then_some((limit >> 2) as usize % 512),
        ..Default::default()
    };
    // The answer is already queued: the deadline only bounds a bug.
    let deadline = Instant::now() + Duration::from_secs(10);
    let Ok(mut sub) = PubSubscriber::handshake_on(ours, "shm:fuzz", upgrade, &opts, deadline)
    else {
        return false; // refused: the outcome a bad answer must have
    };
    // Accepted: only what this subscriber asked for and what the kernel vouches for.
    assert!(sub.slot() < crate::pubsub::MAX_SUBSCRIBERS);
    assert_eq!(sub.position(), ok.start);
    assert!(sub.position() <= crate::pubsub::ring::MAX_POSITION);
    if let Some(max) = opts.max_msg_size {
        assert!(sub.max_msg_size() <= max);
    }
    if upgrade.is_some() {
        assert!(
            flags & 2 == 0 || flags & 64 != 0,
            "a wrong proof was accepted"
        );
    }
    sub.set_nonblocking(true);
    let mut buf = vec![0u8; sub.max_msg_size().min(256)];
    for _ in 0..4 {
        match sub.recv(&mut buf) {
            Ok(n) => assert!(n <= sub.max_msg_size()),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(_) => {}
        }
    }
    drop(theirs);
    true
}

/// A topic memfd as a fake publisher passes it: sized as `announced` implies (where that
/// is small enough to make), off by a fuzzed amount when `error % 4 == 0`, its header
/// naming `in_header` (which may disagree), sealed against resizing. Returns the memfd,
/// a writable mapping of it and its size.
fn fuzz_topic(
    policy: u32,
    announced: [u64; 4],
    in_header: [u64; 4],
    error: u64,
) -> Option<(OwnedFd, Region, usize)> {
    /// The largest topic file the fuzzers make (larger announcements must be refused
    /// before the file's size matters).
    const MAX_FILE: u64 = 1 << 20;
    let hl = crate::pubsub::segment::header_len() as u64;
    let [slots, slot_size, ..] = announced;
    let implied = slots
        .checked_mul(slot_size)
        .and_then(|n| n.checked_add(hl))
        .filter(|&n| n <= MAX_FILE)
        .unwrap_or(hl);
    let file = match error % 4 {
        0 => (implied as i64 + (error as i64 >> 2) % 4096).clamp(1, MAX_FILE as i64) as usize,
        _ => implied as usize,
    };
    let topic = memfd::create_unsealed("fuzz-topic", file).ok()?;
    let writer = Region::map(topic.as_fd(), file, true).ok()?;
    let [s, z, m, h] = in_header;
    let ident = crate::pubsub::segment::ident_bytes(policy, s, z, m, h);
    // SAFETY: the mapping is at least one byte; the header is copied only as far as the
    // file reaches, and nobody else maps it yet.
    unsafe {
        writer
            .base()
            .as_ptr()
            .copy_from_nonoverlapping(ident.as_ptr(), ident.len().min(file))
    };
    memfd::add_seals(topic.as_fd(), memfd::SEALS).ok()?;
    Some((topic, writer, file))
}

#[cfg(test)]
mod tests {
    /// The fuzz entry point over pseudo-random inputs in a debug build, where arithmetic
    /// overflow panics (fuzzing runs optimised, where it would wrap silently).
    #[test]
    fn pubsub_reader_survives_random_shared_memory() {
        let mut next = crate::xorshift(0x2545_f491_4f6c_dd1du64);
        for round in 0..300 {
            let len = 1 + (next() % 2048) as usize;
            let data: Vec<u8> = (0..len)
                .map(|i| {
                    let v = next();
                    // Mostly small or structured values: the ones that pass naive checks.
                    match (round + i) % 4 {
                        0 => (v % 4) as u8,
                        1 => 0,
                        _ => v as u8,
                    }
                })
                .collect();
            super::fuzz_pubsub_reader(&data);
        }
    }

    /// The subscribe-handshake entry point accepts an honest answer (so the fuzzer
    /// reaches the accepting path), refuses a wrong upgrade proof, a missing descriptor
    /// and a cursor page that disagrees, and survives pseudo-random inputs in a debug
    /// build.
    #[test]
    fn pubsub_handshake_accepts_honest_answers_only() {
        // slot 0, block, 4 slots of 64 bytes, 10-byte messages, the real header length,
        // start 0, a file of the implied size, no limit of our own.
        let words = [0u64, 0, 2, 6, 10, 1, 0, 1, 1];
        let input = |flags: u8| -> Vec<u8> {
            std::iter::once(flags)
                .chain(words.iter().flat_map(|w| w.to_le_bytes()))
                .collect()
        };
        assert!(super::pubsub_handshake_accepted(&input(0)));
        assert!(super::pubsub_handshake_accepted(&input(1)), "upgraded");
        assert!(
            !super::pubsub_handshake_accepted(&input(1 | 2)),
            "wrong proof"
        );
        assert!(
            !super::pubsub_handshake_accepted(&input(2 << 4)),
            "2 descriptors"
        );
        assert!(
            !super::pubsub_handshake_accepted(&input(128)),
            "cursor elsewhere"
        );
        let mut next = crate::xorshift(0x9e37_79b9_7f4a_7c15u64);
        for _ in 0..300 {
            let mut data = input(next() as u8);
            let flips = next() % 4;
            for _ in 0..flips {
                let at = next() as usize % data.len();
                data[at] = next() as u8;
            }
            super::fuzz_pubsub_handshake(&data);
        }
    }
}
