//! The shared memory of a topic: three kinds of sealed memfd, each mapped once.
//!
//! ```text
//! topic (publisher: read-write; subscribers: read-only, F_SEAL_FUTURE_WRITE)
//!   offset 0      TopicIdent   magic, version, policy, geometry
//!   offset 128    TopicCtl     `written` (own line), `closed` (own line)
//!   header_len    slot 0 … slot n-1, `slot_size` bytes each: SlotHeader + payload
//! bell (publisher and every subscriber: read-write)
//!   offset 0      BellPage     one bit per subscriber slot
//! cursor page (one per subscriber; that subscriber and the publisher: read-write)
//!   offset 0      CursorPage   cursor, wake-me flag, wait-for-you flag, detach mark
//! ```
//!
//! The topic is sealed with `F_SEAL_FUTURE_WRITE` after the publisher mapped it: from
//! then on the kernel refuses any writable mapping, `mprotect` to writable, and `write`,
//! whoever holds the descriptor. A subscriber therefore cannot change a byte that other
//! subscribers read; the only memory it can write is its own cursor page and the bell
//! bits, which the publisher treats as hints. A kernel without the seal (before Linux
//! 5.1) cannot give that guarantee: the topic is then refused unless the publisher
//! opts in with [`PubSubOptions::allow_writable_topic`](crate::PubSubOptions::allow_writable_topic).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use super::ring::{BellPage, CursorPage, Geometry, Ring, TopicCtl};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::memfd::{self, Region};
use crate::sys::page_size;

/// "SHMLPUB1", little endian.
const TOPIC_MAGIC: u64 = u64::from_le_bytes(*b"SHMLPUB1");
/// Layout version of the topic segment.
const TOPIC_VERSION: u32 = 1;
const CTL_OFFSET: usize = 128;
/// Byte offset of `written` in the topic segment (for fuzzing and hostile-peer tests).
pub const WRITTEN_OFFSET: usize = CTL_OFFSET + TopicCtl::WRITTEN_OFFSET;
/// Byte offset of `closed` in the topic segment.
pub const CLOSED_OFFSET: usize = CTL_OFFSET + TopicCtl::CLOSED_OFFSET;

/// Identification at the start of the topic segment.
#[repr(C)]
#[derive(Clone, Copy)]
struct TopicIdent {
    magic: u64,
    version: u32,
    policy: u32,
    slots: u64,
    slot_size: u64,
    max_msg: u64,
    header_len: u64,
}

impl TopicIdent {
    fn bytes(&self) -> [u8; std::mem::size_of::<TopicIdent>()] {
        let mut out = [0u8; std::mem::size_of::<TopicIdent>()];
        let words = [self.slots, self.slot_size, self.max_msg, self.header_len];
        out[..8].copy_from_slice(&self.magic.to_ne_bytes());
        out[8..12].copy_from_slice(&self.version.to_ne_bytes());
        out[12..16].copy_from_slice(&self.policy.to_ne_bytes());
        for (i, w) in words.iter().enumerate() {
            out[16 + 8 * i..24 + 8 * i].copy_from_slice(&w.to_ne_bytes());
        }
        out
    }
}

/// A topic header with these numbers, as bytes (for fake publishers in tests).
pub fn ident_bytes(policy: u32, slots: u64, slot_size: u64, max_msg: u64, hl: u64) -> Vec<u8> {
    TopicIdent {
        magic: TOPIC_MAGIC,
        version: TOPIC_VERSION,
        policy,
        slots,
        slot_size,
        max_msg,
        header_len: hl,
    }
    .bytes()
    .to_vec()
}

/// Bytes before the first slot.
pub fn header_len() -> usize {
    (CTL_OFFSET + std::mem::size_of::<TopicCtl>()).next_multiple_of(page_size())
}

#[cfg(test)]
thread_local! {
    /// Tests: this thread's topics behave as on a kernel without `F_SEAL_FUTURE_WRITE`.
    pub(crate) static NO_FUTURE_WRITE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Adds `F_SEAL_FUTURE_WRITE` to the seals against resizing: from then on only the
/// mappings that exist (the publisher's) can write the topic. A kernel that lacks the seal
/// (before Linux 5.1) makes this fail closed, since subscribers could then map the topic
/// writable, change what the others read and write into slots the publisher is filling;
/// with `allow_writable` the topic is sealed against resizing only.
fn seal_topic(fd: BorrowedFd<'_>, allow_writable: bool) -> Result<()> {
    #[cfg(test)]
    let unsupported = NO_FUTURE_WRITE.with(|n| n.get());
    #[cfg(not(test))]
    let unsupported = false;
    let future_write = if unsupported {
        Err(io::Error::from_raw_os_error(crate::sys::errno::EINVAL))
    } else {
        memfd::add_seals(fd, memfd::OWNER_SEALS)
    };
    match future_write {
        Ok(()) => Ok(()),
        Err(_) if allow_writable => {
            memfd::add_seals(fd, memfd::SEALS).map_err(|e| Error::io("topic segment: seal", e))
        }
        Err(e) => Err(Error::new(
            ErrorKind::Other,
            format!(
                "this kernel cannot seal the topic against writes by subscribers \
                 (F_SEAL_FUTURE_WRITE, Linux 5.1 and later: {e}), so any subscriber could \
                 change the messages the others read; refusing to create the topic. To \
                 publish anyway, to subscribers you trust, set \
                 PubSubOptions::allow_writable_topic(true)"
            ),
        )),
    }
}

/// A mapped topic segment.
pub struct TopicSegment {
    map: Region,
    geom: Geometry,
    policy: u32,
}

impl TopicSegment {
    /// Creates, maps (read-write) and seals a topic: the publisher's side. The memfd is
    /// returned to be passed to subscribers. On a kernel without `F_SEAL_FUTURE_WRITE`
    /// this fails unless `allow_writable` (see [`seal_topic`]).
    pub fn create(
        geom: Geometry,
        policy: u32,
        allow_writable: bool,
    ) -> Result<(TopicSegment, OwnedFd)> {
        let hl = header_len();
        let size = hl
            .checked_add(geom.data_len())
            .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "topic too large"))?;
        let ctx = |what: &'static str| move |e| Error::io(format!("topic segment: {what}"), e);
        let fd = memfd::create_unsealed("shmlink-topic", size).map_err(ctx("memfd"))?;
        let map = Region::map(fd.as_fd(), size, true).map_err(ctx("mmap"))?;
        // Writable by us (the mapping above), by nobody else from now on.
        seal_topic(fd.as_fd(), allow_writable)?;
        let ident = TopicIdent {
            magic: TOPIC_MAGIC,
            version: TOPIC_VERSION,
            policy,
            slots: geom.slots,
            slot_size: geom.slot_size as u64,
            max_msg: geom.max_msg as u64,
            header_len: hl as u64,
        };
        // SAFETY: the header page is mapped writable, page-aligned and not shared yet.
        unsafe { map.base().cast::<TopicIdent>().write(ident) };
        Ok((TopicSegment { map, geom, policy }, fd))
    }

    /// Maps a topic received from the publisher read-only, after checking its seals and
    /// size, and validates its header against what the handshake announced.
    pub fn attach(fd: &OwnedFd, geom: Geometry, policy: u32, hl: usize) -> Result<TopicSegment> {
        let bad = |why: String| Error::violation(format!("topic segment: {why}"));
        if !geom.valid() || hl != header_len() {
            return Err(bad(format!(
                "geometry {geom:?} with header {hl} bytes is invalid"
            )));
        }
        // `valid` bounds the slot area, so this cannot overflow; checked all the same.
        let size = hl
            .checked_add(geom.data_len())
            .ok_or_else(|| bad(format!("geometry {geom:?} overflows")))?;
        memfd::check_sealed(fd.as_fd(), size).map_err(|e| bad(e.to_string()))?;
        let map = Region::map(fd.as_fd(), size, false)
            .map_err(|e| Error::io("topic segment: mmap", e))?;
        // Copy the header into a local once; the publisher may change it any time.
        // SAFETY: the header page is mapped, readable and page-aligned.
        let h = unsafe { map.base().cast::<TopicIdent>().read_volatile() };
        if h.magic != TOPIC_MAGIC {
            return Err(bad(format!("bad magic {:#018x}", h.magic)));
        }
        if h.version != TOPIC_VERSION {
            return Err(Error::new(
                ErrorKind::VersionMismatch,
                format!(
                    "topic segment version {} (this side knows {TOPIC_VERSION})",
                    h.version
                ),
            ));
        }
        let said = (
            h.policy,
            h.slots,
            h.slot_size,
            h.max_msg,
            h.header_len as usize,
        );
        let told = (
            policy,
            geom.slots,
            geom.slot_size as u64,
            geom.max_msg as u64,
            hl,
        );
        if said != told {
            return Err(bad(format!(
                "header says (policy, slots, slot size, max message, header) {said:?}, handshake said {told:?}"
            )));
        }
        Ok(TopicSegment { map, geom, policy })
    }

    /// The ring in this segment.
    pub fn ring(&self) -> Ring {
        let hl = header_len();
        // SAFETY: the control block lies at CTL_OFFSET (128-aligned) inside the header
        // page, zero-initialised by the memfd; the slots follow the header for
        // `data_len()` bytes (the mapping covers both, checked in `create`/`attach`);
        // `geom` is valid (checked in `attach`, built valid by the publisher). The Ring
        // is used only while this segment lives: its users keep the segment next to it.
        unsafe {
            Ring::new(
                self.map.base().add(CTL_OFFSET).cast(),
                self.map.base().add(hl),
                self.geom,
            )
        }
    }

    /// Whether the kernel keeps everyone but the publisher from writing this segment.
    pub fn read_only_for_subscribers(fd: &OwnedFd) -> bool {
        memfd::seals(fd.as_fd()).is_ok_and(|s| s & memfd::SEAL_FUTURE_WRITE != 0)
    }

    /// The geometry checked in `attach` (or built in `create`).
    pub fn geometry(&self) -> Geometry {
        self.geom
    }

    /// The policy number in the header.
    pub fn policy(&self) -> u32 {
        self.policy
    }
}

/// A one-page segment holding a `T` (all atomics; all-zero is a valid `T`): the bell page
/// and the cursor pages.
pub struct PageSegment<T> {
    map: Region,
    _t: std::marker::PhantomData<T>,
}

impl<T> PageSegment<T> {
    /// Creates and maps a zeroed, sealed page (the publisher's side).
    pub fn create(name: &str) -> Result<(PageSegment<T>, OwnedFd)> {
        let size = page_size();
        assert!(std::mem::size_of::<T>() <= size);
        let fd =
            memfd::create_sealed(name, size).map_err(|e| Error::io(format!("{name}: memfd"), e))?;
        let map = Region::map(fd.as_fd(), size, true)
            .map_err(|e| Error::io(format!("{name}: mmap"), e))?;
        Ok((
            PageSegment {
                map,
                _t: std::marker::PhantomData,
            },
            fd,
        ))
    }

    /// Maps a page received from the publisher, after checking its seals and size.
    pub fn attach(fd: &OwnedFd, name: &str) -> Result<PageSegment<T>> {
        let size = page_size();
        memfd::check_sealed(fd.as_fd(), size)
            .map_err(|e| Error::violation(format!("{name}: {e}")))?;
        let map = Region::map(fd.as_fd(), size, true)
            .map_err(|e| Error::io(format!("{name}: mmap"), e))?;
        Ok(PageSegment {
            map,
            _t: std::marker::PhantomData,
        })
    }

    /// The page's contents.
    pub fn get(&self) -> &T {
        // SAFETY: the mapping is one page, page-aligned (enough for T's 128-byte lines),
        // at least size_of::<T>() bytes (asserted at creation, page-sized at attach), and
        // T consists of atomics only, for which any bit pattern — whatever another
        // process writes — is a valid value. It lives as long as `self`.
        unsafe { self.map.base().cast::<T>().as_ref() }
    }

    /// Start of the mapping (for hostile-peer tests).
    pub fn base(&self) -> NonNull<u8> {
        self.map.base()
    }
}

/// The bell page.
pub type BellSegment = PageSegment<BellPage>;
/// A subscriber's cursor page.
pub type CursorSegment = PageSegment<CursorPage>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorKind, PubSubOptions, Publisher, Subscriber};

    /// Issue 13 (L6): on a kernel without `F_SEAL_FUTURE_WRITE` (injected: this thread's
    /// topics fail to take the seal) the publisher refuses the topic, naming the option;
    /// with the option it publishes a topic that subscribers could write.
    #[test]
    fn a_kernel_without_the_write_seal_is_refused_unless_allowed() {
        let dir = std::env::temp_dir().join(format!("shmlink-seal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let addr = format!("shm:{}/t.sock", dir.display());
        NO_FUTURE_WRITE.with(|n| n.set(true));
        let Err(e) = Publisher::bind(&addr, &PubSubOptions::default()) else {
            panic!("a topic subscribers could write is refused");
        };
        assert_eq!(e.kind(), ErrorKind::Other, "{e}");
        let why = e.to_string();
        assert!(
            why.contains("F_SEAL_FUTURE_WRITE") && why.contains("allow_writable_topic(true)"),
            "{why}"
        );
        assert!(!dir.join("t.sock").exists(), "nothing was bound");

        let opts = PubSubOptions::default().allow_writable_topic(true);
        let mut publisher = Publisher::bind(&addr, &opts).unwrap();
        NO_FUTURE_WRITE.with(|n| n.set(false));
        let mut sub = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
        assert!(!sub.is_read_only(), "the topic is writable, as documented");
        publisher.publish(b"trusted subscribers only").unwrap();
        assert_eq!(sub.recv_vec().unwrap(), b"trusted subscribers only");
        drop(publisher);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn topics_are_sealed_against_writes_by_default() {
        let geom = PubSubOptions::default().geometry();
        let (_seg, fd) = TopicSegment::create(geom, 1, false).unwrap();
        assert!(TopicSegment::read_only_for_subscribers(&fd));
        // What the refusal above stands in for: this kernel has the seal.
        assert!(memfd::seals(fd.as_fd()).unwrap() & memfd::SEAL_FUTURE_WRITE != 0);
    }
}
