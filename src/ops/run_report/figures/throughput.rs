//! Figure 2, `throughput.svg`: the best kernel per shape against every SDPA backend and
//! FlashAttention-4, in TFLOPS for large shapes (with the GPU's datasheet peak), in
//! effective K/V bandwidth for decode shapes (with the datasheet memory bandwidth; decode
//! is bound by reading the KV cache) and in microseconds for small ones.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::axes::{categories, group_y};
use super::style::{boxed, color, err, legend, text_style, FONT, GRID, LEGEND_W, W};
use super::{Figure, FigureError};
use crate::ops::run_report::data::{Reference, RunData};

/// Figure 2: per shape, the best kernel against every baseline (TFLOPS for large shapes, TB/s
/// of K/V for decode shapes, microseconds for small ones), with the GPU's peaks as reference lines.
pub fn throughput(d: &RunData) -> Result<Option<Figure>, FigureError> {
    if d.throughput.iter().all(|t| t.best_us.is_none() && t.sdpa.is_empty()) {
        return Ok(None);
    }
    let title = if d.reference == Reference::SdpaDefault {
        if d.throughput.iter().any(|t| t.sdpa.iter().any(|(n, _, _)| n == crate::storage::sdpa::FA4)) {
            "Throughput: best kernel vs PyTorch SDPA backends and FlashAttention-4".to_string()
        } else {
            "Throughput: best kernel vs PyTorch SDPA backends".to_string()
        }
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
        for b in crate::ops::run_report::data::BASELINES {
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
                    crate::ops::run_report::data::backend_label(b)
                };
                series.push((label, v));
            }
        }
    } else {
        series.push(("baseline kernel (this run)".into(), d.throughput.iter().map(|t| t.baseline_us).collect()));
    }
    series
}

/// The figure's panels: what each shape is judged by.
#[derive(Clone, Copy, PartialEq)]
enum Panel {
    /// Large shapes other than decode: TFLOPS, with the peak tensor throughput.
    Tflops,
    /// Decode shapes: effective K/V bandwidth, with the peak memory bandwidth.
    Bandwidth,
    /// Small shapes (launch-bound): microseconds.
    Time,
}

fn panel_of(t: &crate::ops::run_report::data::Throughput) -> Panel {
    if t.decode {
        Panel::Bandwidth
    } else if t.large {
        Panel::Tflops
    } else {
        Panel::Time
    }
}

fn draw_throughput(d: &RunData, title: &str, svg: &mut String) -> Result<(), Box<dyn std::fmt::Display>> {
    let series = throughput_series(d);
    let of = |p: Panel| -> Vec<usize> { (0..d.throughput.len()).filter(|&i| panel_of(&d.throughput[i]) == p).collect() };
    let panels = [(Panel::Tflops, of(Panel::Tflops)), (Panel::Bandwidth, of(Panel::Bandwidth)), (Panel::Time, of(Panel::Time))];
    let per_group = 12 * series.len() as u32 + 14;
    let panel_h = |n: usize| if n == 0 { 0 } else { 110 + per_group * n as u32 };
    let h = (panels.iter().map(|(_, s)| panel_h(s.len())).sum::<u32>() + 40).max(300);
    let root = SVGBackend::with_string(svg, (W, h)).into_drawing_area();
    root.fill(&WHITE).map_err(boxed)?;
    let (main, side) = root.split_horizontally(W - LEGEND_W);
    let mut rest = main.titled(title, (FONT, 20)).map_err(boxed)?;
    for (panel, shapes) in &panels {
        if shapes.is_empty() {
            continue;
        }
        let (area, below) = rest.split_vertically(panel_h(shapes.len()));
        bars_panel(d, &root, &area, &series, shapes, *panel)?;
        rest = below;
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
    panel: Panel,
) -> Result<(), Box<dyn std::fmt::Display>> {
    let value = |shape: usize, us: f64| match panel {
        Panel::Tflops => d.throughput[shape].tflops(us),
        Panel::Bandwidth => d.throughput[shape].kv_tbps(us),
        Panel::Time => us,
    };
    let max = shapes
        .iter()
        .flat_map(|&s| series.iter().filter_map(move |(_, v)| v[s].map(|us| value(s, us))))
        .fold(0.0f64, f64::max);
    let peak = match panel {
        Panel::Tflops => d.peak.as_ref().map(|p| (p.tflops, format!("peak {:.0} TFLOPS", p.tflops))),
        Panel::Bandwidth => d.peak.as_ref().and_then(|p| p.hbm_tbps.map(|b| (b, format!("memory {b:.2} TB/s")))),
        Panel::Time => None,
    };
    let x_max = (max.max(peak.as_ref().map(|p| p.0).unwrap_or(0.0)) * 1.18).max(1e-3);
    let n = shapes.len();
    let keys: Vec<String> = shapes.iter().map(|&s| d.throughput[s].shape.clone()).collect();
    let (caption, x_desc) = match panel {
        Panel::Tflops => ("large shapes (>= 1 GFLOP per call): TFLOPS, higher is better", "TFLOPS"),
        Panel::Bandwidth => (
            "decode shapes (few query rows against a KV cache): bytes of K and V read per second, TB/s, higher is better",
            "TB/s of K and V",
        ),
        Panel::Time => ("small shapes (< 1 GFLOP per call, launch-bound): time per call in µs, lower is better", "µs per call"),
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 14))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(230)
        .build_cartesian_2d(0f64..x_max, categories(n))
        .map_err(boxed)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(GRID)
        .disable_y_mesh()
        .x_desc(x_desc)
        .x_label_formatter(&|v| if x_max >= 20.0 { format!("{v:.0}") } else { format!("{v:.1}") })
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
            let label = match panel {
                Panel::Tflops => format!("{x:.1}"),
                // The time beside the bandwidth: decode is judged in bytes/s, read in µs.
                Panel::Bandwidth => format!("{x:.2} TB/s ({us:.1} µs)"),
                Panel::Time => format!("{x:.2} µs"),
            };
            root.draw(&Text::new(label, (px + 4, py), text_style(11, BLACK, HPos::Left, VPos::Center))).map_err(boxed)?;
        }
    }
    if let (Some((p, label)), Some(info)) = (peak, d.peak.as_ref()) {
        chart.draw_series(DashedLineSeries::new(vec![(p, 0.0), (p, n as f64)], 6, 4, RED.stroke_width(2))).map_err(boxed)?;
        let (px, py) = chart.backend_coord(&(p, n as f64));
        let product = info.source.trim_start_matches("NVIDIA datasheet, ");
        // "dense" qualifies the tensor figure; the memory line names the product alone.
        let product = if panel == Panel::Bandwidth { product.trim_end_matches(", dense") } else { product };
        let label = format!("{label} ({product})");
        root.draw(&Text::new(label, (px - 4, py + 2), text_style(11, RED, HPos::Right, VPos::Top))).map_err(boxed)?;
    }
    Ok(())
}
