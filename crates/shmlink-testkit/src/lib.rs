//! The shmlink workspace's test kit, a dev-dependency of every crate's tests (never a
//! dependency of a shipped crate): the one way a test says it cannot run here ([`skip`]),
//! raw `shm:` clients and listeners that break the protocol on purpose, hostile peers, and
//! the directories and child processes tests must clean up whatever happens.
//!
//! It is built on the library's public API, on `shmlink-sys`, and on the few hooks that
//! must reach the library's internals — handshake packets, the raw segment layout, the
//! pub/sub fakes and the fuzz entry points — which the library keeps behind its
//! `testing` feature (`shmlink::testing`, hidden from its docs). The hooks a test needs
//! are re-exported here, so a test imports from one place.

mod process;
mod shm;
mod skips;

pub use process::{install_executable, wait_readable, KillOnDrop, Reaped, TempDir};

pub use shm::{
    attack_read_only, fake_listener, memfd, raw_handshake, raw_handshake_with_fds,
    raw_segment_handshake, segment_memfd, segment_memfd_with, silent_client, AfterAnswer,
    HostilePeer,
};
pub use skips::{skip, REQUIRE_ENV, SKIP_LOG_ENV};

pub use shmlink::testing::{
    bell_stats, boot_id, ivshmem_read_msg, AutoMsg, BellStats, FakeTopic, HandshakePacket,
    HandshakeParams, HostileSubscriber, RefuseCode, TopicPacket, TopicSubscribe, TopicSubscribed,
    FEATURE_PIPE_BELL, SEGMENT_VERSION, VERSION,
};
