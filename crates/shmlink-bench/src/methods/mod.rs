//! One module per IPC method, and the registry of all of them in table order.

mod absent;
/// `--pattern connect`: connection setup (its own runner, not a [`Method`]).
pub mod connect;
mod fdio;
mod fifo;
mod floor;
mod floor_line;
pub(crate) mod iceoryx2;
mod inet;
/// `--pattern inproc`: two threads of one process (its own runner, not a [`Method`]).
pub mod inproc;
mod pipe;
mod posix_mq;
mod shm;
mod shmlink;
mod sysv_mq;
mod uds;
pub(crate) mod zmq;

pub use shm::block_signal;

use crate::method::Method;

/// Every method, in the order of the list (kernel methods, the shared-memory
/// floor, shmlink, iceoryx2, ZeroMQ, then the probes).
pub static METHODS: &[&dyn Method] = &[
    &pipe::Pipe,
    &fifo::Fifo,
    &posix_mq::PosixMq,
    &sysv_mq::SysvMq,
    &uds::STREAM,
    &uds::SEQPACKET,
    &uds::DGRAM,
    &inet::Tcp,
    &inet::Udp,
    &shm::SIGNAL,
    &shm::EVENTFD,
    &shm::FUTEX,
    &shm::SPIN,
    &floor::Floor,
    &floor_line::FloorLineMethod,
    &shmlink::SHM,
    &shmlink::SHM_ZC,
    &shmlink::SHM_BATCH,
    &shmlink::SHM_BLOCKING,
    &shmlink::UX,
    &shmlink::TCP,
    &iceoryx2::COPY,
    &iceoryx2::ZERO_COPY,
    &zmq::IPC,
    &zmq::TCP,
    &absent::Tipc,
    &absent::Vsock,
];

/// Removes the kernel objects with names or ids that this process created and that
/// outlive it (message queues); for exits that skip destructors.
pub fn cleanup() {
    posix_mq::unlink_all();
    sysv_mq::remove_all();
}

/// The method called `name`.
pub fn find(name: &str) -> Option<&'static dyn Method> {
    METHODS.iter().copied().find(|m| m.name() == name)
}

/// Every method's name, comma-separated (for error messages).
pub fn names() -> String {
    crate::method::comma_list(METHODS.iter().map(|m| m.name()))
}

/// The median of `xs` (the upper one of an even count); `xs` must not be empty.
pub fn median_f64(xs: impl Iterator<Item = f64>) -> f64 {
    let mut xs: Vec<f64> = xs.collect();
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}
