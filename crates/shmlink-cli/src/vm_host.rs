//! `shmlink vm-host`: the doorbell server of a `vm:` region (QEMU's ivshmem-server
//! protocol on a Unix socket; the library's `shmlink::vm_host::VmHost`). QEMU's
//! `ivshmem-doorbell` devices and host processes that use `vm:` on the region connect to
//! it; it runs until SIGTERM or SIGINT, then removes its socket.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Args;
use shmlink::vm_host::{HostEvent, VmHost, DEFAULT_MAX_PEERS};

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
                  Creates the region file if missing. Runs until SIGTERM or SIGINT. Host \
                  processes find the socket at REGION.bell or $SHMLINK_VM_BELL \
                  (docs/vms.md)."
)]
pub struct VmHostCli {
    /// The region's backing file, created if missing (e.g. /dev/shm/shmlink-pair-1).
    #[arg(long, value_name = "FILE")]
    pub region: PathBuf,
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
    let mut host = match VmHost::bind(&socket, &c.region, size, c.vectors) {
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
