//! The report's four figures as SVG, drawn with plotters' SVG backend from [`RunData`]:
//! speedup vs budget, throughput against SDPA's backends, gain per stage, verdicts per
//! stage. Text is emitted as SVG `<text>` (no fonts are loaded), so every number a
//! figure shows can be read back from the file.

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::ops::run_report::data::{Reference, RunData, VERDICT_ORDER};

#[derive(Debug, thiserror::Error)]
#[error("cannot draw figure `{figure}`: {message}")]
pub struct FigureError {
    figure: &'static str,
    message: String,
}

/// One figure: its file name next to the report, its title and the SVG text.
#[derive(Debug, Clone)]
pub struct Figure {
    pub file: &'static str,
    pub title: String,
    pub svg: String,
}

const W: u32 = 1300;
const LEGEND_W: u32 = 270;
const FONT: &str = "sans-serif";
const GRID: RGBColor = RGBColor(225, 225, 225);
const BAND: RGBColor = RGBColor(244, 246, 250);

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

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// Verdict colours: green for progress, grey for "correct but not faster", warm for failures.
fn verdict_color(v: &str) -> RGBColor {
    match v {
        "baseline" => RGBColor(27, 94, 32),
        "accepted" => RGBColor(67, 160, 71),
        "rejected" => RGBColor(176, 190, 197),
        "gated" => RGBColor(120, 144, 156),
        "compile_error" => RGBColor(255, 183, 77),
        "incorrect" => RGBColor(229, 57, 53),
        "cta_mismatch" => RGBColor(240, 98, 146),
        "crashed" => RGBColor(142, 36, 170),
        "timeout" => RGBColor(121, 85, 72),
        "error" => RGBColor(183, 28, 28),
        "interrupted" => RGBColor(255, 238, 88),
        "remembered" => RGBColor(128, 203, 196),
        "rejected_proposal" => RGBColor(255, 138, 101),
        "cheating" => RGBColor(33, 33, 33),
        "flagged" => RGBColor(216, 27, 96),
        "running" => RGBColor(79, 195, 247),
        _ => RGBColor(66, 66, 66),
    }
}

fn err(figure: &'static str) -> impl Fn(Box<dyn std::fmt::Display>) -> FigureError {
    move |e| FigureError { figure, message: e.to_string() }
}

/// Box a drawing error for [`err`].
fn boxed<E: std::fmt::Display + 'static>(e: E) -> Box<dyn std::fmt::Display> {
    Box::new(e)
}

fn text_style(size: u32, c: RGBColor, h: HPos, v: VPos) -> TextStyle<'static> {
    (FONT, size).into_font().color(&c).pos(Pos::new(h, v))
}

/// Estimated width in pixels of `s` at `size` (sans-serif averages ~0.52 em per glyph).
fn text_w(s: &str, size: u32) -> i32 {
    (s.chars().count() as f64 * size as f64 * 0.52).ceil() as i32
}

/// Rectangles already holding a label, to leave out labels that would overlap.
#[derive(Default)]
struct Placed(Vec<(i32, i32, i32, i32)>);

impl Placed {
    fn free(&self, r: (i32, i32, i32, i32)) -> bool {
        !self.0.iter().any(|o| r.0 < o.2 && o.0 < r.2 && r.1 < o.3 && o.1 < r.3)
    }
    fn take(&mut self, r: (i32, i32, i32, i32)) -> bool {
        let ok = self.free(r);
        if ok {
            self.0.push(r);
        }
        ok
    }
}

/// A label with a white box behind it, so lines drawn earlier do not cross its text.
fn boxed_label(
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
fn ink_on(c: RGBColor) -> RGBColor {
    let luma = 0.299 * c.0 as f64 + 0.587 * c.1 as f64 + 0.114 * c.2 as f64;
    if luma < 140.0 {
        WHITE
    } else {
        BLACK
    }
}

/// Axis label of a power-of-two tick: "1x", "2x", "0.5x", "1.19x".
fn fmt_pow2(v: f64) -> String {
    let x = 2f64.powf(v);
    if (v - v.round()).abs() < 1e-9 && x >= 1.0 {
        format!("{x:.0}x")
    } else {
        fmt_x(x)
    }
}

/// A log-axis tick: like [`fmt_x`], in powers of ten below 0.01x ("1e-4x").
fn fmt_tick(x: f64) -> String {
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
fn legend(area: &DrawingArea<SVGBackend<'_>, Shift>, title: &str, entries: &[(RGBColor, String, bool)], top: i32) -> Result<(), Box<dyn std::fmt::Display>> {
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

/// Figure 1: each shape's best speedup over the reference as a step line over budget time,
/// the 1.0x line, a marker at every acceptance (labelled with its stage where the stage
/// changes and there is room) and the final value at the end of each line.
pub fn speedup(d: &RunData) -> Result<Option<Figure>, FigureError> {
    if d.curves.is_empty() {
        return Ok(None);
    }
    let title = format!("Speedup over {} vs budget used", d.reference.label());
    let mut svg = String::new();
    draw_speedup(d, &title, &mut svg).map_err(err("speedup"))?;
    Ok(Some(Figure { file: "speedup.svg", title, svg }))
}

fn draw_speedup(d: &RunData, title: &str, svg: &mut String) -> Result<(), Box<dyn std::fmt::Display>> {
    let h = 620u32.max(120 + 19 * d.curves.len() as u32);
    let root = SVGBackend::with_string(svg, (W, h)).into_drawing_area();
    root.fill(&WHITE).map_err(boxed)?;
    let (plot, side) = root.split_horizontally(W - LEGEND_W);
    let minutes = d.budget_s >= 300.0;
    let unit = if minutes { 60.0 } else { 1.0 };
    // Room right of the lines' ends for their final values.
    let x_max = (d.budget_s / unit).max(1e-3) * 1.09;
    let ys = d.curves.iter().flat_map(|c| c.points.iter().map(|p| p.speedup)).chain([1.0]);
    let (lo, hi) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let (y_lo, y_hi) = (lo / 1.35, hi * 1.35);
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, (y_lo..y_hi).log_scale())
        .map_err(boxed)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(GRID)
        .x_desc(if minutes { "budget used (minutes)" } else { "budget used (seconds)" })
        .y_desc(format!("speedup over {} (log scale)", d.reference.label()))
        .y_label_formatter(&|v| fmt_tick(*v))
        .x_label_formatter(&|v| if x_max < 10.0 { format!("{v:.1}") } else { format!("{v:.0}") })
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()
        .map_err(boxed)?;

    // Stage bands: where in the budget each stage ran (open-phase classes share one band).
    let mut placed = Placed::default();
    let bands = stage_bands(d);
    for (i, (name, t0, t1)) in bands.iter().enumerate() {
        let (a, b) = (t0 / unit, t1 / unit);
        if i % 2 == 0 {
            chart.draw_series(std::iter::once(Rectangle::new([(a, y_lo), (b, y_hi)], BAND.filled()))).map_err(boxed)?;
        }
        let (px0, py) = chart.backend_coord(&(a, y_hi));
        let (px1, _) = chart.backend_coord(&(b, y_hi));
        let label = name.clone();
        if px1 - px0 >= text_w(&label, 11) + 4 {
            let r = (px0 + 2, py + 2, px0 + 2 + text_w(&label, 11), py + 16);
            if placed.take(r) {
                root.draw(&Text::new(label, (px0 + 3, py + 4), text_style(11, RGBColor(90, 90, 90), HPos::Left, VPos::Top))).map_err(boxed)?;
            }
        }
    }

    chart
        .draw_series(DashedLineSeries::new(vec![(0.0, 1.0), (x_max, 1.0)], 6, 4, BLACK.stroke_width(1)))
        .map_err(boxed)?;
    if d.in_progress() {
        // Where the run is now, against its whole budget.
        let now = d.run.used_s / unit;
        chart.draw_series(DashedLineSeries::new(vec![(now, y_lo), (now, y_hi)], 3, 3, RGBColor(90, 90, 90).stroke_width(1))).map_err(boxed)?;
        let (px, py) = chart.backend_coord(&(now, y_lo));
        let label = format!("now ({})", crate::pipeline::record::fmt_dur(std::time::Duration::from_secs_f64(d.run.used_s)));
        let r = (px + 3, py - 16, px + 3 + text_w(&label, 11), py - 2);
        placed.take(r);
        root.draw(&Text::new(label, (px + 3, py - 3), text_style(11, RGBColor(90, 90, 90), HPos::Left, VPos::Bottom))).map_err(boxed)?;
    }
    let (px, py) = chart.backend_coord(&(0.0, 1.0));
    let one = format!("1.0x = {}", d.reference.label());
    placed.take((px + 4, py - 16, px + 4 + text_w(&one, 11), py - 2));
    root.draw(&Text::new(one, (px + 4, py - 3), text_style(11, BLACK, HPos::Left, VPos::Bottom))).map_err(boxed)?;

    for (i, c) in d.curves.iter().enumerate() {
        let col = color(i);
        let mut line: Vec<(f64, f64)> = Vec::with_capacity(c.points.len() * 2 + 1);
        for p in &c.points {
            if let Some(&(_, y)) = line.last() {
                line.push((p.t_s / unit, y));
            }
            line.push((p.t_s / unit, p.speedup));
        }
        line.push((c.end_s / unit, c.last));
        chart.draw_series(LineSeries::new(line, col.stroke_width(2))).map_err(boxed)?;
        chart
            .draw_series(c.points.iter().map(|p| Circle::new((p.t_s / unit, p.speedup), 3, col.filled())))
            .map_err(boxed)?;
    }
    // Labels after every line, so none is painted over: line ends first (the numbers), then
    // stages. Lines ending on the same value share one label; labels stay inside the plot.
    let (_, plot_y) = chart.plotting_area().get_pixel_range();
    let mut ends: Vec<(String, i32)> = Vec::new();
    for (i, c) in d.curves.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(c.end_s / unit, c.last));
        let label = fmt_x(c.last);
        if ends.iter().any(|(l, y)| *l == label && (y - py).abs() < 6) {
            continue;
        }
        let w = text_w(&label, 12);
        for dy in [0, 14, -14, 28, -28, 42, -42] {
            let r = (px + 5, py + dy - 7, px + 5 + w, py + dy + 7);
            if r.1 >= plot_y.start && r.3 <= plot_y.end && placed.take(r) {
                boxed_label(&root, label.clone(), r, (px + 5, py + dy), text_style(12, color(i), HPos::Left, VPos::Center))?;
                ends.push((label, py));
                break;
            }
        }
    }
    for (i, c) in d.curves.iter().enumerate() {
        let mut prev: Option<&str> = None;
        for p in &c.points {
            if prev == Some(p.stage.as_str()) {
                continue;
            }
            prev = Some(&p.stage);
            let (px, py) = chart.backend_coord(&(p.t_s / unit, p.speedup));
            let label = format!("#{} {}", p.seq, p.stage);
            let r = (px + 4, py + 3, px + 4 + text_w(&label, 10), py + 15);
            if placed.take(r) {
                boxed_label(&root, label, r, (px + 4, py + 4), text_style(10, color(i), HPos::Left, VPos::Top))?;
            }
        }
    }
    let entries: Vec<(RGBColor, String, bool)> =
        d.curves.iter().enumerate().map(|(i, c)| (color(i), format!("{}  {}", c.shape, fmt_x(c.last)), true)).collect();
    legend(&side, "shape  (speedup at the end)", &entries, 40)?;
    root.present().map_err(boxed)?;
    Ok(())
}

/// Contiguous stretches of budget per stage (open-phase classes merged as "open phase").
fn stage_bands(d: &RunData) -> Vec<(String, f64, f64)> {
    let mut out: Vec<(String, f64, f64)> = Vec::new();
    let mut prev_t = 0.0;
    for (stage, t) in &d.stage_times {
        let name = if stage.starts_with("open/") { "open phase".to_string() } else { stage.clone() };
        match out.last_mut() {
            Some((n, _, end)) if *n == name => *end = *t,
            _ => out.push((name, prev_t, *t)),
        }
        prev_t = *t;
    }
    out
}

/// A linear f64 axis whose ticks are exactly `ticks` (category centres, powers of two):
/// plotters' own `with_key_points` leaves f64 axes without a label formatter.
#[derive(Clone)]
struct Ticked {
    range: Range<f64>,
    ticks: Vec<f64>,
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
fn categories(n: usize) -> Ticked {
    Ticked { range: 0.0..n as f64, ticks: (0..n).map(|g| group_y(n, g) + 0.5).collect() }
}

/// Horizontal bars, grouped by category: the y coordinate of group `g` of `n` (first on top).
fn group_y(n: usize, g: usize) -> f64 {
    (n - 1 - g) as f64
}

/// Figure 2: per shape, the best kernel against every SDPA backend (TFLOPS for large shapes,
/// microseconds for small ones), with the GPU's peak as a reference line.
pub fn throughput(d: &RunData) -> Result<Option<Figure>, FigureError> {
    if d.throughput.iter().all(|t| t.best_us.is_none() && t.sdpa.is_empty()) {
        return Ok(None);
    }
    let title = if d.reference == Reference::SdpaDefault {
        "Throughput: best kernel vs PyTorch SDPA backends".to_string()
    } else {
        "Throughput: best kernel vs the run's baseline kernel (SDPA not measured)".to_string()
    };
    let mut svg = String::new();
    draw_throughput(d, &title, &mut svg).map_err(err("throughput"))?;
    Ok(Some(Figure { file: "throughput.svg", title, svg }))
}

/// The bar series of figure 2: label and, per shape, the time in microseconds.
fn throughput_series(d: &RunData) -> Vec<(String, Vec<Option<f64>>)> {
    let best: Vec<Option<f64>> = d.throughput.iter().map(|t| t.best_us).collect();
    let label = if best.iter().all(|b| b.is_none()) { "best kernel: none correct" } else { "best kernel (this run)" };
    let mut series = vec![(label.to_string(), best)];
    if d.reference == Reference::SdpaDefault {
        for b in crate::ops::run_report::data::SDPA_BACKENDS {
            let v: Vec<Option<f64>> =
                d.throughput.iter().map(|t| t.sdpa.iter().find(|(n, _, _)| n == b).and_then(|(_, us, _)| *us)).collect();
            if v.iter().any(|x| x.is_some()) {
                let label = if b == "default" {
                    let picked: Vec<&str> = d.throughput.iter().filter_map(|t| t.picked.as_deref()).collect();
                    match picked.first() {
                        Some(p) if picked.iter().all(|x| x == p) => format!("SDPA default (= {p})"),
                        _ => "SDPA default".into(),
                    }
                } else {
                    format!("SDPA {}", if b == "cudnn" { "cuDNN" } else { b })
                };
                series.push((label, v));
            }
        }
    } else {
        series.push(("baseline kernel (this run)".into(), d.throughput.iter().map(|t| t.baseline_us).collect()));
    }
    series
}

fn draw_throughput(d: &RunData, title: &str, svg: &mut String) -> Result<(), Box<dyn std::fmt::Display>> {
    let series = throughput_series(d);
    let large: Vec<usize> = (0..d.throughput.len()).filter(|&i| d.throughput[i].large).collect();
    let small: Vec<usize> = (0..d.throughput.len()).filter(|&i| !d.throughput[i].large).collect();
    let per_group = 12 * series.len() as u32 + 14;
    let panel_h = |n: usize| if n == 0 { 0 } else { 110 + per_group * n as u32 };
    let h = (panel_h(large.len()) + panel_h(small.len()) + 40).max(300);
    let root = SVGBackend::with_string(svg, (W, h)).into_drawing_area();
    root.fill(&WHITE).map_err(boxed)?;
    let (main, side) = root.split_horizontally(W - LEGEND_W);
    let main = main.titled(title, (FONT, 20)).map_err(boxed)?;
    let (top, bottom) = main.split_vertically(panel_h(large.len()));
    if !large.is_empty() {
        bars_panel(d, &root, &top, &series, &large, true)?;
    }
    if !small.is_empty() {
        bars_panel(d, &root, &bottom, &series, &small, false)?;
    }
    let entries: Vec<(RGBColor, String, bool)> = series.iter().enumerate().map(|(i, (l, _))| (color(i), l.clone(), false)).collect();
    legend(&side, "series", &entries, 50)?;
    root.present().map_err(boxed)?;
    Ok(())
}

fn bars_panel(
    d: &RunData,
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    series: &[(String, Vec<Option<f64>>)],
    shapes: &[usize],
    tflops: bool,
) -> Result<(), Box<dyn std::fmt::Display>> {
    let value = |shape: usize, us: f64| if tflops { d.throughput[shape].tflops(us) } else { us };
    let max = shapes
        .iter()
        .flat_map(|&s| series.iter().filter_map(move |(_, v)| v[s].map(|us| value(s, us))))
        .fold(0.0f64, f64::max);
    let peak = if tflops { d.peak.as_ref().map(|p| p.tflops) } else { None };
    let x_max = (max.max(peak.unwrap_or(0.0)) * 1.18).max(1e-3);
    let n = shapes.len();
    let keys: Vec<String> = shapes.iter().map(|&s| d.throughput[s].shape.clone()).collect();
    let caption = if tflops {
        "large shapes (>= 1 GFLOP per call): TFLOPS, higher is better".to_string()
    } else {
        "small shapes (< 1 GFLOP per call, launch-bound): time per call in µs, lower is better".to_string()
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 14))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(170)
        .build_cartesian_2d(0f64..x_max, categories(n))
        .map_err(boxed)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(GRID)
        .disable_y_mesh()
        .x_desc(if tflops { "TFLOPS" } else { "µs per call" })
        .x_label_formatter(&|v| if tflops || x_max >= 20.0 { format!("{v:.0}") } else { format!("{v:.1}") })
        .y_label_formatter(&|y| {
            let g = n as f64 - 1.0 - (y - 0.5).round();
            keys.get(g.max(0.0) as usize).cloned().unwrap_or_default()
        })
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()
        .map_err(boxed)?;
    let bar_h = 0.8 / series.len() as f64;
    for (g, &s) in shapes.iter().enumerate() {
        let y0 = group_y(n, g) + 0.9;
        for (j, (_, v)) in series.iter().enumerate() {
            let (top, bottom) = (y0 - j as f64 * bar_h, y0 - (j + 1) as f64 * bar_h + bar_h * 0.12);
            let Some(us) = v[s] else { continue };
            let x = value(s, us);
            chart.draw_series(std::iter::once(Rectangle::new([(0.0, bottom), (x, top)], color(j).filled()))).map_err(boxed)?;
            let (px, py) = chart.backend_coord(&(x, (top + bottom) / 2.0));
            let label = if tflops { format!("{x:.1}") } else { format!("{x:.2} µs") };
            root.draw(&Text::new(label, (px + 4, py), text_style(11, BLACK, HPos::Left, VPos::Center))).map_err(boxed)?;
        }
    }
    if let (Some(p), Some(info)) = (peak, d.peak.as_ref()) {
        chart.draw_series(DashedLineSeries::new(vec![(p, 0.0), (p, n as f64)], 6, 4, RED.stroke_width(2))).map_err(boxed)?;
        let (px, py) = chart.backend_coord(&(p, n as f64));
        let label = format!("peak {:.0} TFLOPS ({})", info.tflops, info.source.trim_start_matches("NVIDIA datasheet, "));
        root.draw(&Text::new(label, (px - 4, py + 2), text_style(11, RED, HPos::Right, VPos::Top))).map_err(boxed)?;
    }
    Ok(())
}

/// Figure 3: per shape, the gain each stage contributed (stacked on a log2 axis, so the
/// segments add up to the total speedup over the shape's first correct kernel).
pub fn ablation(d: &RunData) -> Result<Option<Figure>, FigureError> {
    if d.gains.is_empty() {
        return Ok(None);
    }
    let title = "Gain per stage: what each stage bought, per shape (over the first correct kernel)".to_string();
    let mut svg = String::new();
    draw_ablation(d, &title, &mut svg).map_err(err("ablation"))?;
    Ok(Some(Figure { file: "stages.svg", title, svg }))
}

fn draw_ablation(d: &RunData, title: &str, svg: &mut String) -> Result<(), Box<dyn std::fmt::Display>> {
    let n = d.gains.len();
    let h = (130 + 34 * n as u32).max(260);
    let root = SVGBackend::with_string(svg, (W, h)).into_drawing_area();
    root.fill(&WHITE).map_err(boxed)?;
    let (main, side) = root.split_horizontally(W - LEGEND_W);
    let (mut lo, mut hi) = (0.0f64, 0.0f64);
    for g in &d.gains {
        let pos: f64 = g.by_stage.iter().map(|(_, x)| x.log2().max(0.0)).sum();
        let neg: f64 = g.by_stage.iter().map(|(_, x)| x.log2().min(0.0)).sum();
        hi = hi.max(pos);
        lo = lo.min(neg);
    }
    let span = (hi - lo).max(0.5);
    let step = if span <= 1.5 { 0.25 } else if span <= 8.0 { 1.0 } else { 2.0 };
    let x_lo = (lo / step).floor() * step;
    let x_hi = hi + span * 0.22;
    let ticks: Vec<f64> = (0..).map(|k| x_lo + k as f64 * step).take_while(|&v| v <= x_hi).collect();
    let keys: Vec<String> = d.gains.iter().map(|g| g.shape.clone()).collect();
    let mut chart = ChartBuilder::on(&main)
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(170)
        .build_cartesian_2d(Ticked { range: x_lo..x_hi, ticks }, categories(n))
        .map_err(boxed)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(GRID)
        .disable_y_mesh()
        .x_desc("speedup (log scale): segments multiply to the total")
        .x_label_formatter(&|v| fmt_pow2(*v))
        .y_label_formatter(&|y| {
            let g = n as f64 - 1.0 - (y - 0.5).round();
            keys.get(g.max(0.0) as usize).cloned().unwrap_or_default()
        })
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()
        .map_err(boxed)?;
    let stage_ix = |s: &str| d.stages.iter().position(|x| x == s).unwrap_or(0);
    for (g, sg) in d.gains.iter().enumerate() {
        let (y0, y1) = (group_y(n, g) + 0.2, group_y(n, g) + 0.8);
        let (mut right, mut left) = (0.0f64, 0.0f64);
        for (stage, gain) in &sg.by_stage {
            let l = gain.log2();
            let (a, b) = if l >= 0.0 {
                right += l;
                (right - l, right)
            } else {
                left += l;
                (left, left - l)
            };
            let c = color(stage_ix(stage));
            chart.draw_series(std::iter::once(Rectangle::new([(a, y0), (b, y1)], c.filled()))).map_err(boxed)?;
            chart.draw_series(std::iter::once(Rectangle::new([(a, y0), (b, y1)], WHITE.stroke_width(1)))).map_err(boxed)?;
            let (pa, py) = chart.backend_coord(&(a, (y0 + y1) / 2.0));
            let (pb, _) = chart.backend_coord(&(b, (y0 + y1) / 2.0));
            let label = fmt_x(*gain);
            if pb - pa >= text_w(&label, 11) + 6 {
                root.draw(&Text::new(label, ((pa + pb) / 2, py), text_style(11, ink_on(c), HPos::Center, VPos::Center))).map_err(boxed)?;
            }
        }
        let (px, py) = chart.backend_coord(&(right, (y0 + y1) / 2.0));
        let label = if sg.by_stage.is_empty() {
            format!("1.00x (only its first kernel, from {})", sg.start_stage.as_deref().unwrap_or("?"))
        } else {
            format!("{} total", fmt_x(sg.total))
        };
        root.draw(&Text::new(label, (px + 6, py), text_style(12, BLACK, HPos::Left, VPos::Center))).map_err(boxed)?;
    }
    let used: Vec<&String> = d.stages.iter().filter(|s| d.gains.iter().any(|g| g.by_stage.iter().any(|(x, _)| x == *s))).collect();
    let entries: Vec<(RGBColor, String, bool)> = used.iter().map(|s| (color(stage_ix(s)), s.to_string(), false)).collect();
    legend(&side, "stage", &entries, 50)?;
    root.present().map_err(boxed)?;
    Ok(())
}

/// Figure 4: how each stage's candidates ended, stacked per stage in run order.
pub fn verdicts(d: &RunData) -> Result<Option<Figure>, FigureError> {
    if d.verdicts.is_empty() {
        return Ok(None);
    }
    let title = "Verdicts per stage: how each stage's candidates ended".to_string();
    let mut svg = String::new();
    draw_verdicts(d, &title, &mut svg).map_err(err("verdicts"))?;
    Ok(Some(Figure { file: "verdicts.svg", title, svg }))
}

fn draw_verdicts(d: &RunData, title: &str, svg: &mut String) -> Result<(), Box<dyn std::fmt::Display>> {
    let n = d.verdicts.len();
    let h = (130 + 30 * n as u32).max(260);
    let root = SVGBackend::with_string(svg, (W, h)).into_drawing_area();
    root.fill(&WHITE).map_err(boxed)?;
    let (main, side) = root.split_horizontally(W - LEGEND_W);
    let max = d.verdicts.iter().map(|s| s.total).max().unwrap_or(1) as f64;
    let keys: Vec<String> = d.verdicts.iter().map(|s| s.stage.clone()).collect();
    let mut chart = ChartBuilder::on(&main)
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(170)
        .build_cartesian_2d(0f64..max * 1.12, categories(n))
        .map_err(boxed)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(GRID)
        .disable_y_mesh()
        .x_desc("candidates")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|y| {
            let g = n as f64 - 1.0 - (y - 0.5).round();
            keys.get(g.max(0.0) as usize).cloned().unwrap_or_default()
        })
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()
        .map_err(boxed)?;
    for (g, sv) in d.verdicts.iter().enumerate() {
        let (y0, y1) = (group_y(n, g) + 0.2, group_y(n, g) + 0.8);
        let mut x = 0.0;
        for (v, count) in &sv.counts {
            let (a, b) = (x, x + *count as f64);
            x = b;
            chart.draw_series(std::iter::once(Rectangle::new([(a, y0), (b, y1)], verdict_color(v).filled()))).map_err(boxed)?;
            chart.draw_series(std::iter::once(Rectangle::new([(a, y0), (b, y1)], WHITE.stroke_width(1)))).map_err(boxed)?;
            let (pa, py) = chart.backend_coord(&(a, (y0 + y1) / 2.0));
            let (pb, _) = chart.backend_coord(&(b, (y0 + y1) / 2.0));
            let label = count.to_string();
            if pb - pa >= text_w(&label, 11) + 4 {
                root.draw(&Text::new(label, ((pa + pb) / 2, py), text_style(11, ink_on(verdict_color(v)), HPos::Center, VPos::Center)))
                    .map_err(boxed)?;
            }
        }
        let (px, py) = chart.backend_coord(&(x, (y0 + y1) / 2.0));
        let total = if sv.total == 1 { "1 candidate".to_string() } else { format!("{} candidates", sv.total) };
        root.draw(&Text::new(total, (px + 6, py), text_style(12, BLACK, HPos::Left, VPos::Center)))
            .map_err(boxed)?;
    }
    let totals = crate::ops::run_report::data::verdict_totals(&d.verdicts);
    let entries: Vec<(RGBColor, String, bool)> = VERDICT_ORDER
        .iter()
        .filter_map(|v| totals.iter().find(|(x, _)| x == v).map(|(_, n)| (verdict_color(v), format!("{v} ({n})"), false)))
        .collect();
    legend(&side, "verdict (all stages)", &entries, 50)?;
    root.present().map_err(boxed)?;
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
