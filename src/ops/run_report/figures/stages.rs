//! Figure 3, `stages.svg`: the gain each stage bought per shape, stacked on a log2 axis so
//! that the segments multiply to the shape's total speedup.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::axes::{categories, group_y, Ticked};
use super::style::{boxed, color, err, fmt_pow2, fmt_x, ink_on, legend, text_style, text_w, FONT, GRID, LEGEND_W, W};
use super::{Figure, FigureError};
use crate::ops::run_report::data::RunData;

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
