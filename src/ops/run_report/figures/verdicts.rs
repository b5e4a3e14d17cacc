//! Figure 4, `verdicts.svg`: how each stage's candidates ended, one stacked bar per stage
//! in run order.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use super::axes::{categories, group_y};
use super::style::{boxed, err, ink_on, legend, text_style, text_w, verdict_color, FONT, GRID, LEGEND_W, W};
use super::{Figure, FigureError};
use crate::ops::run_report::data::RunData;
use crate::spec::states::Verdict;

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
            chart.draw_series(std::iter::once(Rectangle::new([(a, y0), (b, y1)], verdict_color(*v).filled()))).map_err(boxed)?;
            chart.draw_series(std::iter::once(Rectangle::new([(a, y0), (b, y1)], WHITE.stroke_width(1)))).map_err(boxed)?;
            let (pa, py) = chart.backend_coord(&(a, (y0 + y1) / 2.0));
            let (pb, _) = chart.backend_coord(&(b, (y0 + y1) / 2.0));
            let label = count.to_string();
            if pb - pa >= text_w(&label, 11) + 4 {
                root.draw(&Text::new(label, ((pa + pb) / 2, py), text_style(11, ink_on(verdict_color(*v)), HPos::Center, VPos::Center)))
                    .map_err(boxed)?;
            }
        }
        let (px, py) = chart.backend_coord(&(x, (y0 + y1) / 2.0));
        let total = if sv.total == 1 { "1 candidate".to_string() } else { format!("{} candidates", sv.total) };
        root.draw(&Text::new(total, (px + 6, py), text_style(12, BLACK, HPos::Left, VPos::Center)))
            .map_err(boxed)?;
    }
    let totals = crate::ops::run_report::data::verdict_totals(&d.verdicts);
    let entries: Vec<(RGBColor, String, bool)> = Verdict::ALL
        .iter()
        .filter_map(|v| totals.iter().find(|(x, _)| x == v).map(|(_, n)| (verdict_color(*v), format!("{v} ({n})"), false)))
        .collect();
    legend(&side, "verdict (all stages)", &entries, 50)?;
    root.present().map_err(boxed)?;
    Ok(())
}
