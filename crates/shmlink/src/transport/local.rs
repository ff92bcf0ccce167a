//! The local upgrade: a peer reached over the network that shares this kernel (and the
//! rendezvous directory) moves to shared memory. Used by the `auto:` transport and by
//! `auto:` topics of publish/subscribe, which run the same protocol:
//!
//! 1. the client sends its kernel's boot id over the network connection ([`boot_id`]);
//! 2. the server, when the boot ids match ([`same_kernel`]) and it has an upgrade socket
//!    ([`UpgradeSocket`]), answers with an [`Offer`]: a fresh single-use token, a proof,
//!    and the socket's file name and path;
//! 3. the client tries the socket where it finds it ([`UpgradeSocket::candidates`]),
//!    presents the token there (the `shm:` handshake's `Upgrade` packet, or pub/sub's
//!    `Subscribe` with a token) and takes the socket only if it answers with the proof;
//! 4. the client says on the network connection whether it moved, and the server voids
//!    the token otherwise.
//!
//! What differs is only how the messages are framed, and that is the wire format of two
//! protocols that must stay compatible, so it stays where each protocol is defined:
//! `auto:` speaks its own negotiation messages (`SHMLAUTO` `Hello`/`Offer`/`NoOffer`/
//! `Decision`, in `auto.rs`) before the application sees the connection, and its client
//! must announce the outcome with `Decision` because both ends hand the application one
//! connection and must pick the same one; a topic carries the boot id in its `Subscribe`
//! record and the offer in its `Local` record (`pubsub/wire.rs`), and a subscriber that
//! stays simply subscribes again without the local flag (the fan-out side serves it
//! either way, so that second `Subscribe` is the decision, and it voids the token).
//! Everything both sides compute — the boot id and its comparison, tokens, the upgrade
//! socket's name and where a client looks for it, the limits on the offered fields — is
//! here, once.

use std::path::{Path, PathBuf};

use super::shm::handshake::{random_pair, random_token, Token};
use crate::addr::{rendezvous_dir, Address, UnixName};
use crate::error::Result;
use crate::rendezvous::remove_stale_sockets;

/// Longest boot id accepted from a peer.
pub(crate) const MAX_BOOT_ID: usize = 64;
/// Longest upgrade socket file name accepted from a peer.
pub(crate) const MAX_NAME: usize = 255;
/// Longest upgrade socket path accepted from a peer.
pub(crate) const MAX_PATH: usize = 4096;

/// This kernel's boot id; empty if it cannot be read (then nothing is upgraded). Read
/// once per process (six system calls an `auto:` connect no longer makes each time): a
/// process keeps its kernel. A failed read is not remembered.
pub(crate) fn boot_id() -> Vec<u8> {
    static ID: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    if let Some(id) = ID.get() {
        return id.clone();
    }
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().as_bytes().to_vec())
        .unwrap_or_default();
    if !id.is_empty() {
        let _ = ID.set(id.clone());
    }
    id
}

/// Whether a peer whose boot id is `theirs` runs on this kernel (boot id `ours`); if not,
/// why not.
pub(crate) fn same_kernel(ours: &[u8], theirs: &[u8]) -> std::result::Result<(), &'static str> {
    if theirs.is_empty() || ours.is_empty() {
        Err("a boot id is unknown")
    } else if theirs != ours {
        Err("another kernel (different boot id)")
    } else {
        Ok(())
    }
}

/// What a server offers a client on its kernel: where its upgrade socket is, and the
/// single-use token to present there with the proof the socket answers it with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Offer {
    /// Names the client's network connection at the upgrade socket; single-use.
    pub token: Token,
    /// What the upgrade socket answers, so the client knows it is this server.
    pub proof: Token,
    /// The socket's file name in the rendezvous directory.
    pub name: String,
    /// Its absolute path as the server sees it.
    pub path: String,
}

/// A server's upgrade socket: `KIND-PORT-RANDOM.sock` in the rendezvous directory (a
/// random part, so that listeners in other network namespaces on the same port do not
/// collide).
#[derive(Clone, Debug)]
pub(crate) struct UpgradeSocket {
    /// The file name.
    pub name: String,
    /// The full path.
    pub path: PathBuf,
}

impl UpgradeSocket {
    /// Names a new upgrade socket for a server of `kind` (`auto`, `topic`) on `port`,
    /// first removing the sockets of earlier such servers that died without removing
    /// theirs (live ones, another namespace's server on the same port, answer and are
    /// kept).
    pub(crate) fn new(kind: &str, port: &str) -> Result<UpgradeSocket> {
        let tag = random_token()?;
        let name = format!(
            "{kind}-{port}-{:02x}{:02x}{:02x}{:02x}.sock",
            tag[0], tag[1], tag[2], tag[3]
        );
        remove_stale_sockets(&format!("{kind}-{port}-"));
        let path = rendezvous_dir().join(&name);
        Ok(UpgradeSocket { name, path })
    }

    /// Its `shm:` address (what to bind).
    pub(crate) fn address(&self) -> Address {
        Address::Shm {
            socket: UnixName::Path(self.path.clone()),
            text: self.name.clone(),
        }
    }

    /// A new offer of this socket, with a fresh token and proof.
    pub(crate) fn offer(&self) -> Result<Offer> {
        let (token, proof) = random_pair()?;
        Ok(Offer {
            token,
            proof,
            name: self.name.clone(),
            path: self.path.display().to_string(),
        })
    }

    /// Where a client looks for the socket a server offered: under its own rendezvous
    /// directory first (a directory shared between containers may be mounted elsewhere;
    /// only a plain file name is taken), then at the server's path (when absolute).
    pub(crate) fn candidates(name: &str, path: &str) -> Vec<PathBuf> {
        let plain_name = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
        let mut tried = Vec::new();
        if plain_name {
            tried.push(rendezvous_dir().join(name));
        }
        if Path::new(path).is_absolute() && !tried.iter().any(|p| p == Path::new(path)) {
            tried.push(PathBuf::from(path));
        }
        tried
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_kernel_needs_two_equal_known_boot_ids() {
        assert_eq!(same_kernel(b"a", b"a"), Ok(()));
        assert_eq!(
            same_kernel(b"a", b"b"),
            Err("another kernel (different boot id)")
        );
        assert_eq!(same_kernel(b"", b""), Err("a boot id is unknown"));
        assert_eq!(same_kernel(b"a", b""), Err("a boot id is unknown"));
    }

    #[test]
    fn a_client_looks_in_its_own_directory_first_and_never_follows_a_name_with_a_slash() {
        let own = rendezvous_dir().join("topic-1-00.sock");
        assert_eq!(
            UpgradeSocket::candidates("topic-1-00.sock", "/elsewhere/topic-1-00.sock"),
            vec![own.clone(), PathBuf::from("/elsewhere/topic-1-00.sock")]
        );
        assert_eq!(
            UpgradeSocket::candidates("../x.sock", "relative/x.sock"),
            Vec::<PathBuf>::new()
        );
        let own_path = own.display().to_string();
        assert_eq!(
            UpgradeSocket::candidates("topic-1-00.sock", &own_path),
            vec![own]
        );
    }
}
