//! The pieces of hand-written flag parsing: `--flag=value` or `--flag value`, and the
//! usage error (exit status 2).

use std::fmt;

/// Bad arguments: the message for stderr.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `Err(UsageError(msg))`.
pub fn usage<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// Splits `--flag=value` into the flag and its inline value; any other argument is a flag
/// whose value, if it takes one, is the next argument.
pub fn split_flag(arg: &str) -> (String, Option<String>) {
    match arg.split_once('=') {
        Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
        _ => (arg.to_string(), None),
    }
}

/// The value of `flag`: its inline value, else the next argument.
pub fn flag_value(
    flag: &str,
    inline: &Option<String>,
    args: &mut impl Iterator<Item = String>,
    what: &str,
) -> Result<String, UsageError> {
    match inline.clone().or_else(|| args.next()) {
        Some(v) => Ok(v),
        None => usage(format!("{flag} needs a value ({what})")),
    }
}
