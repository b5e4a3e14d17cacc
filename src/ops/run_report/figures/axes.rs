//! The bar figures' axes (throughput, gain per stage, verdicts): one category per row,
//! and a linear axis whose ticks are given.

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;

/// A linear f64 axis whose ticks are exactly `ticks` (category centres, powers of two):
/// plotters' own `with_key_points` leaves f64 axes without a label formatter.
#[derive(Clone)]
pub(super) struct Ticked {
    pub(super) range: Range<f64>,
    pub(super) ticks: Vec<f64>,
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let frac = if span > 0.0 { (v - self.range.start) / span } else { 0.0 };
        limit.0 + (frac * (limit.1 - limit.0) as f64).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        self.ticks.clone()
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

/// The category axis of `n` groups: group g spans [n-1-g, n-g), ticks at the centres.
pub(super) fn categories(n: usize) -> Ticked {
    Ticked { range: 0.0..n as f64, ticks: (0..n).map(|g| group_y(n, g) + 0.5).collect() }
}

/// Horizontal bars, grouped by category: the y coordinate of group `g` of `n` (first on top).
pub(super) fn group_y(n: usize, g: usize) -> f64 {
    (n - 1 - g) as f64
}
