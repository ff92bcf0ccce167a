//! Percentiles of round-trip times, and medians across rounds.

use serde::{Deserialize, Serialize};

/// Round-trip time percentiles in nanoseconds (nearest-rank method: the `p`-th percentile
/// of `n` samples is the `ceil(p/100 · n)`-th smallest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest sample.
    pub max: u64,
}

/// The nearest-rank percentile `per_100k / 1000` % of `sorted` (not empty).
fn rank(sorted: &[u64], per_100k: u64) -> u64 {
    let n = sorted.len() as u64;
    let r = (n * per_100k).div_ceil(100_000).max(1);
    sorted[(r - 1) as usize]
}

impl Percentiles {
    /// The percentiles of `samples` (reordered in place); `None` if there are none.
    pub fn of(samples: &mut [u64]) -> Option<Percentiles> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        Some(Percentiles {
            p50: rank(samples, 50_000),
            p90: rank(samples, 90_000),
            p99: rank(samples, 99_000),
            p999: rank(samples, 99_900),
            max: samples[samples.len() - 1],
        })
    }

    /// Each percentile's median across `runs` (not empty): the summary of repeated runs.
    pub fn median_of(runs: &[Percentiles]) -> Option<Percentiles> {
        let field = |f: fn(&Percentiles) -> u64| {
            let mut v: Vec<u64> = runs.iter().map(f).collect();
            median_u64(&mut v)
        };
        Some(Percentiles {
            p50: field(|p| p.p50)?,
            p90: field(|p| p.p90)?,
            p99: field(|p| p.p99)?,
            p999: field(|p| p.p999)?,
            max: field(|p| p.max)?,
        })
    }
}

/// The median of `v` (reordered): the middle value, or the mean of the two middle values
/// (rounded down) for an even count; `None` if empty.
pub fn median_u64(v: &mut [u64]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        v[n / 2 - 1] / 2 + v[n / 2] / 2 + (v[n / 2 - 1] % 2 + v[n / 2] % 2) / 2
    })
}

/// The median of `v` (NaNs sort last); `None` if empty.
pub fn median_f64(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The spread of repeated measurements: `(max - min) / median` in percent; 0 for fewer
/// than two values.
pub fn spread_pct(v: &[f64]) -> f64 {
    let (Some(med), true) = (median_f64(v), v.len() > 1) else {
        return 0.0;
    };
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if med > 0.0 {
        (max - min) / med * 100.0
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_to_a_thousand_in_any_order() {
        let mut v: Vec<u64> = (1..=1000).rev().collect();
        v.swap(10, 900);
        let p = Percentiles::of(&mut v).unwrap();
        assert_eq!(
            p,
            Percentiles {
                p50: 500,
                p90: 900,
                p99: 990,
                p999: 999,
                max: 1000
            }
        );
    }

    #[test]
    fn small_sets_use_nearest_rank() {
        assert_eq!(Percentiles::of(&mut []), None);
        let p = Percentiles::of(&mut [7]).unwrap();
        assert_eq!((p.p50, p.p999, p.max), (7, 7, 7));
        // 10 samples: p50 is the 5th, p90 the 9th, p99 and p99.9 the 10th.
        let mut v: Vec<u64> = (1..=10).map(|x| x * 100).collect();
        let p = Percentiles::of(&mut v).unwrap();
        assert_eq!((p.p50, p.p90, p.p99, p.p999), (500, 900, 1000, 1000));
    }

    #[test]
    fn medians_and_spread() {
        assert_eq!(median_u64(&mut []), None);
        assert_eq!(median_u64(&mut [3, 1, 2]), Some(2));
        assert_eq!(median_u64(&mut [4, 1, 3, 2]), Some(2));
        assert_eq!(median_u64(&mut [u64::MAX, u64::MAX]), Some(u64::MAX));
        assert_eq!(median_f64(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(spread_pct(&[5.0]), 0.0);
        assert!((spread_pct(&[90.0, 100.0, 110.0]) - 20.0).abs() < 1e-9);
        let a = Percentiles {
            p50: 1,
            p90: 2,
            p99: 3,
            p999: 4,
            max: 5,
        };
        let b = Percentiles {
            p50: 3,
            p90: 4,
            p99: 5,
            p999: 6,
            max: 100,
        };
        let c = Percentiles {
            p50: 2,
            p90: 3,
            p99: 4,
            p999: 5,
            max: 6,
        };
        assert_eq!(Percentiles::median_of(&[a, b, c]), Some(c));
        assert_eq!(Percentiles::median_of(&[]), None);
    }

    #[test]
    fn outliers_only_reach_the_high_percentiles() {
        // 100 000 samples of 1000 with 51 slow ones (0.051 %): p99.9 does not see them.
        let mut v = vec![1000u64; 100_000];
        v[0] = 50_000;
        v[1..=50].iter_mut().for_each(|x| *x = 9000);
        let p = Percentiles::of(&mut v).unwrap();
        assert_eq!((p.p50, p.p99, p.p999, p.max), (1000, 1000, 1000, 50_000));
        // 201 slow ones (0.201 %): the 99 900th smallest is now a slow one.
        let mut v = vec![1000u64; 100_000];
        v[0] = 50_000;
        v[1..=200].iter_mut().for_each(|x| *x = 9000);
        let p = Percentiles::of(&mut v).unwrap();
        assert_eq!((p.p99, p.p999, p.max), (1000, 9000, 50_000));
    }
}
