//! Byte counts as people write and read them: [`parse`] (`64`, `4k`, `1MiB`), and two
//! ways back to text: [`exact`] (`1MiB`, `1536`: parses back to the same number) and
//! [`human`] (`1 MiB`, `1.5 KiB`: for tables and charts).

/// Binary units from the largest, with their shift.
const UNITS: [(u32, &str); 3] = [(30, "GiB"), (20, "MiB"), (10, "KiB")];

/// Parses a byte count: digits and an optional binary suffix, case-insensitive: `b`;
/// `k`, `kb`, `kib` (1024); `m`, `mb`, `mib`; `g`, `gb`, `gib`.
pub fn parse(text: &str) -> Result<usize, String> {
    let bad = || format!("invalid size {text:?} (expected e.g. 64, 4k, 1MiB)");
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if digits == 0 {
        return Err(bad());
    }
    let n: u64 = text[..digits].parse().map_err(|_| bad())?;
    let shift = match text[digits..].to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(bad()),
    };
    n.checked_mul(1 << shift)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| format!("size {text:?} is too large"))
}

/// `bytes` with the largest binary suffix that divides it, without a space (`4KiB`,
/// `1MiB`), else the plain number (`1536`): [`parse`] reads it back exactly.
pub fn exact(bytes: usize) -> String {
    for (shift, unit) in UNITS {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// `bytes` for people: `64 B`, `1 KiB`, `1.5 KiB`, `16 MiB` (one decimal where the unit
/// does not divide it; KiB and MiB only, as the bench's tables have always shown).
pub fn human(bytes: usize) -> String {
    for (shift, unit) in &UNITS[1..] {
        if bytes >= 1 << shift {
            return if bytes % (1 << shift) == 0 {
                format!("{} {unit}", bytes >> shift)
            } else {
                format!("{:.1} {unit}", bytes as f64 / (1u64 << shift) as f64)
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        for (text, want) in [
            ("0", 0),
            ("64", 64),
            ("64b", 64),
            ("4k", 4096),
            ("4K", 4096),
            ("4kb", 4096),
            ("4KiB", 4096),
            ("1m", 1 << 20),
            ("1MiB", 1 << 20),
            ("1g", 1 << 30),
            ("2GiB", 2 << 30),
        ] {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        for text in ["", "k", "-1", "1.5k", "4 k", "4kk", "4t", "0x10"] {
            assert!(parse(text).is_err(), "{text:?} accepted");
        }
        assert!(parse("99999999999G").unwrap_err().contains("too large"));
    }

    #[test]
    fn exact_round_trips() {
        for s in [0, 1, 64, 1000, 1024, 1536, 4096, 1 << 20, 3 << 20, 1 << 30] {
            assert_eq!(parse(&exact(s)), Ok(s));
        }
        assert_eq!(exact(1 << 20), "1MiB");
        assert_eq!(exact(1536), "1536");
        assert_eq!(exact(1 << 30), "1GiB");
    }

    #[test]
    fn human_rounds_to_one_decimal() {
        assert_eq!(human(64), "64 B");
        assert_eq!(human(1 << 10), "1 KiB");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(1 << 20), "1 MiB");
        assert_eq!(human(16 << 20), "16 MiB");
        assert_eq!(human(1 << 30), "1024 MiB");
    }
}
