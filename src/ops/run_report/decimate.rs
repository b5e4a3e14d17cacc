//! Thinning a step curve for drawing: at most a given number of points, keeping every
//! step that would be visible (the first and last change in each x bucket) and the ends.

/// Keep at most `max` of `points` (sorted by `x`). The x span is cut into `max / 2`
/// buckets; each keeps its first and last point, so a step inside a bucket narrower
/// than a pixel still lands at its final level, and the first and last points survive.
pub fn steps<T>(points: Vec<T>, max: usize, x: impl Fn(&T) -> f64) -> Vec<T> {
    if points.len() <= max.max(2) {
        return points;
    }
    let buckets = (max / 2).max(1);
    let lo = x(&points[0]);
    let hi = x(&points[points.len() - 1]);
    let width = (hi - lo) / buckets as f64;
    let bucket = |v: f64| if width > 0.0 { (((v - lo) / width) as usize).min(buckets - 1) } else { 0 };
    let n = points.len();
    let mut keep = vec![false; n];
    let mut i = 0;
    while i < n {
        let b = bucket(x(&points[i]));
        let mut j = i;
        while j + 1 < n && bucket(x(&points[j + 1])) == b {
            j += 1;
        }
        keep[i] = true;
        keep[j] = true;
        i = j + 1;
    }
    points.into_iter().zip(keep).filter_map(|(p, k)| k.then_some(p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_curves_are_kept_whole() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, i as f64)).collect();
        assert_eq!(steps(pts.clone(), 400, |p| p.0), pts);
    }

    #[test]
    fn long_curves_keep_the_ends_and_each_buckets_first_and_last_step() {
        // 10,000 improvements, each a little higher: thinned to <= 400, ends kept, order kept.
        let pts: Vec<(f64, f64)> = (0..10_000).map(|i| (i as f64 * 0.5, 1.0 + i as f64 * 1e-4)).collect();
        let out = steps(pts.clone(), 400, |p| p.0);
        assert!(out.len() <= 400 && out.len() >= 200, "{}", out.len());
        assert_eq!(out.first(), pts.first());
        assert_eq!(out.last(), pts.last());
        assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
        // A jump in the middle of a dense stretch survives as a kept step: its level is reached.
        let mut pts2 = pts.clone();
        pts2[5000].1 = 9.0;
        for p in pts2.iter_mut().skip(5001) {
            p.1 += 8.0;
        }
        let out2 = steps(pts2, 400, |p| p.0);
        let max = out2.iter().map(|p| p.1).fold(0.0, f64::max);
        assert!((max - (1.0 + 9999.0 * 1e-4 + 8.0)).abs() < 1e-9, "{max}");
    }
}
