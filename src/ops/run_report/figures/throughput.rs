//! Figure 2, `throughput.svg`: the best kernel per shape against every SDPA backend, in
//! TFLOPS for large shapes (with the GPU's datasheet peak) and microseconds for small ones.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::axes::{categories, group_y};
use super::style::{boxed, color, err, legend, text_style, FONT, GRID, LEGEND_W, W};
use super::{Figure, FigureError};
use crate::ops::run_report::data::{Reference, RunData};

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
