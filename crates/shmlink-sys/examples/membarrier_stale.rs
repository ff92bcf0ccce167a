//! Shows why shmlink does not use the asymmetric fence (docs/design.md §4.3): a CPU that
//! was idle when this process registered for global expedited membarriers, and that last
//! ran one of its threads, is skipped by `MEMBARRIER_CMD_GLOBAL_EXPEDITED` while a thread
//! of this process runs there afterwards.
//!
//! The kernel sends the barrier's IPI only to CPUs whose runqueue says "runs a registered
//! process". Registration updates the runqueues whose current task belongs to the process;
//! an idle CPU that still lends the process's memory map to its idle task (lazy TLB) is
//! not updated, and its later switch from idle to the process's thread does not update it
//! either (the scheduler refreshes the state only when the memory map changes). Until the
//! CPU runs another process, every global expedited membarrier passes it by.
//!
//! Run it on a machine with two or more CPUs: `cargo run -p shmlink-sys --example
//! membarrier_stale`. It counts the function-call interrupts (`CAL` in /proc/interrupts)
//! that CPU 1 receives during 1000 membarriers while one of our threads spins there,
//! registering once while the CPU is idle and once while our thread runs on it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;

fn membarrier(cmd: libc::c_int) -> i64 {
    // SAFETY: membarrier takes plain integers.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
}

/// Function-call interrupts received so far by `cpu`.
fn calls_on(cpu: usize) -> u64 {
    let text = std::fs::read_to_string("/proc/interrupts").expect("read /proc/interrupts");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("CAL:"))
        .expect("a CAL line in /proc/interrupts (x86)");
    line.split_whitespace()
        .nth(1 + cpu)
        .and_then(|v| v.parse().ok())
        .expect("a count for CPU 1")
}

/// Involuntary context switches of the calling thread so far.
fn preempted() -> i64 {
    // SAFETY: `ru` is a valid rusage to fill in.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD describes the calling thread.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    ru.ru_nivcsw
}

/// Registers (while CPU 1 is idle, or while our thread runs there), then counts the
/// interrupts CPU 1 receives from 1000 membarriers while our thread spins on it. `None`
/// if the thread was preempted during the count (another task ran on CPU 1, and the
/// count says nothing).
fn case(register_while_idle: bool) -> Option<u64> {
    let phase = Arc::new(AtomicU32::new(0));
    let p = phase.clone();
    shmlink_sys::pin_to_cpu(0).expect("pin to CPU 0");
    let spinner = std::thread::spawn(move || {
        shmlink_sys::pin_to_cpu(1).expect("pin to CPU 1");
        p.store(1, Ordering::SeqCst);
        // Sleep: CPU 1 goes idle, lending it our memory map.
        while p.load(Ordering::SeqCst) == 1 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Spin on CPU 1; note preemptions between the marks 4 and 3.
        while p.load(Ordering::SeqCst) != 4 {
            std::hint::spin_loop();
        }
        let before = preempted();
        p.store(5, Ordering::SeqCst);
        while p.load(Ordering::SeqCst) != 3 {
            std::hint::spin_loop();
        }
        preempted() == before
    });
    // Sleeps, not spins: under `chrt -f` a spinning main thread would keep the spinner
    // from ever starting on CPU 0, where it begins.
    let wait_for = |v| {
        while phase.load(Ordering::SeqCst) != v {
            std::thread::sleep(Duration::from_micros(50));
        }
    };
    wait_for(1);
    std::thread::sleep(Duration::from_millis(200));
    if register_while_idle {
        assert!(shmlink_sys::membarrier_register(), "membarrier unsupported");
    }
    phase.store(2, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(50));
    if !register_while_idle {
        assert!(shmlink_sys::membarrier_register(), "membarrier unsupported");
    }
    phase.store(4, Ordering::SeqCst);
    wait_for(5);
    let before = calls_on(1);
    for _ in 0..1000 {
        membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED);
    }
    let after = calls_on(1);
    phase.store(3, Ordering::SeqCst);
    let alone = spinner.join().unwrap();
    alone.then_some(after - before)
}

fn main() {
    let while_idle = std::env::args().nth(1).as_deref() == Some("--idle");
    if std::env::args().len() == 1 {
        // Each case in its own process: registration lasts for the process.
        for flag in ["--idle", "--running"] {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .arg(flag)
                .output()
                .expect("run a case");
            print!("{}", String::from_utf8_lossy(&out.stdout));
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
        }
        return;
    }
    let when = if while_idle {
        "idle"
    } else {
        "running our thread"
    };
    match case(while_idle) {
        Some(ipis) => println!(
            "registered while CPU 1 was {when}: 1000 global expedited membarriers while our \
             thread ran alone on CPU 1, which received {ipis} function-call interrupts"
        ),
        None => println!(
            "registered while CPU 1 was {when}: inconclusive, our thread was preempted \
             (run it on a quiet machine)"
        ),
    }
}
