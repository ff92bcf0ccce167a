//! The error of a failed run: a message that says which address, which message and what
//! went wrong.

use std::fmt;

/// A failed run (exit code 1).
#[derive(Debug)]
pub struct RunError(String);

/// `Result` with [`RunError`].
pub type Result<T> = std::result::Result<T, RunError>;

impl RunError {
    pub fn new(msg: impl Into<String>) -> RunError {
        RunError(msg.into())
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RunError {}

macro_rules! from_display {
    ($($t:ty),*) => {$(
        impl From<$t> for RunError {
            fn from(e: $t) -> RunError {
                RunError(e.to_string())
            }
        }
    )*};
}
from_display!(shmlink::Error, std::io::Error);

/// Puts what was being done in front of an error.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<RunError>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| RunError(format!("{}: {}", what(), e.into().0)))
    }
}

/// `msg`, a library error, in the terms of the command line: the library names its
/// options as Rust calls (`Options::shared_rendezvous_dir(true)`), the command's user
/// knows them as flags (`--shared-dir`). Messages without such names come back as they
/// are.
pub fn in_cli_terms(msg: &str) -> String {
    shmlink::terms::rephrase(
        msg,
        &shmlink::terms::Vocabulary {
            shared_rendezvous_dir: "--shared-dir",
            allow_uids: "`--allow-uid {uid}`",
            expect_uids: "--expect-uid UID",
            allow_writable_topic:
                "allow_writable_topic (a library option; the CLI has no flag for it)",
            subscribe: "subscribe with `shmlink sub`",
            plain_listener: "this is a plain listener (recv, send --listen, pong --server), not a \
                             topic: `shmlink send` and `shmlink recv --connect` talk to it",
        },
    )
}

#[cfg(test)]
mod tests {
    use super::in_cli_terms;

    #[test]
    fn library_option_names_become_flags() {
        assert_eq!(
            in_cli_terms(
                "has mode 0o777: declare a deliberately shared directory with \
                 Options::shared_rendezvous_dir(true)"
            ),
            "has mode 0o777: declare a deliberately shared directory with --shared-dir"
        );
        assert_eq!(
            in_cli_terms(
                "the listener admits it with Options::allow_uids (`--allow-uid 7` on \
                 shmlink's command line)"
            ),
            "the listener admits it with `--allow-uid 7`"
        );
        assert_eq!(
            in_cli_terms(
                "refused: shm:t is a publish/subscribe topic: connect with Subscriber::connect"
            ),
            "refused: shm:t is a publish/subscribe topic: subscribe with `shmlink sub`"
        );
        let plain = in_cli_terms(
            "handshake: packet kind 16 is publish/subscribe, and this is a plain shm: peer (x)",
        );
        assert!(
            plain.starts_with("handshake: this is a plain listener"),
            "{plain}"
        );
        assert!(plain.ends_with("talk to it (x)"), "{plain}");
        let plain = in_cli_terms(
            "refused: packet kind 17 is publish/subscribe, and this is a plain shm: peer \
             (is shm:p a publisher?)",
        );
        assert!(plain.ends_with("talk to it"), "{plain}");
        assert!(!plain.contains("packet kind"), "{plain}");
        assert_eq!(in_cli_terms("nothing to change"), "nothing to change");
    }
}
