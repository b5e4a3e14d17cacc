//! The report's four figures as SVG, drawn with plotters' SVG backend from [`RunData`]:
//! speedup vs budget, throughput against SDPA's backends, gain per stage, verdicts per
//! stage, one module each; [`style`] holds what they share (colours, text, labels,
//! number formats, legend) and [`axes`] the bar figures' axes. Text is emitted as SVG
//! `<text>` (no fonts are loaded), so every number a figure shows can be read back from
//! the file.
//!
//! [`RunData`]: crate::ops::run_report::data::RunData

mod axes;
mod speedup;
mod stages;
mod style;
mod throughput;
mod verdicts;

pub use speedup::speedup;
pub use stages::ablation;
pub use style::fmt_x;
pub use throughput::throughput;
pub use verdicts::verdicts;

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
