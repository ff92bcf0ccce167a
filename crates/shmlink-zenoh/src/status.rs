//! The status file `shmlink ls` reads ([`shmlink::inspect::bridges`]): what a bridge, or
//! an [`ExportingPublisher`](crate::ExportingPublisher), carries across the host's edge,
//! rewritten every second in the rendezvous directory and removed when it stops.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use shmlink::inspect::{self, BridgedTopic};

/// The thread that keeps one status file; stops (and removes the file) on drop.
pub(crate) struct StatusFile {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl StatusFile {
    /// Starts writing `topics()` to the status file of `id` now and every second. The
    /// thread sleeps in between: an idle bridge or publisher costs one wake-up a second.
    pub(crate) fn start(
        id: u128,
        topics: impl Fn() -> Vec<BridgedTopic> + Send + 'static,
    ) -> StatusFile {
        let path = inspect::bridge_status_path(&shmlink::rendezvous_dir(), id);
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("shmlink-zenoh-status".into())
            .spawn(move || {
                loop {
                    if let Err(e) = inspect::write_bridge_status(&path, &topics()) {
                        tracing::debug!(path = %path.display(), error = %e, "status file not written");
                    }
                    // A message or a hang-up (the sender dropped) both mean stop.
                    if stopped.recv_timeout(Duration::from_secs(1))
                        != Err(mpsc::RecvTimeoutError::Timeout)
                    {
                        break;
                    }
                }
                let _ = std::fs::remove_file(&path);
            })
            .expect("spawn the status thread");
        StatusFile {
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops the thread and removes the file (also on drop).
    pub(crate) fn stop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for StatusFile {
    fn drop(&mut self) {
        self.stop();
    }
}
