//! Small statistics toolkit: a seeded PRNG, percentile bootstrap over prompts (paired and
//! unpaired), quantiles. Prompts are the resampling unit because blocks within a prompt are
//! correlated (docs/ui.md §3).

/// SplitMix64: tiny, fast, reproducible; good enough for resampling indices.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn from_str_seed(s: &str) -> Self {
        // FNV-1a of the text: the same runs always give the same CI.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in s.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        Rng(h)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Uniform integer in [0, n) (n > 0), without modulo bias worth caring about for n ≪ 2^64.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.f64().max(1e-300);
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Resamples drawn once and reused for every statistic over the same n items, so that the CIs
/// of different metrics of one comparison come from the same bootstrap replicates.
pub struct Resamples {
    pub n: usize,
    pub reps: usize,
    idx: Vec<u32>,
}

impl Resamples {
    pub fn new(n: usize, reps: usize, rng: &mut Rng) -> Self {
        let mut idx = Vec::with_capacity(n * reps);
        if n > 0 {
            for _ in 0..n * reps {
                idx.push(rng.below(n) as u32);
            }
        }
        Resamples { n, reps, idx }
    }
    pub fn rep(&self, r: usize) -> &[u32] {
        &self.idx[r * self.n..(r + 1) * self.n]
    }

    /// 95% percentile CI of a ratio of sums Σnum/Σden over resampled items.
    pub fn ratio_ci(&self, num: &[f64], den: &[f64]) -> Option<(f64, f64)> {
        if self.n < 2 {
            return None;
        }
        let mut v = Vec::with_capacity(self.reps);
        for r in 0..self.reps {
            let (mut a, mut b) = (0.0, 0.0);
            for &i in self.rep(r) {
                a += num[i as usize];
                b += den[i as usize];
            }
            if b > 0.0 {
                v.push(a / b);
            }
        }
        percentile_ci(v)
    }

    /// 95% CI of the mean of `x`.
    pub fn mean_ci(&self, x: &[f64]) -> Option<(f64, f64)> {
        if self.n < 2 {
            return None;
        }
        let mut v = Vec::with_capacity(self.reps);
        for r in 0..self.reps {
            let s: f64 = self.rep(r).iter().map(|&i| x[i as usize]).sum();
            v.push(s / self.n as f64);
        }
        percentile_ci(v)
    }

    /// Paired 95% CI of Σnb/Σdb − Σna/Σda (ratio-of-sums statistic of B minus that of A, on the
    /// same resampled items).
    pub fn paired_ratio_diff_ci(
        &self,
        na: &[f64],
        da: &[f64],
        nb: &[f64],
        db: &[f64],
    ) -> Option<(f64, f64)> {
        if self.n < 2 {
            return None;
        }
        let mut v = Vec::with_capacity(self.reps);
        for r in 0..self.reps {
            let (mut a, mut b, mut c, mut d) = (0.0, 0.0, 0.0, 0.0);
            for &i in self.rep(r) {
                let i = i as usize;
                a += na[i];
                b += da[i];
                c += nb[i];
                d += db[i];
            }
            if b > 0.0 && d > 0.0 {
                v.push(c / d - a / b);
            }
        }
        percentile_ci(v)
    }
}

/// (2.5%, 97.5%) percentiles of bootstrap replicates; `None` with fewer than 20 finite replicates.
pub fn percentile_ci(mut v: Vec<f64>) -> Option<(f64, f64)> {
    v.retain(|x| x.is_finite());
    if v.len() < 20 {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some((quantile_sorted(&v, 0.025), quantile_sorted(&v, 0.975)))
}

/// Linear-interpolated quantile of sorted data (R type 7).
pub fn quantile_sorted(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let h = (v.len() - 1) as f64 * q;
    let lo = h.floor() as usize;
    let hi = h.ceil() as usize;
    v[lo] + (h - lo as f64) * (v[hi] - v[lo])
}

pub fn mean(x: &[f64]) -> f64 {
    if x.is_empty() {
        f64::NAN
    } else {
        x.iter().sum::<f64>() / x.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_match_r_type7() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile_sorted(&v, 0.0), 1.0);
        assert_eq!(quantile_sorted(&v, 0.5), 2.5);
        assert!((quantile_sorted(&v, 0.975) - 3.925).abs() < 1e-12);
    }

    #[test]
    fn rng_is_reproducible_and_uniform_enough() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let mut counts = [0usize; 10];
        for _ in 0..100_000 {
            counts[a.below(10)] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_500..10_500).contains(&c)),
            "{counts:?}"
        );
        let m: f64 = (0..100_000).map(|_| a.normal()).sum::<f64>() / 1e5;
        assert!(m.abs() < 0.02);
    }

    #[test]
    fn bootstrap_ci_of_mean_covers_normal_theory_interval() {
        // 400 draws from N(1, 1): the bootstrap CI of the mean must be close to 1 ± 1.96/20.
        let mut rng = Rng::new(1);
        let x: Vec<f64> = (0..400).map(|_| 1.0 + rng.normal()).collect();
        let m = mean(&x);
        let rs = Resamples::new(x.len(), 2000, &mut rng);
        let (lo, hi) = rs.mean_ci(&x).unwrap();
        assert!(lo < m && m < hi);
        assert!(
            ((hi - lo) - 2.0 * 1.96 / 20.0).abs() < 0.03,
            "width {}",
            hi - lo
        );
    }

    #[test]
    fn paired_ci_is_much_tighter_than_unpaired_for_correlated_runs() {
        // B = A + 0.05 + small noise, A varies a lot between prompts: pairing removes that
        // variance, so the paired CI excludes 0 and is narrow.
        let mut rng = Rng::new(3);
        let a: Vec<f64> = (0..200).map(|_| 3.0 + rng.normal()).collect();
        let b: Vec<f64> = a.iter().map(|x| x + 0.05 + 0.01 * rng.normal()).collect();
        let ones = vec![1.0; 200];
        let rs = Resamples::new(200, 1000, &mut rng);
        let (lo, hi) = rs.paired_ratio_diff_ci(&a, &ones, &b, &ones).unwrap();
        assert!(lo > 0.04 && hi < 0.06, "({lo}, {hi})");
    }
}
