//! `shmlink vm-host`: the doorbell server of a `vm:` region (QEMU's ivshmem-server
//! protocol on a Unix socket; the `shmlink-vmhost` crate). QEMU's
//! `ivshmem-doorbell` devices and host processes that use `vm:` on the region connect to
//! it; it runs until SIGTERM or SIGINT, then removes its socket.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Args;
use shmlink_vmhost::{HostEvent, VmHost, DEFAULT_MAX_PEERS};

use crate::stop::StopSignals;

/// `shmlink vm-host`.
#[derive(Args, Debug)]
#[command(
    about = "Serve the doorbells of a vm: region (QEMU's ivshmem-doorbell, host processes)",
    long_about = "Serve QEMU's ivshmem-server protocol on a Unix socket for a vm: region: \
                  each QEMU (-chardev socket,path=SOCKET,id=ivs -device \
                  ivshmem-doorbell,chardev=ivs) and each host process using \
                  vm:NAME@REGION gets its peer id, the region and everybody's eventfds, so \
                  that a waiting host process sleeps until it is rung instead of polling. \
                  Creates the region file if missing, owner-only (mode 0600; 0660 with \
                  --group), with O_EXCL and O_NOFOLLOW: whoever can read the file reads \
                  every message. An existing file is used only if it is a regular file (not \
                  a symbolic link) owned by this user, root or a --trust-uid, that nobody \
                  else may read or write (but the --group), in a directory nobody else can \
                  replace it in (your own, or a sticky one such as /dev/shm); otherwise it \
                  says why and exits. The socket gets the same mode and admits only those \
                  users. Runs until SIGTERM or SIGINT. Host processes find the socket at \
                  REGION.bell or $SHMLINK_VM_BELL (docs/vms.md)."
)]
pub struct VmHostCli {
    /// The region's backing file, created owner-only if missing. Put it in a directory
    /// of your own (e.g. /dev/shm/shmlink-vm/pair-1 after `install -d -m 0700
    /// /dev/shm/shmlink-vm`): in /dev/shm itself another user can take the name first,
    /// and vm-host then refuses to start.
    #[arg(long, value_name = "FILE")]
    pub region: PathBuf,
    /// The group (name or number) that may share the region and the socket: mode 0660
    /// instead of 0600 (a QEMU that runs as another user of that group).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// A user id trusted to own an existing region file besides this user and root
    /// (repeatable); its processes may also connect.
    #[arg(long = "trust-uid", value_name = "UID")]
    pub trust_uids: Vec<u32>,
    /// The region's size in MiB (a power of two, at least 16).
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub size_mib: u64,
    /// The socket to listen on [default: REGION.bell].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Interrupt vectors (eventfds) per peer: QEMU's `vectors=` (vm: uses vector 0).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub vectors: u32,
    /// The most peers at once; more are refused.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_PEERS)]
    pub max_peers: usize,
    /// Print a line per peer that joins, leaves or is dropped.
    #[arg(long, short)]
    pub verbose: bool,
}

/// Runs the server.
pub fn run(c: &VmHostCli) -> ExitCode {
    let socket = c.socket.clone().unwrap_or_else(|| {
        let mut s = c.region.as_os_str().to_owned();
        s.push(".bell");
        PathBuf::from(s)
    });
    let stop = Arc::new(AtomicBool::new(false));
    if let Err(e) = StopSignals::block().and_then(|s| s.flag_on_signal(stop.clone())) {
        eprintln!("shmlink vm-host: {e}");
        return ExitCode::from(1);
    }
    let size = c.size_mib.saturating_mul(1 << 20);
    let mut opts = shmlink::Options::default().expect_uids(c.trust_uids.iter().copied());
    if let Some(g) = &c.group {
        match group_id(g) {
            Some(gid) => opts = opts.vm_region_group(gid),
            None => {
                eprintln!("shmlink vm-host: --group {g}: no such group (in /etc/group)");
                return ExitCode::from(1);
            }
        }
    }
    let mut host = match VmHost::bind_with(&socket, &c.region, size, c.vectors, &opts) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("shmlink vm-host: {e}");
            return ExitCode::from(1);
        }
    };
    host.set_max_peers(c.max_peers);
    eprintln!(
        "shmlink vm-host: serving {} on {}",
        c.region.display(),
        socket.display()
    );
    let verbose = c.verbose;
    let r = host.serve(&stop, |e| {
        if verbose || matches!(e, HostEvent::Dropped(..) | HostEvent::Refused(_)) {
            eprintln!("shmlink vm-host: {e:?}");
        }
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shmlink vm-host: {e}");
            ExitCode::from(1)
        }
    }
}

/// The gid of `group`: a number, or a name looked up in /etc/group.
fn group_id(group: &str) -> Option<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Some(gid);
    }
    let text = std::fs::read_to_string("/etc/group").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == group).then(|| f.nth(1)?.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn group_id_takes_numbers_and_names() {
        assert_eq!(super::group_id("1234"), Some(1234));
        assert_eq!(super::group_id("root"), Some(0));
        assert_eq!(super::group_id("no-such-group-shmlink"), None);
    }
}
