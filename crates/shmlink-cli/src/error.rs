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
    let mut text = msg.to_string();
    // `--allow-uid N` is in the message already, after the Rust name.
    while let Some(start) = text.find("Options::allow_uids (`") {
        let flag_start = start + "Options::allow_uids (`".len();
        let Some(len) = text[flag_start..].find('`') else {
            break;
        };
        let flag = text[flag_start..flag_start + len].to_string();
        let end = text[flag_start..]
            .find(')')
            .map_or(text.len(), |i| flag_start + i + 1);
        text.replace_range(start..end, &format!("`{flag}`"));
    }
    // A subscriber that reached a plain listener: the library speaks of packet kinds.
    const PLAIN: &str = " is publish/subscribe, and this is a plain shm: peer";
    if let Some(end) = text.find(PLAIN) {
        let head = &text[..end];
        let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let start = end - digits;
        if digits > 0 && text[..start].ends_with("packet kind ") {
            let start = start - "packet kind ".len();
            let mut stop = end + PLAIN.len();
            // The subscriber's own guess, answered by the new text.
            if let Some(rest) = text[stop..].strip_prefix(" (is ") {
                if let Some(close) = rest.find(" a publisher?)") {
                    stop += " (is ".len() + close + " a publisher?)".len();
                }
            }
            text.replace_range(
                start..stop,
                "this is a plain listener (recv, send --listen, pong --server), not a \
                 topic: `shmlink send` and `shmlink recv --connect` talk to it",
            );
        }
    }
    for (rust, flag) in [
        ("Options::shared_rendezvous_dir(true)", "--shared-dir"),
        ("shared_rendezvous_dir(true)", "--shared-dir"),
        ("Options::expect_uids", "--expect-uid UID"),
        ("Options::allow_uids", "--allow-uid UID"),
        (
            "connect with Subscriber::connect",
            "subscribe with `shmlink sub`",
        ),
    ] {
        text = text.replace(rust, flag);
    }
    text
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
