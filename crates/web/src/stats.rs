//! Small statistics toolkit: a seeded PRNG, bootstrap over prompts (paired and unpaired),
//! quantiles, and the interval of a paired Δ. Prompts are the resampling unit because blocks
//! within a prompt are correlated (docs/ui.md §3).
//!
//! The paired Δ's 95% interval (docs/metrics.md §8):
//! - with fewer than [`MIN_SHARED_PROMPTS`] shared prompts, a **paired t-interval**: the
//!   delete-one jackknife standard error of the statistic with Student's t at n − 1 degrees of
//!   freedom (for a macro metric this is exactly the textbook paired t-interval). A percentile
//!   bootstrap over so few prompts is degenerate: it can never reach beyond the smallest or
//!   largest per-prompt Δ (four positive Δs always give a CI above 0) and it ignores the
//!   uncertainty of the standard error itself;
//! - from [`MIN_SHARED_PROMPTS`] on, a **BCa bootstrap** (bias-corrected and accelerated,
//!   Efron 1987): the percentile bootstrap's endpoints moved by the replicates' median bias z₀
//!   and the jackknife skewness (acceleration) a, which matter for ratio statistics.

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

/// Fewest shared prompts for a verdict (significance colour) and a bootstrap interval.
pub const MIN_SHARED_PROMPTS: usize = 20;

/// How a paired interval was computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IntervalMethod {
    /// Jackknife standard error × Student's t at n − 1 degrees of freedom (few prompts).
    PairedT,
    /// Bias-corrected and accelerated bootstrap.
    Bca,
}

impl IntervalMethod {
    pub fn label(self) -> &'static str {
        match self {
            IntervalMethod::PairedT => "paired t",
            IntervalMethod::Bca => "BCa bootstrap",
        }
    }
}

/// A 95% interval and how it was computed.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
    pub method: IntervalMethod,
}

/// Σb/Σd_b − Σa/Σd_a over the items `idx` yields (None when a denominator is 0).
fn ratio_diff(na: &[f64], da: &[f64], nb: &[f64], db: &[f64], skip: Option<usize>) -> Option<f64> {
    let (mut a, mut b, mut c, mut d) = (0.0, 0.0, 0.0, 0.0);
    for i in 0..na.len() {
        if Some(i) == skip {
            continue;
        }
        a += na[i];
        b += da[i];
        c += nb[i];
        d += db[i];
    }
    (b > 0.0 && d > 0.0).then(|| c / d - a / b)
}

/// Delete-one jackknife values of the paired ratio difference (non-finite ones dropped).
fn jackknife(na: &[f64], da: &[f64], nb: &[f64], db: &[f64]) -> Vec<f64> {
    (0..na.len())
        .filter_map(|i| ratio_diff(na, da, nb, db, Some(i)))
        .filter(|x| x.is_finite())
        .collect()
}

/// 95% paired t-interval of any statistic from its jackknife values: θ̂ ± t₀.₉₇₅,ₙ₋₁ · SE_jack.
pub fn t_interval(theta: f64, jack: &[f64]) -> Option<(f64, f64)> {
    let n = jack.len();
    if n < 2 {
        return None;
    }
    let m = mean(jack);
    let ss: f64 = jack.iter().map(|x| (x - m) * (x - m)).sum();
    let se = ((n as f64 - 1.0) / n as f64 * ss).sqrt();
    let h = t_quantile_975(n - 1) * se;
    Some((theta - h, theta + h))
}

/// The paired Δ's 95% interval of Σnb/Σdb − Σna/Σda over the items of `rs` (see the module
/// doc for the choice of method). `None` below two usable items.
pub fn paired_interval(
    rs: &Resamples,
    na: &[f64],
    da: &[f64],
    nb: &[f64],
    db: &[f64],
) -> Option<Interval> {
    let theta = ratio_diff(na, da, nb, db, None)?;
    let jack = jackknife(na, da, nb, db);
    if rs.n < MIN_SHARED_PROMPTS {
        let (lo, hi) = t_interval(theta, &jack)?;
        return Some(Interval {
            lo,
            hi,
            method: IntervalMethod::PairedT,
        });
    }
    let mut v = Vec::with_capacity(rs.reps);
    for r in 0..rs.reps {
        let (mut a, mut b, mut c, mut d) = (0.0, 0.0, 0.0, 0.0);
        for &i in rs.rep(r) {
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
    let (lo, hi) = bca(theta, v, &jack)?;
    Some(Interval {
        lo,
        hi,
        method: IntervalMethod::Bca,
    })
}

/// 95% BCa interval from bootstrap replicates `v` of a statistic θ̂ and its jackknife values.
pub fn bca(theta: f64, mut v: Vec<f64>, jack: &[f64]) -> Option<(f64, f64)> {
    v.retain(|x| x.is_finite());
    if v.len() < 20 {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    // Bias: the share of replicates below θ̂ (ties count half).
    let below = v.iter().filter(|&&x| x < theta).count() as f64;
    let ties = v.iter().filter(|&&x| x == theta).count() as f64;
    let p0 = (below + 0.5 * ties) / v.len() as f64;
    if p0 <= 0.0 || p0 >= 1.0 {
        // Every replicate on one side of θ̂: no bias estimate; the plain percentiles.
        return Some((quantile_sorted(&v, 0.025), quantile_sorted(&v, 0.975)));
    }
    let z0 = normal_quantile(p0);
    // Acceleration from the jackknife skewness.
    let m = mean(jack);
    let (s2, s3) = jack.iter().fold((0.0, 0.0), |(s2, s3), x| {
        let d = m - x;
        (s2 + d * d, s3 + d * d * d)
    });
    let a = if s2 > 0.0 {
        s3 / (6.0 * s2.powf(1.5))
    } else {
        0.0
    };
    let adj = |z: f64| {
        let w = z0 + z;
        normal_cdf(z0 + w / (1.0 - a * w))
    };
    let z = normal_quantile(0.975);
    let (q1, q2) = (adj(-z), adj(z));
    if !(q1.is_finite() && q2.is_finite()) {
        return None;
    }
    Some((quantile_sorted(&v, q1), quantile_sorted(&v, q2)))
}

/// Student's t 0.975 quantile for `df` degrees of freedom: exact to 7 digits up to 30 (table),
/// Cornish–Fisher expansion above (error < 1e-6 there).
pub fn t_quantile_975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706_204_7,
        4.302_652_7,
        3.182_446_3,
        2.776_445_1,
        2.570_581_8,
        2.446_911_9,
        2.364_624_3,
        2.306_004_1,
        2.262_157_2,
        2.228_138_9,
        2.200_985_2,
        2.178_812_8,
        2.160_368_7,
        2.144_786_7,
        2.131_449_5,
        2.119_905_3,
        2.109_815_5,
        2.100_922_0,
        2.093_024_1,
        2.085_963_4,
        2.079_613_8,
        2.073_873_1,
        2.068_657_6,
        2.063_898_6,
        2.059_538_6,
        2.055_529_4,
        2.051_830_5,
        2.048_407_1,
        2.045_229_6,
        2.042_272_5,
    ];
    if df == 0 {
        return f64::INFINITY;
    }
    if df <= 30 {
        return T[df - 1];
    }
    let z = normal_quantile(0.975);
    let v = df as f64;
    let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
    z + (z3 + z) / (4.0 * v)
        + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * v * v)
        + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * v * v * v)
}

/// Standard normal CDF (through the `erfc` below).
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

/// erfc with relative error < 1.2e-7 (Numerical Recipes' Chebyshev fit).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Standard normal quantile (P. J. Acklam's rational approximation, relative error < 1.2e-9).
pub fn normal_quantile(p: f64) -> f64 {
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let pl = 0.02425;
    if p < pl {
        let q = (-2.0 * p.ln()).sqrt();
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    } else if p <= 1.0 - pl {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        let q = (-2.0 * (1.0 - p).ln()).sqrt();
        -(((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
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
    fn normal_and_t_quantiles_known_values() {
        assert!((normal_quantile(0.975) - 1.959_963_985).abs() < 1e-8);
        assert!((normal_quantile(0.5)).abs() < 1e-12);
        assert!((normal_cdf(1.959_963_985) - 0.975).abs() < 1e-6);
        assert!((normal_cdf(-1.0) - 0.158_655_254).abs() < 1e-6);
        assert_eq!(t_quantile_975(3), 3.182_446_3);
        // t(60) = 2.000297822, t(120) = 1.979930405 (R: qt(0.975, df)).
        assert!((t_quantile_975(60) - 2.000_297_822).abs() < 2e-6);
        assert!((t_quantile_975(120) - 1.979_930_405).abs() < 2e-6);
    }

    #[test]
    fn four_prompts_use_a_t_interval_not_the_degenerate_bootstrap() {
        // Four positive per-prompt Δs, one large: the percentile bootstrap's CI cannot go below
        // the smallest Δ (0.01), so it "excludes 0"; the paired t-interval does not.
        let d = [0.01, 0.02, 0.03, 0.30];
        let zeros = vec![0.0; 4];
        let ones = vec![1.0; 4];
        let mut rng = Rng::new(11);
        let rs = Resamples::new(4, 1000, &mut rng);
        let (plo, _) = rs.paired_ratio_diff_ci(&zeros, &ones, &d, &ones).unwrap();
        assert!(plo >= 0.01 - 1e-12, "percentile lower bound {plo}");
        let iv = paired_interval(&rs, &zeros, &ones, &d, &ones).unwrap();
        assert_eq!(iv.method, IntervalMethod::PairedT);
        // By hand: mean 0.09, sd = sqrt(0.059 / 3) = 0.1402379, se = 0.0701189,
        // t(3) = 3.1824463 → 0.09 ± 0.2231497.
        assert!((iv.lo - (0.09 - 0.223_149_7)).abs() < 1e-6, "{iv:?}");
        assert!((iv.hi - (0.09 + 0.223_149_7)).abs() < 1e-6, "{iv:?}");
        assert!(iv.lo < 0.0);
    }

    #[test]
    fn bca_and_t_agree_on_a_large_symmetric_sample() {
        // 400 paired Δs ~ N(0.3, 1): BCa and t must agree within bootstrap noise (and with the
        // normal-theory half-width 1.96 · 1/20 ≈ 0.098).
        let mut rng = Rng::new(5);
        let d: Vec<f64> = (0..400).map(|_| 0.3 + rng.normal()).collect();
        let zeros = vec![0.0; 400];
        let ones = vec![1.0; 400];
        let rs = Resamples::new(400, 4000, &mut rng);
        let b = paired_interval(&rs, &zeros, &ones, &d, &ones).unwrap();
        assert_eq!(b.method, IntervalMethod::Bca);
        let jack = super::jackknife(&zeros, &ones, &d, &ones);
        let (tlo, thi) = t_interval(mean(&d), &jack).unwrap();
        assert!((b.lo - tlo).abs() < 0.01, "BCa {b:?} vs t ({tlo}, {thi})");
        assert!((b.hi - thi).abs() < 0.01, "BCa {b:?} vs t ({tlo}, {thi})");
        assert!(((thi - tlo) / 2.0 - 0.098).abs() < 0.012);
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
