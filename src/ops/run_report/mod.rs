//! `optimizerd report`: a run as pictures. Reads the ledger alone (finished, stopped,
//! interrupted or still running runs alike) and writes `report.html` (self-contained),
//! `report.md` and each figure as an `.svg` into one folder.
//!
//! [`data`] extracts what to show, [`decimate`] thins long curves, [`figures`] draws the
//! SVGs, [`render`] writes the pages, [`peak`] knows the GPUs' datasheet peaks.

pub mod data;
pub mod decimate;
pub mod figures;
pub mod peak;
pub mod render;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::spec::states::ShownState;
use crate::storage::ledger::{Ledger, LedgerError};

/// Every figure file a report may write: ones a run does not produce are removed from
/// the folder, so a re-render never leaves a stale figure beside a newer page.
pub const FIGURE_FILES: [&str; 4] = ["speedup.svg", "throughput.svg", "stages.svg", "verdicts.svg"];

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Figure(#[from] figures::FigureError),
    #[error("cannot render the report pages: {0}")]
    Render(#[from] minijinja::Error),
    #[error("cannot write {path}: {source}; choose another folder with --out")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// What was written, for the command's output (`--json` prints it as is).
#[derive(Debug, Serialize)]
pub struct Written {
    pub run: String,
    pub state: ShownState,
    pub iterations: usize,
    pub html: PathBuf,
    pub markdown: PathBuf,
    /// The figure files, in figure order.
    pub figures: Vec<PathBuf>,
    pub notes: Vec<String>,
}

/// Write the report of `run_id` into `out`. `state` overrides the ledger's state where the
/// caller knows better (a `running` run whose daemon is gone).
pub async fn write(ledger: &Ledger, run_id: &str, out: &Path, state: Option<ShownState>) -> Result<Written, ReportError> {
    let d = data::load(ledger, run_id, state).await?;
    let mut figs = Vec::new();
    if d.iterations > 0 {
        for f in [figures::speedup(&d)?, figures::throughput(&d)?, figures::ablation(&d)?, figures::verdicts(&d)?].into_iter().flatten() {
            figs.push(f);
        }
    }
    let (html, md) = render::pages(&d, &figs)?;
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| ReportError::Write { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    let mut written = Vec::new();
    for f in &figs {
        let p = out.join(f.file);
        std::fs::write(&p, &f.svg).map_err(io(&p))?;
        written.push(p);
    }
    for name in FIGURE_FILES {
        let p = out.join(name);
        if !figs.iter().any(|f| f.file == name) && p.exists() {
            std::fs::remove_file(&p).map_err(io(&p))?;
        }
    }
    let (html_path, md_path) = (out.join("report.html"), out.join("report.md"));
    std::fs::write(&html_path, html).map_err(io(&html_path))?;
    std::fs::write(&md_path, md).map_err(io(&md_path))?;
    Ok(Written { run: d.run.id, state: d.state, iterations: d.iterations, html: html_path, markdown: md_path, figures: written, notes: d.notes })
}
