//! One line on stderr through the C library's `write` (with the [`Guard`] held), for the
//! debug log (`settings::log`, which checks `SHMLINK_LOG`) and the refusal events
//! (`refusals`, installed only when that log is on).

use crate::guard::Guard;
use crate::real;

/// Writes `shmlink-preload[PID]: ARGS` and a newline to stderr.
pub(crate) fn write_line(args: std::fmt::Arguments<'_>) {
    let _g = Guard::enter();
    let line = format!("shmlink-preload[{}]: {args}\n", std::process::id());
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        // SAFETY: `rest` is a valid buffer; fd 2 may be closed, which write reports.
        let n = unsafe { real::write(2, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            break;
        }
        rest = &rest[n as usize..];
    }
}
