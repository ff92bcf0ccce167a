//! The rendezvous directory race (second security review, finding 6): while a listener
//! creates its rendezvous directory, another user swaps a symbolic link to a victim's
//! directory in at the name being created (or at a parent being created). The library
//! must never follow it: the victim's directory keeps its mode, and nothing is made in
//! it. The library makes the directory many times here while a thread swaps the links.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shmlink::{Listener, Options};

const ROUNDS: usize = 3000;
const TIME_LIMIT: Duration = Duration::from_secs(20);

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Binds `shm:race` in `$SHMLINK_DIR` = `rdv` up to [`ROUNDS`] times while `swap` runs in
/// a thread; after each bind the victim must still be mode 0755 and empty. Returns how
/// many binds succeeded (the others met a link, or lost their fresh directory, and
/// failed); every one of them made or opened the directory.
fn race(rdv: &Path, victim: &Path, swap: impl Fn() + Send + 'static) -> usize {
    std::env::set_var("SHMLINK_DIR", rdv);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let swapper = std::thread::spawn(move || {
        while !stop2.load(Ordering::Relaxed) {
            swap();
        }
    });
    let deadline = Instant::now() + TIME_LIMIT;
    let mut bound = 0;
    let mut failure = None;
    for round in 0..ROUNDS {
        if let Ok(l) = Listener::bind("shm:race", &Options::default()) {
            bound += 1;
            drop(l);
        }
        let (m, entries) = (mode(victim), std::fs::read_dir(victim).unwrap().count());
        if m != 0o755 || entries != 0 {
            failure = Some(format!(
                "round {round}: the victim is now mode {m:#o} with {entries} entries"
            ));
            break;
        }
        if Instant::now() > deadline {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    if let Some(f) = failure {
        panic!("{f}");
    }
    bound
}

#[test]
fn a_symlink_swapped_in_while_the_directory_is_made_never_leads_to_the_victim() {
    let base = std::env::temp_dir().join(format!("shmlink-rdv-race-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let scratch = Scratch(base.clone());
    let victim = base.join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).unwrap();

    // The directory itself: an attacker removes the fresh directory and puts a link to
    // the victim in its place, again and again.
    let rdv = base.join("rdv");
    let (r, v) = (rdv.clone(), victim.clone());
    let bound = race(&rdv, &victim, move || {
        let _ = std::fs::remove_dir(&r);
        let _ = std::os::unix::fs::symlink(&v, &r);
        std::thread::yield_now();
        let _ = std::fs::remove_file(&r);
    });
    eprintln!("last component: {bound} of up to {ROUNDS} binds succeeded");

    // A parent the library creates: the link must belong to another user (a link of our
    // own or root's before the last component is followed, as /var/run is), so this half
    // needs root to give it away.
    if euid() != 0 {
        shmlink_testkit::skip("root", "a link owned by another user needs root (lchown)");
        return;
    }
    let chain = base.join("chain");
    let rdv = chain.join("rdv");
    let tmp_link = base.join("link");
    let (c, v) = (chain.clone(), victim.clone());
    let bound = race(&rdv, &victim, move || {
        let _ = std::fs::remove_dir(c.join("rdv"));
        let _ = std::fs::remove_dir(&c);
        let _ = std::fs::remove_file(&tmp_link);
        if std::os::unix::fs::symlink(&v, &tmp_link).is_ok()
            && std::os::unix::fs::lchown(&tmp_link, Some(65534), Some(65534)).is_ok()
        {
            let _ = std::fs::rename(&tmp_link, &c);
        }
        std::thread::yield_now();
        let _ = std::fs::remove_file(&c);
    });
    eprintln!("parent chain: {bound} of up to {ROUNDS} binds succeeded");
    // Without an attacker, binding there works.
    Listener::bind("shm:race", &Options::default()).expect("bind without the swapper");
    drop(scratch);
}

/// The effective uid, from /proc (this test crate does not link libc).
fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("Uid: line in /proc/self/status")
}
