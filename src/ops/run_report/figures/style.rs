//! What the four figures share: the canvas and its colours (categorical, and one per
//! verdict), text styles and width estimates, labels that keep out of each other's way,
//! number formats for axes and labels, and the legend strip.

use crate::spec::states::Verdict;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::FigureError;

pub(super) const W: u32 = 1300;
pub(super) const LEGEND_W: u32 = 270;
pub(super) const FONT: &str = "sans-serif";
pub(super) const GRID: RGBColor = RGBColor(225, 225, 225);
pub(super) const BAND: RGBColor = RGBColor(244, 246, 250);

/// Categorical colours (shapes, stages, series), distinguishable and print-safe.
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub(super) fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// Verdict colours: green for progress, grey for "correct but not faster", warm for failures.
pub(super) fn verdict_color(v: Verdict) -> RGBColor {
    match v {
        Verdict::Baseline => RGBColor(27, 94, 32),
        Verdict::Accepted => RGBColor(67, 160, 71),
        Verdict::Rejected => RGBColor(176, 190, 197),
        Verdict::RejectedEarly => RGBColor(207, 216, 220),
        Verdict::Gated => RGBColor(120, 144, 156),
        Verdict::CompileError => RGBColor(255, 183, 77),
        Verdict::Incorrect => RGBColor(229, 57, 53),
        Verdict::CtaMismatch => RGBColor(240, 98, 146),
        Verdict::Crashed => RGBColor(142, 36, 170),
        Verdict::Timeout => RGBColor(121, 85, 72),
        Verdict::Error => RGBColor(183, 28, 28),
        Verdict::Interrupted => RGBColor(255, 238, 88),
        Verdict::Remembered => RGBColor(128, 203, 196),
        Verdict::RejectedProposal => RGBColor(255, 138, 101),
        Verdict::Cheating => RGBColor(33, 33, 33),
        Verdict::Flagged => RGBColor(216, 27, 96),
        Verdict::Running => RGBColor(79, 195, 247),
    }
}

pub(super) fn err(figure: &'static str) -> impl Fn(Box<dyn std::fmt::Display>) -> FigureError {
    move |e| FigureError { figure, message: e.to_string() }
}

/// Box a drawing error for [`err`].
pub(super) fn boxed<E: std::fmt::Display + 'static>(e: E) -> Box<dyn std::fmt::Display> {
    Box::new(e)
}

pub(super) fn text_style(size: u32, c: RGBColor, h: HPos, v: VPos) -> TextStyle<'static> {
    (FONT, size).into_font().color(&c).pos(Pos::new(h, v))
}

/// Estimated width in pixels of `s` at `size` (sans-serif averages ~0.52 em per glyph).
pub(super) fn text_w(s: &str, size: u32) -> i32 {
    (s.chars().count() as f64 * size as f64 * 0.52).ceil() as i32
}

/// Rectangles already holding a label, to leave out labels that would overlap.
#[derive(Default)]
pub(super) struct Placed(Vec<(i32, i32, i32, i32)>);

impl Placed {
    pub(super) fn free(&self, r: (i32, i32, i32, i32)) -> bool {
        !self.0.iter().any(|o| r.0 < o.2 && o.0 < r.2 && r.1 < o.3 && o.1 < r.3)
    }
    pub(super) fn take(&mut self, r: (i32, i32, i32, i32)) -> bool {
        let ok = self.free(r);
        if ok {
            self.0.push(r);
        }
        ok
    }
}

/// A label with a white box behind it, so lines drawn earlier do not cross its text.
pub(super) fn boxed_label(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    label: String,
    r: (i32, i32, i32, i32),
    at: (i32, i32),
    style: TextStyle<'static>,
) -> Result<(), Box<dyn std::fmt::Display>> {
    root.draw(&Rectangle::new([(r.0 - 1, r.1), (r.2 + 1, r.3)], WHITE.mix(0.7).filled())).map_err(boxed)?;
    root.draw(&Text::new(label, at, style)).map_err(boxed)
}

/// Text colour that reads on a bar of colour `c`.
pub(super) fn ink_on(c: RGBColor) -> RGBColor {
    let luma = 0.299 * c.0 as f64 + 0.587 * c.1 as f64 + 0.114 * c.2 as f64;
    if luma < 140.0 {
        WHITE
    } else {
        BLACK
    }
}

/// Axis label of a power-of-two tick: "1x", "2x", "0.5x", "1.19x".
pub(super) fn fmt_pow2(v: f64) -> String {
    let x = 2f64.powf(v);
    if (v - v.round()).abs() < 1e-9 && x >= 1.0 {
        format!("{x:.0}x")
    } else {
        fmt_x(x)
    }
}

/// A log-axis tick: like [`fmt_x`], in powers of ten below 0.01x ("1e-4x").
pub(super) fn fmt_tick(x: f64) -> String {
    if x >= 0.01 {
        fmt_x(x)
    } else {
        format!("{x:.0e}x")
    }
}

/// "2.40x", "0.051x", "12.0x", "25000x", "6.0e-5x": enough digits to read, never more.
pub fn fmt_x(x: f64) -> String {
    if x >= 1000.0 {
        format!("{x:.0}x")
    } else if x >= 10.0 {
        format!("{x:.1}x")
    } else if x >= 0.1 {
        format!("{x:.2}x")
    } else if x >= 0.01 {
        format!("{x:.3}x")
    } else {
        format!("{x:.1e}x")
    }
}

/// A legend in its own strip: a swatch (line or box) and a label per entry.
pub(super) fn legend(area: &DrawingArea<SVGBackend<'_>, Shift>, title: &str, entries: &[(RGBColor, String, bool)], top: i32) -> Result<(), Box<dyn std::fmt::Display>> {
    let mut y = top;
    area.draw(&Text::new(title.to_string(), (8, y), text_style(13, BLACK, HPos::Left, VPos::Center))).map_err(boxed)?;
    y += 20;
    for (c, label, as_line) in entries {
        if *as_line {
            area.draw(&PathElement::new(vec![(8, y), (30, y)], c.stroke_width(3))).map_err(boxed)?;
            area.draw(&Circle::new((19, y), 3, c.filled())).map_err(boxed)?;
        } else {
            area.draw(&Rectangle::new([(10, y - 6), (28, y + 6)], c.filled())).map_err(boxed)?;
        }
        area.draw(&Text::new(label.clone(), (36, y), text_style(12, BLACK, HPos::Left, VPos::Center))).map_err(boxed)?;
        y += 19;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{fmt_pow2, fmt_x};

    #[test]
    fn speedups_keep_about_three_significant_digits() {
        let got: Vec<String> = [25000.0, 529.14, 12.04, 2.5, 0.3, 0.06, 0.00006].iter().map(|&x| fmt_x(x)).collect();
        assert_eq!(got, ["25000x", "529.1x", "12.0x", "2.50x", "0.30x", "0.060x", "6.0e-5x"]);
        assert_eq!(fmt_pow2(3.0), "8x");
        assert_eq!(fmt_pow2(0.25), "1.19x");
    }
}
