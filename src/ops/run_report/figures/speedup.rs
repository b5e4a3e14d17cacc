//! Figure 1, `speedup.svg`: each shape's speedup over the reference as a step line over
//! the budget used, with the stages as bands along it.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::style::{boxed, boxed_label, color, err, fmt_tick, fmt_x, legend, text_style, text_w, Placed, BAND, FONT, GRID, LEGEND_W, W};
use super::{Figure, FigureError};
use crate::ops::run_report::data::RunData;

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
