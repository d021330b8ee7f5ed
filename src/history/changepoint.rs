//! Change points in a series: E-divisive means (Matteson and James, "A nonparametric
//! approach for multiple change point analysis of multivariate data", JASA 2014), the
//! method Apache Otava (formerly Hunter) builds on. Pure arithmetic, no I/O.
//!
//! The series is split where the energy distance between the points before and after is
//! largest; the split is kept when a permutation test says a split that large is unlikely
//! in the same points shuffled (no change at all), and the search goes on inside the
//! pieces, the most significant split first, until none is. Energy distance (here with
//! exponent 1: mean absolute differences) looks at the whole distribution, not only the
//! mean, so a series whose runs fall into two speeds at random (this lab's guest) is not a
//! change, while a shift of either speed is.
//!
//! The permutations come from a fixed-seed generator: the same series always gives the
//! same answer, which a CI gate needs.

use crate::stats::rng::SplitMix;

/// One change: the series' level moved between `index - 1` and `index`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangePoint {
    /// The first point of the new level.
    pub index: usize,
    /// The permutation test's p-value: the share of shuffles at least as divided.
    pub p_value: f64,
    /// Means of the segments on either side (between the neighbouring change points).
    pub mean_before: f64,
    pub mean_after: f64,
}

impl ChangePoint {
    /// The change of the mean, percent of the level before (positive: the value grew).
    pub fn change_pct(&self) -> f64 {
        if self.mean_before == 0.0 { 0.0 } else { (self.mean_after - self.mean_before) / self.mean_before * 100.0 }
    }
}

/// How hard to look.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Shuffles per test: the smallest p-value reachable is 1 / (permutations + 1).
    pub permutations: u32,
    /// A split is kept when its p-value is at most this.
    pub max_p_value: f64,
    /// Points a segment keeps on either side of a split, at least 2: a single outlying
    /// run is never a level of its own.
    pub min_segment: usize,
}

impl Options {
    /// Runs a segment keeps on either side of a split: `min_segment`, at least 2.
    pub fn segment(&self) -> usize {
        self.min_segment.max(2)
    }

    /// The fewest runs in which a change point can be found: two shortest segments.
    pub fn min_runs(&self) -> usize {
        2 * self.segment()
    }
}

impl Default for Options {
    fn default() -> Self {
        Options { permutations: DEFAULT_PERMUTATIONS, max_p_value: DEFAULT_MAX_P, min_segment: DEFAULT_MIN_SEGMENT }
    }
}

/// The defaults, measured against the lab's noise by `benches/history_detection.rs` (docs/ci.md).
pub const DEFAULT_PERMUTATIONS: u32 = 999;
pub const DEFAULT_MAX_P: f64 = 0.01;
pub const DEFAULT_MIN_SEGMENT: usize = 3;

/// Change points of `x`, in series order.
pub fn find(x: &[f64], opt: &Options) -> Vec<ChangePoint> {
    let runs: Vec<Vec<f64>> = x.iter().map(|&v| vec![v]).collect();
    with_means(&find_in_runs(&runs, opt), x)
}

/// The change points at `splits` (index, p-value) with the means of `x` between them.
pub fn with_means(splits: &[(usize, f64)], x: &[f64]) -> Vec<ChangePoint> {
    let bounds: Vec<usize> = std::iter::once(0).chain(splits.iter().map(|s| s.0)).chain([x.len()]).collect();
    splits
        .iter()
        .enumerate()
        .map(|(i, &(index, p_value))| ChangePoint {
            index,
            p_value,
            mean_before: mean(&x[bounds[i]..index]),
            mean_after: mean(&x[index..bounds[i + 2]]),
        })
        .collect()
}

/// Change points of a series whose runs each hold several values (a run's repeats), as
/// (index of the first run of the new level, p-value), in series order. The distance is
/// measured over every value, so a run's five repeats weigh five times one figure; splits
/// fall between runs only, and the permutations shuffle whole runs, so whatever the
/// repeats of one run share (that day's speed) never passes for a change.
pub fn find_in_runs(runs: &[Vec<f64>], opt: &Options) -> Vec<(usize, f64)> {
    let min_seg = opt.segment();
    let mut rng = SplitMix::new(0x0005_eed0_fc4a_29e5);
    let mut splits: Vec<(usize, f64)> = Vec::new();
    let mut pieces = vec![(0usize, runs.len())];
    let refs: Vec<&[f64]> = runs.iter().map(Vec::as_slice).collect();
    loop {
        // The best split over all pieces.
        let best = pieces
            .iter()
            .enumerate()
            .filter_map(|(k, &(a, b))| best_run_split(&refs[a..b], min_seg).map(|(t, q)| (k, a + t, q)))
            .max_by(|p, q| p.2.total_cmp(&q.2));
        let Some((k, at, q)) = best else { break };
        let p = p_value(&refs, &pieces, q, min_seg, opt, &mut rng);
        if p > opt.max_p_value {
            break;
        }
        let (a, b) = pieces[k];
        pieces.splice(k..=k, [(a, at), (at, b)]);
        splits.push((at, p));
    }
    splits.sort_by_key(|s| s.0);
    splits
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

/// The best split over runs: the one between runs with the largest statistic over
/// their values, at least `min_seg` runs on each side, as (run index, statistic).
fn best_run_split(runs: &[&[f64]], min_seg: usize) -> Option<(usize, f64)> {
    if runs.len() < 2 * min_seg {
        return None;
    }
    let values: Vec<f64> = runs.iter().flat_map(|r| r.iter().copied()).collect();
    // Element offsets where run t begins; splits allowed at runs min_seg..=len-min_seg.
    let mut starts = Vec::with_capacity(runs.len());
    let mut at = 0;
    for r in runs {
        starts.push(at);
        at += r.len();
    }
    let allowed: Vec<usize> = (min_seg..=runs.len() - min_seg).map(|t| starts[t]).collect();
    let (offset, q) = best_split_at(&values, &allowed)?;
    Some((starts.iter().position(|&s| s == offset).expect("an allowed offset starts a run"), q))
}

/// The split of `x` with the largest scaled energy distance, as (index, statistic), with
/// at least `min_seg` points on each side; None when `x` is too short.
#[cfg(test)]
pub(crate) fn best_split(x: &[f64], min_seg: usize) -> Option<(usize, f64)> {
    if x.len() < 2 * min_seg {
        return None;
    }
    best_split_at(x, &(min_seg..=x.len() - min_seg).collect::<Vec<_>>())
}

/// The best of the splits at `allowed` offsets (ascending, each leaving 2 values a side).
///
/// For a split at t, X = x[..t] (m points), Y = x[t..] (n points):
/// Q = m n / (m + n) * (2/(m n) sum|X-Y| - 1/C(m,2) sum_{i<k}|Xi-Xk| - 1/C(n,2) sum_{i<k}|Yi-Yk|).
/// The three sums move by one row of distances per step of t: O(len^2) in all.
fn best_split_at(x: &[f64], allowed: &[usize]) -> Option<(usize, f64)> {
    let len = x.len();
    let last = *allowed.last()?;
    // t = 0: everything in Y.
    let mut within_y: f64 = 0.0;
    for i in 0..len {
        for k in i + 1..len {
            within_y += (x[i] - x[k]).abs();
        }
    }
    let (mut within_x, mut across) = (0.0, 0.0);
    let mut best: Option<(usize, f64)> = None;
    let mut next = allowed.iter().peekable();
    for t in 1..=last {
        // Move x[t-1] from Y to X.
        let v = x[t - 1];
        let to_x: f64 = x[..t - 1].iter().map(|w| (v - w).abs()).sum();
        let to_y: f64 = x[t..].iter().map(|w| (v - w).abs()).sum();
        within_x += to_x;
        within_y -= to_y;
        across += to_y - to_x;
        if next.peek() != Some(&&t) {
            continue;
        }
        next.next();
        let (m, n) = (t as f64, (len - t) as f64);
        if m < 2.0 || n < 2.0 {
            continue;
        }
        let e = 2.0 * across / (m * n) - within_x / (m * (m - 1.0) / 2.0) - within_y / (n * (n - 1.0) / 2.0);
        let q = m * n / (m + n) * e;
        if best.is_none_or(|b| q > b.1) {
            best = Some((t, q));
        }
    }
    best
}

/// The share of shuffles (each piece's runs shuffled within it, as the method prescribes)
/// whose best split over the pieces is at least `q`. Stops as soon as the answer can no
/// longer be at most `max_p_value`: most tests of a steady series end after a few shuffles.
fn p_value(
    runs: &[&[f64]],
    pieces: &[(usize, usize)],
    q: f64,
    min_seg: usize,
    opt: &Options,
    rng: &mut SplitMix,
) -> f64 {
    let r = opt.permutations.max(1);
    let give_up = (opt.max_p_value * f64::from(r + 1)).floor() as u32;
    let mut y = runs.to_vec();
    let mut at_least = 0u32;
    for done in 1..=r {
        for &(a, b) in pieces {
            rng.shuffle(&mut y[a..b]);
        }
        let best =
            pieces.iter().filter_map(|&(a, b)| best_run_split(&y[a..b], min_seg)).map(|s| s.1).fold(f64::MIN, f64::max);
        if best >= q {
            at_least += 1;
            if at_least > give_up {
                return f64::from(at_least + 1) / f64::from(done + 1);
            }
        }
    }
    f64::from(at_least + 1) / f64::from(r + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic noisy series: level plus a pseudo-random wobble of +-`spread`.
    fn noisy(levels: &[(usize, f64)], spread: f64, seed: u64) -> Vec<f64> {
        let mut rng = SplitMix::new(seed);
        levels
            .iter()
            .flat_map(|&(n, level)| (0..n).map(move |_| level).collect::<Vec<_>>())
            .map(|l| l * (1.0 + spread * ((rng.next_u64() % 2001) as f64 / 1000.0 - 1.0)))
            .collect()
    }

    #[test]
    fn best_split_matches_the_definition() {
        let x: [f64; 7] = [1.0, 2.0, 1.5, 9.0, 8.0, 9.5, 8.5];
        let direct = |t: usize| {
            let (a, b) = x.split_at(t);
            let (m, n) = (a.len() as f64, b.len() as f64);
            let across: f64 = a.iter().flat_map(|p| b.iter().map(move |q: &f64| (p - q).abs())).sum();
            let within = |s: &[f64]| -> f64 {
                let mut w = 0.0;
                for i in 0..s.len() {
                    for k in i + 1..s.len() {
                        w += (s[i] - s[k]).abs();
                    }
                }
                w / (s.len() as f64 * (s.len() as f64 - 1.0) / 2.0)
            };
            m * n / (m + n) * (2.0 * across / (m * n) - within(a) - within(b))
        };
        let (t, q) = best_split(&x, 2).unwrap();
        assert_eq!(t, 3);
        assert!((q - direct(3)).abs() < 1e-9, "{q} vs {}", direct(3));
        assert!((2..=5).all(|s| direct(s) <= q + 1e-9));
        assert_eq!(best_split(&x[..3], 2), None, "too short for two segments of 2");
    }

    #[test]
    fn steady_series_rarely_show_a_change() {
        // The test's level is its false-positive rate: at p <= 0.01, about 1 series in 100.
        let found = (1..=300).filter(|&seed| !find(&noisy(&[(40, 100.0)], 0.04, seed), &Options::default()).is_empty());
        let n = found.count();
        assert!(n <= 8, "{n} of 300 steady series showed a change point");
    }

    #[test]
    fn a_step_is_found_where_it_happened() {
        let x = noisy(&[(30, 100.0), (10, 90.0)], 0.02, 7);
        let cps = find(&x, &Options::default());
        assert_eq!(cps.len(), 1, "{cps:?}");
        assert_eq!(cps[0].index, 30);
        assert!((cps[0].change_pct() + 10.0).abs() < 2.0, "{cps:?}");
        assert!(cps[0].p_value <= 0.01);
    }

    #[test]
    fn two_steps_are_both_found() {
        let x = noisy(&[(20, 100.0), (15, 120.0), (15, 100.0)], 0.02, 3);
        let idx: Vec<usize> = find(&x, &Options::default()).iter().map(|c| c.index).collect();
        assert_eq!(idx, vec![20, 35]);
    }

    #[test]
    fn random_two_speed_runs_are_not_a_change() {
        // Each run in the fast (20) or slow (35) mode at random, as this lab's guest runs.
        let mut rng = SplitMix::new(11);
        let x: Vec<f64> = (0..60)
            .map(|_| if rng.next_u64().is_multiple_of(4) { 35.0 } else { 20.0 } + (rng.next_u64() % 100) as f64 / 100.0)
            .collect();
        assert!(find(&x, &Options::default()).is_empty());
    }

    #[test]
    fn one_outlier_at_the_end_is_not_a_level() {
        let mut x = noisy(&[(30, 100.0)], 0.02, 5);
        x.push(60.0);
        assert!(find(&x, &Options::default()).is_empty());
    }

    #[test]
    fn a_far_outlier_does_not_hide_a_step() {
        let mut x = noisy(&[(30, 100.0), (6, 95.0)], 0.02, 13);
        x[12] = 400.0;
        let found = find(&x, &Options::default());
        assert_eq!(found.iter().map(|c| c.index).collect::<Vec<_>>(), vec![30], "{found:?}");
    }

    #[test]
    fn the_same_series_gives_the_same_answer() {
        let x = noisy(&[(25, 100.0), (6, 95.0)], 0.03, 9);
        assert_eq!(find(&x, &Options::default()), find(&x, &Options::default()));
    }
}
