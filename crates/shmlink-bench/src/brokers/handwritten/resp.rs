//! RESP2, the Redis protocol: encoding commands and parsing replies from untrusted bytes.
//!
//! [`parse`] looks at the bytes read so far and returns the first complete value and its
//! length, `None` when the value is not complete yet (read more and call again), or an
//! `InvalidData` error. Every length is bounded before anything is allocated or awaited:
//! bulk strings and whole values up to [`MAX_MESSAGE`](super::MAX_MESSAGE) (plus a little
//! framing), lines up to [`MAX_LINE`], arrays up to [`MAX_ARRAY`] elements nested up to
//! [`MAX_DEPTH`] deep.

use std::io;

use super::MAX_MESSAGE;

/// The longest simple string, error or number line (without CRLF).
pub(crate) const MAX_LINE: usize = 64 * 1024;
/// The most elements in one array.
pub(crate) const MAX_ARRAY: usize = 1024;
/// The deepest nesting of arrays.
pub(crate) const MAX_DEPTH: usize = 4;
/// The most bytes all bulk strings of one value may declare together.
const MAX_VALUE: usize = MAX_MESSAGE + MAX_LINE;

/// One RESP2 value, borrowing from the input.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Value<'a> {
    /// `+OK`
    Simple(&'a [u8]),
    /// `-ERR ...`: the server's error text.
    Error(&'a [u8]),
    /// `:42`
    Int(i64),
    /// `$3\r\nabc`, `None` for the null bulk string `$-1`.
    Bulk(Option<&'a [u8]>),
    /// `*2\r\n...`, `None` for the null array `*-1`.
    Array(Option<Vec<Value<'a>>>),
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The first complete value in `input` and how many bytes it took; `Ok(None)` when
/// `input` ends before the value does.
pub(crate) fn parse(input: &[u8]) -> io::Result<Option<(Value<'_>, usize)>> {
    let mut budget = MAX_VALUE;
    parse_at(input, 0, 0, &mut budget)
}

/// The value starting at `input[pos]` and the position after it.
fn parse_at<'a>(
    input: &'a [u8],
    pos: usize,
    depth: usize,
    budget: &mut usize,
) -> io::Result<Option<(Value<'a>, usize)>> {
    let Some(&kind) = input.get(pos) else {
        return Ok(None);
    };
    let Some((line, mut next)) = line(input, pos + 1)? else {
        return Ok(None);
    };
    let value = match kind {
        b'+' => Value::Simple(line),
        b'-' => Value::Error(line),
        b':' => Value::Int(integer(line)?),
        b'$' => {
            let Some(len) = length(line, MAX_MESSAGE, "bulk string")? else {
                return Ok(Some((Value::Bulk(None), next)));
            };
            *budget = budget.checked_sub(len).ok_or_else(|| {
                invalid(format!("RESP value declares more than {MAX_VALUE} bytes"))
            })?;
            let Some(end) = next.checked_add(len) else {
                return Err(invalid("length overflow".into()));
            };
            // The payload and its CRLF.
            if input.len() < end + 2 {
                return Ok(None);
            }
            if &input[end..end + 2] != b"\r\n" {
                return Err(invalid(format!(
                    "bulk string of {len} bytes not followed by CRLF (found {:02x?})",
                    &input[end..end + 2]
                )));
            }
            let payload = &input[next..end];
            next = end + 2;
            Value::Bulk(Some(payload))
        }
        b'*' => {
            let Some(len) = length(line, MAX_ARRAY, "array")? else {
                return Ok(Some((Value::Array(None), next)));
            };
            if depth + 1 > MAX_DEPTH {
                return Err(invalid(format!(
                    "RESP arrays nested deeper than {MAX_DEPTH}"
                )));
            }
            let mut items = Vec::with_capacity(len);
            for _ in 0..len {
                let Some((item, after)) = parse_at(input, next, depth + 1, budget)? else {
                    return Ok(None);
                };
                items.push(item);
                next = after;
            }
            Value::Array(Some(items))
        }
        other => {
            return Err(invalid(format!(
                "unexpected RESP type byte 0x{other:02x} (expected one of + - : $ *)"
            )));
        }
    };
    Ok(Some((value, next)))
}

/// The line starting at `input[pos]` up to its CRLF, and the position after the CRLF.
fn line(input: &[u8], pos: usize) -> io::Result<Option<(&[u8], usize)>> {
    let rest = input.get(pos..).unwrap_or_default();
    let window = &rest[..rest.len().min(MAX_LINE + 2)];
    match window.iter().position(|&b| b == b'\r') {
        Some(cr) => match window.get(cr + 1) {
            Some(b'\n') => Ok(Some((&rest[..cr], pos + cr + 2))),
            Some(&b) => Err(invalid(format!(
                "CR followed by 0x{b:02x} instead of LF in a RESP line"
            ))),
            None if cr >= MAX_LINE => {
                Err(invalid(format!("RESP line longer than {MAX_LINE} bytes")))
            }
            None => Ok(None),
        },
        None if window.len() > MAX_LINE => {
            Err(invalid(format!("RESP line longer than {MAX_LINE} bytes")))
        }
        None => Ok(None),
    }
}

/// A decimal integer: an optional `-` and 1 to 19 digits, no overflow.
fn integer(line: &[u8]) -> io::Result<i64> {
    let bad = || {
        invalid(format!(
            "bad RESP integer {:?}",
            String::from_utf8_lossy(line)
        ))
    };
    let (negative, digits) = match line.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, line),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(bad());
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(bad());
        }
        let d = i64::from(d - b'0');
        n = n
            .checked_mul(10)
            .and_then(|n| {
                if negative {
                    n.checked_sub(d)
                } else {
                    n.checked_add(d)
                }
            })
            .ok_or_else(bad)?;
    }
    Ok(n)
}

/// A length line: `None` for -1 (null), an error for other negatives or over `max`.
fn length(line: &[u8], max: usize, what: &str) -> io::Result<Option<usize>> {
    let n = integer(line)?;
    if n == -1 {
        return Ok(None);
    }
    let n = usize::try_from(n).map_err(|_| invalid(format!("negative {what} length {n}")))?;
    if n > max {
        return Err(invalid(format!(
            "{what} of {n} elements/bytes is over the limit of {max}"
        )));
    }
    Ok(Some(n))
}

/// Appends the head of a command whose last argument (`tail_len` bytes) the caller writes
/// itself, followed by CRLF: `*N`, then every argument of `args` as a bulk string, then
/// `$tail_len\r\n`. With `tail_len` `None` the command is `args` alone, complete.
pub(crate) fn encode_command(out: &mut Vec<u8>, args: &[&[u8]], tail_len: Option<usize>) {
    let count = args.len() + usize::from(tail_len.is_some());
    out.extend_from_slice(format!("*{count}\r\n").as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    if let Some(len) = tail_len {
        out.extend_from_slice(format!("${len}\r\n").as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> Value<'_> {
        let (v, n) = parse(input).unwrap().unwrap();
        assert_eq!(n, input.len());
        v
    }

    fn err_of(input: &[u8]) -> String {
        let e = parse(input).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        e.to_string()
    }

    #[test]
    fn parses_every_type() {
        assert_eq!(parse_all(b"+OK\r\n"), Value::Simple(b"OK"));
        assert_eq!(parse_all(b"-ERR wrong\r\n"), Value::Error(b"ERR wrong"));
        assert_eq!(parse_all(b":-42\r\n"), Value::Int(-42));
        assert_eq!(parse_all(b":9223372036854775807\r\n"), Value::Int(i64::MAX));
        assert_eq!(
            parse_all(b":-9223372036854775808\r\n"),
            Value::Int(i64::MIN)
        );
        assert_eq!(parse_all(b"$-1\r\n"), Value::Bulk(None));
        assert_eq!(parse_all(b"$0\r\n\r\n"), Value::Bulk(Some(b"")));
        assert_eq!(parse_all(b"*-1\r\n"), Value::Array(None));
        assert_eq!(parse_all(b"*0\r\n"), Value::Array(Some(vec![])));
    }

    #[test]
    fn bulk_strings_are_binary_safe() {
        let v = parse_all(b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$6\r\n\r\n\0\xff\r\n\r\n");
        let payload: &[u8] = b"\r\n\0\xff\r\n";
        assert_eq!(
            v,
            Value::Array(Some(vec![
                Value::Bulk(Some(b"message")),
                Value::Bulk(Some(b"ch")),
                Value::Bulk(Some(payload)),
            ]))
        );
    }

    #[test]
    fn every_prefix_is_incomplete_and_leaves_the_rest() {
        let msg = b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n:7\r\n";
        let first = msg.len() - 4;
        for cut in 0..first {
            assert_eq!(parse(&msg[..cut]).unwrap(), None, "prefix of {cut} bytes");
        }
        let (_, n) = parse(msg).unwrap().unwrap();
        assert_eq!(n, first);
        assert_eq!(parse(&msg[n..]).unwrap(), Some((Value::Int(7), 4)));
    }

    #[test]
    fn hostile_lengths_are_refused_before_waiting() {
        assert!(err_of(b"$16777217\r\n").contains("over the limit"));
        assert!(err_of(b"$99999999999999999999\r\n").contains("bad RESP integer"));
        assert!(err_of(b"$-2\r\n").contains("negative"));
        assert!(err_of(b"*1025\r\n").contains("over the limit"));
        // Many large bulk strings in one value: the total is bounded too.
        let mut many = b"*4\r\n".to_vec();
        for _ in 0..2 {
            many.extend_from_slice(b"$16777216\r\n");
            many.extend(std::iter::repeat_n(b'x', 16 << 20));
            many.extend_from_slice(b"\r\n");
        }
        assert!(err_of(&many).contains("declares more than"));
        // Nesting.
        assert!(err_of(b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n").contains("nested deeper"));
    }

    #[test]
    fn malformed_input_is_invalid_data() {
        assert!(err_of(b"?what\r\n").contains("type byte 0x3f"));
        assert!(err_of(b":12a\r\n").contains("bad RESP integer"));
        assert!(err_of(b":\r\n").contains("bad RESP integer"));
        assert!(err_of(b":+1\r\n").contains("bad RESP integer"));
        assert!(err_of(b":99999999999999999999\r\n").contains("bad RESP integer"));
        assert!(err_of(b"+OK\rX").contains("instead of LF"));
        assert!(err_of(b"$3\r\nabcX\r\n").contains("not followed by CRLF"));
        let long = [&b"+"[..], &vec![b'a'; MAX_LINE + 1]].concat();
        assert!(err_of(&long).contains("longer than"));
        // Just under the limit without CRLF yet: wait for more.
        let ok = [&b"+"[..], &vec![b'a'; MAX_LINE]].concat();
        assert_eq!(parse(&ok).unwrap(), None);
    }

    #[test]
    fn commands_are_encoded_as_bulk_string_arrays() {
        let mut out = Vec::new();
        encode_command(&mut out, &[b"PUBLISH", b"ch"], Some(3));
        out.extend_from_slice(b"a\r\n\r\n");
        assert_eq!(out, b"*3\r\n$7\r\nPUBLISH\r\n$2\r\nch\r\n$3\r\na\r\n\r\n");
        out.clear();
        encode_command(&mut out, &[b"PING"], None);
        assert_eq!(out, b"*1\r\n$4\r\nPING\r\n");
    }

    /// Random bytes drawn mostly from RESP's own characters, and every prefix of them:
    /// parsing never panics, and a value it returns never claims more than the input.
    #[test]
    fn random_input_never_panics() {
        let alphabet = b"+-:$*\r\n0123456789-1abc";
        let mut next = crate::brokers::xorshift(1);
        for _ in 0..20_000 {
            let len = (next() % 40) as usize;
            let input: Vec<u8> = (0..len)
                .map(|_| match next() % 8 {
                    0 => next() as u8,
                    _ => alphabet[(next() % alphabet.len() as u64) as usize],
                })
                .collect();
            for cut in 0..=input.len() {
                if let Ok(Some((_, n))) = parse(&input[..cut]) {
                    assert!(n <= cut);
                }
            }
        }
    }
}
