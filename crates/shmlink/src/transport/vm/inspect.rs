//! What a `vm:` region holds, for `shmlink ls --vm`: its live listeners and connection
//! slots, read from the region itself (there is no socket to ask across VMs). Every value
//! is read once and checked like the transport checks it; a guest may be writing the
//! region meanwhile, so a report is a snapshot, not a promise.

use std::path::{Path, PathBuf};

use super::region::{self, Region, LISTENERS, SLOTS};
use super::slot::{self, State};
use super::{listener_entry, region::ID_LEN};
use crate::error::Result;
use crate::sync::{AtomicU64, Ordering};
use shmlink_ring::spsc::TAIL_OFFSET;

/// A `vm:` region's listeners and connections (see [`inspect_vm`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct VmRegionReport {
    /// The region file (host backing file or a guest's `…/resource2`).
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Bytes of each ring (per direction of a connection).
    pub ring: usize,
    /// The region id `auto:` compares, in hex (`None` if it has none yet).
    pub id: Option<String>,
    /// Live listener entries.
    pub listeners: Vec<VmListenerStatus>,
    /// Slots in use (requested, accepted or half-closed connections).
    pub connections: Vec<VmConnectionStatus>,
}

/// A listener entry of a `vm:` region.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct VmListenerStatus {
    /// Its index in the region's table.
    pub index: usize,
    /// Its name (`vm:NAME`).
    pub name: String,
    /// The listening process's id in its own guest (or on the host); 0 if unknown.
    pub pid: u32,
    /// Whether its heartbeat moved while we looked (a dead listener's entry stands still
    /// until the next bind of the name takes it over).
    pub alive: bool,
}

/// A connection slot of a `vm:` region.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct VmConnectionStatus {
    /// The slot's index.
    pub slot: usize,
    /// `request`, `accepted`, `one_gone` or `refused` (the slot's state word).
    pub state: &'static str,
    /// The name of the listener it was made to, if that listener is still the one in
    /// its entry (same nonce).
    pub listener: Option<String>,
    /// The client's and the server's process ids, each in its own guest; 0 if unknown.
    pub client_pid: u32,
    /// See `client_pid`.
    pub server_pid: u32,
    /// Whether the client's heartbeat moved while we looked.
    pub client_alive: bool,
    /// Whether the server's heartbeat moved while we looked.
    pub server_alive: bool,
    /// Bytes written into the client → server ring since the connection began
    /// (records: the messages with their 8-byte headers and padding).
    pub c2s_bytes: u64,
    /// The same for the server → client ring.
    pub s2c_bytes: u64,
}

/// Reads the listeners and connections of the `vm:` region at `region` (else the one
/// `vm:NAME` would use: `$SHMLINK_VM_REGION`, else the guest's ivshmem device). Takes
/// about the death bound (80 ms by default) to tell live heartbeats from still ones.
/// Never writes the region; a region nobody has used is an `InvalidInput` error.
pub fn inspect_vm(region: Option<&Path>) -> Result<VmRegionReport> {
    let path = region::locate(region)?;
    let r = Region::open_as(&path, false, &super::file::Policy::default())?;
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let id = r
        .id(std::time::Duration::ZERO)
        .map(|id: [u8; ID_LEN]| id.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let entries: Vec<Option<(Vec<u8>, u64)>> =
        (0..LISTENERS).map(|i| listener_entry(&r, i)).collect();
    let states: Vec<u32> = (0..SLOTS)
        // A snapshot for `shmlink ls` (`Slot::load`: Acquire).
        .map(|i| slot::Slot::new(r.u32_at(Region::slot(i) + slot::STATE)).load())
        .collect();
    // Every heartbeat of interest, sampled over one wait.
    let mut beats: Vec<&AtomicU64> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.is_some() {
            beats.push(r.u64_at(Region::listener(i) + slot::L_HB));
        }
    }
    let used: Vec<usize> = (0..SLOTS)
        .filter(|&i| states[i] != State::Free as u32 && states[i] != State::Claimed as u32)
        .collect();
    for &i in &used {
        beats.push(r.u64_at(Region::slot(i) + slot::CLIENT_HB));
        beats.push(r.u64_at(Region::slot(i) + slot::SERVER_HB));
    }
    let still = region::stale(&beats);
    let mut still = still.into_iter();
    let mut listeners = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if let Some((name, _)) = e {
            listeners.push(VmListenerStatus {
                index: i,
                name: String::from_utf8_lossy(name).into_owned(),
                pid: r
                    .u32_at(Region::listener(i) + slot::L_PID)
                    // SYNC POINT (bind): Relaxed: the pid is informative; the Release store
                    // of LIVE in `bind` (`Entry::publish`) (loaded in `listener_entry`) published it.
                    .load(Ordering::Relaxed),
                alive: !still.next().unwrap_or(true),
            });
        }
    }
    let mut connections = Vec::new();
    for &i in &used {
        let b = Region::slot(i);
        let state = match states[i] {
            s if s == State::Request as u32 => "request",
            s if s == State::Accepted as u32 => "accepted",
            s if s == State::OneGone as u32 => "one_gone",
            s if s == State::Refused as u32 => "refused",
            _ => "invalid",
        };
        // SYNC POINT (handshake): Acquire, as the state load above (the client wrote these
        // before its Release store of REQUEST).
        let li = r.u32_at(b + slot::LISTENER).load(Ordering::Acquire) as usize;
        // SYNC POINT (handshake): Acquire, as for the listener index.
        let nonce = r.u64_at(b + slot::LISTENER_NONCE).load(Ordering::Acquire);
        let listener = entries
            .get(li)
            .and_then(|e| e.as_ref())
            .filter(|(_, n)| *n == nonce)
            .map(|(name, _)| String::from_utf8_lossy(name).into_owned());
        // SYNC POINT (data): Acquire pairs with the ring's Release store of `tail`
        // (`Producer::publish`); only a count is shown.
        let tail = |off: usize| r.u64_at(b + off + TAIL_OFFSET).load(Ordering::Acquire);
        connections.push(VmConnectionStatus {
            slot: i,
            state,
            listener,
            // SYNC POINT (handshake): Relaxed: informative pids, published by the state
            // changes loaded above.
            client_pid: r.u32_at(b + slot::CLIENT_PID).load(Ordering::Relaxed),
            // SYNC POINT (handshake): Relaxed, as the client's pid.
            server_pid: r.u32_at(b + slot::SERVER_PID).load(Ordering::Relaxed),
            client_alive: !still.next().unwrap_or(true),
            server_alive: !still.next().unwrap_or(true),
            c2s_bytes: tail(slot::C2S_PROD),
            s2c_bytes: tail(slot::S2C_PROD),
        });
    }
    Ok(VmRegionReport {
        path,
        size,
        ring: r.ring(),
        id,
        listeners,
        connections,
    })
}
