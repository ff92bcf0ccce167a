//! Percentiles of round-trip times.

use serde::Serialize;

/// Round-trip time percentiles in nanoseconds (nearest-rank method: the `p`-th percentile
/// of `n` samples is the `ceil(p/100 · n)`-th smallest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
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
