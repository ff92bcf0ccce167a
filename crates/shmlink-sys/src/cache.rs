//! The CPU's cache sizes, as the kernel reports them
//! (`/sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}`), read once per
//! process: what the `shm:` transport sizes the fragments of a large message by
//! (docs/design.md §3.2).

use std::path::Path;
use std::sync::OnceLock;

/// The size in bytes of CPU 0's level-2 cache (unified or data), or `None` where the
/// kernel does not say (no sysfs in a container, an unusual CPU). Read once.
pub fn l2_size() -> Option<usize> {
    static L2: OnceLock<Option<usize>> = OnceLock::new();
    *L2.get_or_init(|| level_size(Path::new("/sys/devices/system/cpu/cpu0/cache"), 2))
}

/// The size of the cache of `level` that holds data, from a sysfs cache directory.
fn level_size(dir: &Path, level: u32) -> Option<usize> {
    let read = |p: &Path, name: &str| std::fs::read_to_string(p.join(name)).ok();
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let p = entry.path();
        let this_level = read(&p, "level").and_then(|l| l.trim().parse::<u32>().ok());
        let kind = read(&p, "type");
        if this_level != Some(level) || kind.as_deref().map(str::trim) == Some("Instruction") {
            continue;
        }
        if let Some(size) = read(&p, "size").and_then(|s| parse_size(s.trim())) {
            return Some(size);
        }
    }
    None
}

/// `"512K"`, `"2M"`, `"32768K"` or a plain byte count; `None` for anything else or 0.
fn parse_size(s: &str) -> Option<usize> {
    let (digits, unit) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits
        .parse::<usize>()
        .ok()?
        .checked_mul(unit)
        .filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_sysfs_notation() {
        assert_eq!(parse_size("512K"), Some(512 << 10));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("32768K"), Some(32 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size("0K"), None);
        assert_eq!(parse_size("lots"), None);
    }

    #[test]
    fn the_data_cache_of_a_level_from_a_sysfs_tree() {
        let dir = std::env::temp_dir().join(format!("shmlink-cache-{}", std::process::id()));
        let index = |i: u32, level: &str, kind: &str, size: &str| {
            let p = dir.join(format!("index{i}"));
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("level"), level).unwrap();
            std::fs::write(p.join("type"), kind).unwrap();
            std::fs::write(p.join("size"), size).unwrap();
        };
        index(0, "1\n", "Data\n", "32K\n");
        index(1, "1\n", "Instruction\n", "64K\n");
        index(2, "2\n", "Unified\n", "2048K\n");
        assert_eq!(level_size(&dir, 1), Some(32 << 10));
        assert_eq!(level_size(&dir, 2), Some(2 << 20));
        assert_eq!(level_size(&dir, 3), None);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(level_size(&dir, 2), None, "no sysfs");
    }
}
