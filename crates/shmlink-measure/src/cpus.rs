//! The CPUs this process may run on, as kernel CPU lists (`0-3,5`).

/// Parses a kernel CPU list such as `0-3,5,7-8`.
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (lo, hi) = (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?);
        if lo > hi || hi - lo > 1 << 16 {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// Formats CPUs as a kernel CPU list (`0-3,5`).
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// The CPUs this process may run on (`Cpus_allowed_list` of `/proc/self/status`; if that
/// cannot be read, `0..nproc`).
pub fn allowed_cpus() -> Vec<usize> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .and_then(parse_cpu_list)
        })
        .filter(|cpus| !cpus.is_empty())
        .unwrap_or_else(|| {
            (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
        })
}

/// The physical core of `cpu` (package id, core id) from sysfs, if the kernel says.
pub fn core_of(cpu: usize) -> Option<(u32, u32)> {
    let read = |what: &str| {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}"))
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()
    };
    Some((read("physical_package_id")?, read("core_id")?))
}

/// Two CPUs of `allowed` on different physical cores (hyper-thread siblings share caches
/// and execution units, which flatters a benchmark); if the topology is unknown or every
/// CPU is on one core, the first two CPUs. `None` with fewer than two CPUs.
pub fn different_cores(allowed: &[usize]) -> Option<(usize, usize)> {
    let (&a, rest) = allowed.split_first()?;
    let core_a = core_of(a);
    let b = rest
        .iter()
        .copied()
        .find(|&b| core_a.is_some() && core_of(b).is_some_and(|c| Some(c) != core_a))
        .or_else(|| rest.first().copied())?;
    Some((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,5,7-8\n"),
            Some(vec![0, 1, 2, 3, 5, 7, 8])
        );
        assert_eq!(parse_cpu_list("\t2"), Some(vec![2]));
        for bad in ["", "a", "3-1", "1,,2", "-1"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
        }
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 5, 7, 8]), "0-3,5,7-8");
        assert_eq!(format_cpu_list(&[4]), "4");
        assert!(!allowed_cpus().is_empty());
        assert_eq!(different_cores(&[3]), None);
        let (a, b) = different_cores(&[0, 1]).unwrap();
        assert_ne!(a, b);
    }
}
