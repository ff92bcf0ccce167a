//! `tipc` and `vsock`: listed so the table says why they did not run. Availability is
//! decided by asking the kernel (creating the socket, binding the loopback address); the
//! kernel's error is the reason given.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use crate::method::{Ctx, Endpoint, Method, Prepared};
use crate::sys::{err, syscall};

/// `VMADDR_CID_LOCAL`: the vsock loopback address (`linux/vm_sockets.h`).
const VMADDR_CID_LOCAL: u32 = 1;

pub struct Tipc;
pub struct Vsock;

fn socket(family: libc::c_int, ty: libc::c_int, what: &str) -> Result<OwnedFd, String> {
    // SAFETY: socket takes plain integers.
    match syscall!(socket(family, ty | libc::SOCK_CLOEXEC, 0)) {
        // SAFETY: a new fd that nothing else owns.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        Err(e) => Err(format!("socket({what}): {e}")),
    }
}

fn not_implemented(name: &str) -> String {
    format!("the kernel has {name}, but this suite does not implement the method yet")
}

impl Method for Tipc {
    fn name(&self) -> &'static str {
        "tipc"
    }

    fn about(&self) -> &'static str {
        "TIPC sockets (AF_TIPC); availability probe only"
    }

    fn unavailable(&self) -> Option<String> {
        Some(
            match socket(libc::AF_TIPC, libc::SOCK_RDM, "AF_TIPC, SOCK_RDM") {
                Err(reason) => reason,
                Ok(_) => not_implemented("AF_TIPC"),
            },
        )
    }

    fn prepare(&self, _c: &Ctx) -> io::Result<Prepared> {
        Err(err(self.unavailable().unwrap_or_default()))
    }

    fn connect(&self, _c: &Ctx, _args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        Err(err(self.unavailable().unwrap_or_default()))
    }
}

impl Method for Vsock {
    fn name(&self) -> &'static str {
        "vsock"
    }

    fn about(&self) -> &'static str {
        "vsock loopback (AF_VSOCK, VMADDR_CID_LOCAL); availability probe only"
    }

    fn unavailable(&self) -> Option<String> {
        let fd = match socket(libc::AF_VSOCK, libc::SOCK_STREAM, "AF_VSOCK, SOCK_STREAM") {
            Ok(fd) => fd,
            Err(reason) => return Some(reason),
        };
        // SAFETY: sockaddr_vm is plain data; all-zero is valid.
        let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
        addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
        addr.svm_cid = VMADDR_CID_LOCAL;
        addr.svm_port = libc::VMADDR_PORT_ANY;
        // SAFETY: `addr` is a valid sockaddr_vm of the size passed.
        let bound = syscall!(bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            (&addr as *const libc::sockaddr_vm).cast(),
            std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t
        ));
        Some(match bound {
            Err(e) => format!("bind(AF_VSOCK, VMADDR_CID_LOCAL): {e} (no vsock loopback)"),
            Ok(_) => not_implemented("vsock loopback"),
        })
    }

    fn prepare(&self, _c: &Ctx) -> io::Result<Prepared> {
        Err(err(self.unavailable().unwrap_or_default()))
    }

    fn connect(&self, _c: &Ctx, _args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        Err(err(self.unavailable().unwrap_or_default()))
    }
}
