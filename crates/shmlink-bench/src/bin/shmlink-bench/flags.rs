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

/// A `--methods` list of a pattern: `None` for `all`, else each name found by `find`
/// (`names` lists the valid ones for the error).
pub fn method_list<T>(
    text: &str,
    pattern: &str,
    names: &[&str],
    find: impl Fn(&str) -> Option<T>,
) -> Result<Option<Vec<T>>, UsageError> {
    if text == "all" {
        return Ok(None);
    }
    let mut ms = Vec::new();
    for m in text.split(',').map(str::trim) {
        match find(m) {
            Some(m) => ms.push(m),
            None => {
                return usage(format!(
                    "unknown method {m:?} (valid with --pattern {pattern}: all, {})",
                    names.join(", ")
                ))
            }
        }
    }
    Ok(Some(ms))
}

/// A `--sizes` list of a pattern, each within `range` (`bounds` says it in words).
pub fn size_list(
    text: &str,
    pattern: &str,
    range: std::ops::RangeInclusive<usize>,
    bounds: &str,
) -> Result<Vec<usize>, UsageError> {
    let mut v = Vec::new();
    for s in text.split(',') {
        match shmlink_measure::size::parse(s.trim()) {
            Ok(n) if range.contains(&n) => v.push(n),
            _ => {
                return usage(format!(
                    "invalid size {s:?} for --sizes ({bounds} with --pattern {pattern})"
                ))
            }
        }
    }
    Ok(v)
}

/// A positive count for `flag`.
pub fn positive<T: std::str::FromStr + PartialOrd + Default>(
    text: &str,
    flag: &str,
) -> Result<T, UsageError> {
    match text.parse::<T>() {
        Ok(n) if n > T::default() => Ok(n),
        _ => usage(format!("{flag} needs a positive count")),
    }
}
