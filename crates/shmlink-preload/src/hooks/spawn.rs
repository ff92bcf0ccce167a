//! The calls that start a new program: `execve`, `execv`, `execvp`, `execvpe`,
//! `execveat`, `fexecve`, the variadic `execl`, `execlp`, `execle`, and `posix_spawn`,
//! `posix_spawnp`, `system`, `popen`. A new image cannot continue a shm connection (the
//! library's state is gone), so each one it may inherit first continues over the TCP
//! socket underneath (`crate::exec`).

use libc::c_int;

use super::hook;
use crate::state::owner;
use crate::{inside, table};

/// Before an exec: each shm connection the new image may inherit continues over the TCP
/// socket underneath (`exec`). Not in a `vfork` child (it shares our memory, not our
/// fds) nor from inside the library.
fn before_exec() {
    if table::any() && !inside() && owner() {
        crate::exec::prepare_exec();
    }
}

hook! {
    fn execve(path: Arg, argv: Argv, envp: Argv) -> c_int;
    before_real {
        before_exec();
    }
}

hook! {
    fn execv(path: Arg, argv: Argv) -> c_int;
    before_real {
        before_exec();
    }
}

hook! {
    fn execvp(file: Arg, argv: Argv) -> c_int;
    before_real {
        before_exec();
    }
}

hook! {
    fn execvpe(file: Arg, argv: Argv, envp: Argv) -> c_int;
    before_real {
        before_exec();
    }
}

hook! {
    fn execveat(dirfd: c_int, path: Arg, argv: Argv, envp: Argv, flags: c_int) -> c_int;
    before_real {
        before_exec();
    }
}

hook! {
    fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int;
    before_real {
        before_exec();
    }
}

type Arg = *const libc::c_char;
type Argv = *const *const libc::c_char;

hook! {
    /// `posix_spawn`, `posix_spawnp`, `system` and `popen` start a program with the C
    /// library's internal clone and exec, past the exec hooks: the shm connections the new
    /// program may inherit continue over TCP first, as at an `exec` (`crate::exec`). The
    /// calling process goes on over TCP too (as after a failed exec): a connection the child
    /// inherits is one socket shared by both, which only the kernel's TCP socket can be.
    /// A file action that `dup2`s a shm fd the program marked close-on-exec is not seen
    /// (docs/transparent.md, Limits).
    fn posix_spawn(
        pid: *mut libc::pid_t,
        path: Arg,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *mut libc::c_char,
        envp: *const *mut libc::c_char,
    ) -> c_int;
    before_real {
        before_exec();
    }
}

hook! {
    /// `posix_spawnp`: as [`posix_spawn`].
    fn posix_spawnp(
        pid: *mut libc::pid_t,
        file: Arg,
        actions: *const libc::posix_spawn_file_actions_t,
        attr: *const libc::posix_spawnattr_t,
        argv: *const *mut libc::c_char,
        envp: *const *mut libc::c_char,
    ) -> c_int;
    before_real {
        before_exec();
    }
}

hook! {
    /// `system`: as [`posix_spawn`] (`system(NULL)` only asks whether a shell exists).
    fn system(command: Arg) -> c_int;
    before_real {
        if !command.is_null() {
            before_exec();
        }
    }
}

hook! {
    /// `popen`: as [`posix_spawn`].
    fn popen(command: Arg, mode: Arg) -> *mut libc::FILE;
    before_real {
        before_exec();
    }
}

/// The C library's `execl`, `execlp` and `execle` build an argv and call its internal
/// execve, past our hooks, so they are taken over here. They are variadic, which stable
/// Rust cannot define: on the ABIs below a variadic call passes pointer arguments
/// exactly where a call with that many pointer parameters does (registers, then the
/// stack in order), so these read up to 64 of them, stopping at the NULL terminator
/// (and, for `execle`, the envp after it); more arguments fail with `E2BIG`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod variadic {
    use super::{Arg, Argv};
    use libc::c_int;

    /// argv (with its NULL) out of the arguments after the first; `env` also takes
    /// the pointer after the NULL.
    fn split(args: &[Arg], env: bool) -> Option<(Vec<Arg>, Argv)> {
        let n = args.iter().position(|p| p.is_null())?;
        let envp = if env {
            *args.get(n + 1)? as Argv
        } else {
            std::ptr::null()
        };
        Some((args[..=n].to_vec(), envp))
    }

    fn too_many() -> c_int {
        crate::set_errno(libc::E2BIG);
        -1
    }

    /// One of the list forms: `$name($first, a0, …, a63)`, its argv split off the
    /// arguments (`$env`: an envp follows the NULL), then `$call`.
    macro_rules! list_form {
        ($name:ident, $first:ident, $env:expr, |$argv:ident, $envp:ident| $call:expr) => {
            #[no_mangle]
            #[allow(clippy::too_many_arguments)]
            pub unsafe extern "C" fn $name(
                $first: Arg,
                a0: Arg,
                a1: Arg,
                a2: Arg,
                a3: Arg,
                a4: Arg,
                a5: Arg,
                a6: Arg,
                a7: Arg,
                a8: Arg,
                a9: Arg,
                a10: Arg,
                a11: Arg,
                a12: Arg,
                a13: Arg,
                a14: Arg,
                a15: Arg,
                a16: Arg,
                a17: Arg,
                a18: Arg,
                a19: Arg,
                a20: Arg,
                a21: Arg,
                a22: Arg,
                a23: Arg,
                a24: Arg,
                a25: Arg,
                a26: Arg,
                a27: Arg,
                a28: Arg,
                a29: Arg,
                a30: Arg,
                a31: Arg,
                a32: Arg,
                a33: Arg,
                a34: Arg,
                a35: Arg,
                a36: Arg,
                a37: Arg,
                a38: Arg,
                a39: Arg,
                a40: Arg,
                a41: Arg,
                a42: Arg,
                a43: Arg,
                a44: Arg,
                a45: Arg,
                a46: Arg,
                a47: Arg,
                a48: Arg,
                a49: Arg,
                a50: Arg,
                a51: Arg,
                a52: Arg,
                a53: Arg,
                a54: Arg,
                a55: Arg,
                a56: Arg,
                a57: Arg,
                a58: Arg,
                a59: Arg,
                a60: Arg,
                a61: Arg,
                a62: Arg,
                a63: Arg,
            ) -> c_int {
                let Some(($argv, $envp)) = split(
                    &[
                        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16,
                        a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31,
                        a32, a33, a34, a35, a36, a37, a38, a39, a40, a41, a42, a43, a44, a45, a46,
                        a47, a48, a49, a50, a51, a52, a53, a54, a55, a56, a57, a58, a59, a60, a61,
                        a62, a63,
                    ],
                    $env,
                ) else {
                    return too_many();
                };
                // SAFETY: a NULL-terminated argv of the caller's strings (for `execle`,
                // with the caller's envp).
                unsafe { $call }
            }
        };
    }

    list_form!(execl, path, false, |argv, _envp| super::execv(
        path,
        argv.as_ptr()
    ));
    list_form!(execlp, file, false, |argv, _envp| super::execvp(
        file,
        argv.as_ptr()
    ));
    list_form!(execle, path, true, |argv, envp| super::execve(
        path,
        argv.as_ptr(),
        envp
    ));
}
