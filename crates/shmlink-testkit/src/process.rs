//! What tests start and must clean up whatever happens: their own directories and child
//! processes (removed, killed and reaped on drop, a failing test included), and a short
//! wait on a descriptor for accept loops.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// A directory of a test's own, removed with its contents on drop.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process, killed and reaped on drop.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child process killed and reaped on drop unless [`output`](Reaped::output) already
/// waited for it (then it is `None`).
pub struct Reaped(pub Option<Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Reaped {
    /// Waits for exit (at most `deadline`, then kills and fails naming `what`).
    pub fn output(&mut self, what: &str, deadline: Duration) -> Output {
        let mut child = self.0.take().expect("not waited for yet");
        let deadline = Instant::now() + deadline;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "{what} did not exit; stderr: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait_with_output().unwrap()
    }
}

/// Copies `src` to `dst` as an executable (mode 0755) through `install(1)`, a child
/// process, so this process never holds `dst` open for writing. A test that wrote the
/// file itself could not run it reliably: a child forked meanwhile by another test thread
/// keeps the write descriptor until its own exec, and executing `dst` in that window
/// fails with ETXTBSY ("Text file busy").
pub fn install_executable(src: &Path, dst: &Path) {
    let out = Command::new("install")
        .arg("-m")
        .arg("0755")
        .arg(src)
        .arg(dst)
        .output()
        .expect("run install(1)");
    assert!(
        out.status.success(),
        "install {} {}: {}",
        src.display(),
        dst.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether `fd` turns readable within `timeout` (an interrupted wait counts as not).
pub fn wait_readable(fd: &impl AsFd, timeout: Duration) -> bool {
    shmlink_sys::poll_for(fd.as_fd(), shmlink_sys::Interest::READABLE, timeout).unwrap_or(false)
}
