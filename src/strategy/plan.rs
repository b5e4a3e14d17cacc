//! The strategy plan (`strategies/*.toml`): ordered stages, each naming a template,
//! the part of its knob space to search, and how to search it; and `[open_phase]`, what
//! happens after the last stage while budget is left (see [`crate::strategy::open`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::spec::assets;
use crate::strategy::open::OpenPhaseSpec;
use crate::strategy::search::SearchKind;
use crate::spec::template::{eval_bool_expr, Params, Template, TemplateError, SHAPE_VAR_NAMES};

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("plan {path}:{line}: {message}")]
    Parse { path: PathBuf, line: usize, message: String },
    #[error("plan {path}, stage `{stage}`: {message}")]
    Stage { path: PathBuf, stage: String, message: String },
    #[error("plan {path}, stage `{stage}`: cannot load template `{template}` from {templates_dir}; fix the stage's `template`, or `run.templates_dir` in the config")]
    StageTemplate {
        path: PathBuf,
        stage: String,
        template: String,
        templates_dir: PathBuf,
        #[source]
        source: Box<TemplateError>,
    },
    #[error("cannot read the plan; check `--plan`, or `run.plan` in the config")]
    Asset(#[from] assets::AssetError),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanFile {
    stage: Vec<StageSpec>,
    /// What happens after the last stage while budget is left.
    #[serde(default)]
    open_phase: OpenPhaseSpec,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// File under the templates folder.
    pub template: String,
    pub search: SearchKind,
    /// Knob -> values to search (a subset of the template's); absent knobs use all allowed values.
    #[serde(default)]
    pub space: BTreeMap<String, Vec<i64>>,
    /// Where a coordinate search starts; absent knobs start at their first value.
    #[serde(default)]
    pub start: BTreeMap<String, i64>,
    /// Start instead from the best point found so far for this template (the params of
    /// the incumbent that serves the most shapes), e.g. for a tuning pass after a
    /// coordinate pass. Falls back to `start` when the template has no incumbent.
    #[serde(default)]
    pub start_from_best: bool,
    /// Run the stage only when the diagnosis of the incumbents shows one of these
    /// symptoms on some shape (`under_filled`, `spills`, `low_occupancy`,
    /// `compute_gap`); empty: always. The figures behind the decision are recorded.
    #[serde(default)]
    pub when: Vec<crate::strategy::diagnose::Symptom>,
    /// Expression: the fewest CTAs the first launch may have on each shape.
    #[serde(default = "default_min_ctas")]
    pub min_ctas: String,
    /// Boolean expression over a shape (B, HQ, HKV, G, SQ, SK, D, CAUSAL, BSHD, SMS, ...):
    /// the stage runs on the workload shapes where it holds, e.g. `"G * SQ > 16"` for
    /// decode shapes whose packed rows fill two m16 tiles (MQA). Empty: every shape the
    /// template admits. A stage with no such shape is skipped, with the reason recorded.
    #[serde(default)]
    pub shapes: String,
    #[serde(default = "default_max_candidates")]
    pub max_candidates: u32,
}

fn default_min_ctas() -> String {
    "1".into()
}

fn default_max_candidates() -> u32 {
    32
}

/// Stage name of the warm start's iterations (memory across runs).
pub const RESERVED_WARM_START: &str = "warm-start";
/// Stage name of the iterations that try kernels remembered for similar shapes (transfer).
pub const RESERVED_TRANSFER: &str = "transfer";
/// Stage names of the open-ended phase's iterations: `open/<class>`.
pub const RESERVED_OPEN_PREFIX: &str = "open/";
/// Stage name of the closing comparison's re-rank: a kernel that was faster than the best
/// under sustained timing, recorded as the win it is.
pub const RESERVED_RERANK: &str = "sustained-rerank";

/// A stage with its template loaded and its search space resolved.
#[derive(Debug, Clone)]
pub struct Stage {
    pub spec: StageSpec,
    pub template: Template,
    /// Knob -> values searched, in the template's declaration order.
    pub space: Vec<(String, Vec<i64>)>,
    pub start: Params,
}

impl Stage {
    /// An exhaustive stage whose space holds more points than `max_candidates`: (points,
    /// max_candidates, the knobs its `space` leaves unpinned with several values). Its search
    /// takes the points in order, the last knob varying fastest, and stops there: the rest are
    /// never tried. A knob added to a template enters every such stage with all its values (the
    /// wgmma-tma Hopper stage went from 16 points to 32 that way, and lost BLOCK_N 192).
    pub fn truncated(&self) -> Option<(usize, u32, Vec<&str>)> {
        if self.spec.search != SearchKind::Exhaustive {
            return None;
        }
        let points: usize = self.space.iter().map(|(_, values)| values.len()).product();
        let unpinned = self
            .space
            .iter()
            .filter(|(k, values)| values.len() > 1 && !self.spec.space.contains_key(k))
            .map(|(k, _)| k.as_str())
            .collect();
        (points > self.spec.max_candidates as usize).then_some((points, self.spec.max_candidates, unpinned))
    }
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub path: PathBuf,
    pub stages: Vec<Stage>,
    pub open_phase: OpenPhaseSpec,
}

impl Plan {
    /// Load the plan file `plan` and every template it names from `templates_dir`.
    pub fn load(plan: &Path, templates_dir: &Path) -> Result<Self, PlanError> {
        let dir = plan.parent().unwrap_or(Path::new("."));
        let file = plan.file_name().and_then(|f| f.to_str()).unwrap_or_default();
        let text = assets::read(dir, file)?;
        Self::parse(plan, &text, templates_dir)
    }

    pub fn parse(path: &Path, text: &str, templates_dir: &Path) -> Result<Self, PlanError> {
        let parsed: PlanFile = toml::from_str(text).map_err(|e| PlanError::Parse {
            path: path.into(),
            line: e.span().map_or(0, |s| text[..s.start].matches('\n').count() + 1),
            message: e.message().to_string(),
        })?;
        let mut stages = Vec::new();
        for spec in parsed.stage {
            let template = Template::load(templates_dir, &spec.template).map_err(|source| PlanError::StageTemplate {
                path: path.into(),
                stage: spec.name.clone(),
                template: spec.template.clone(),
                templates_dir: templates_dir.into(),
                source: Box::new(source),
            })?;
            let err = |message: String| PlanError::Stage { path: path.into(), stage: spec.name.clone(), message };
            // Names the run gives its own iterations: a plan stage so named would be confused
            // with them when a run is resumed.
            if spec.name == RESERVED_WARM_START || spec.name == RESERVED_TRANSFER || spec.name == RESERVED_RERANK || spec.name.starts_with(RESERVED_OPEN_PREFIX) {
                return Err(err(format!(
                    "the stage name `{}` is reserved (`{RESERVED_WARM_START}`, `{RESERVED_TRANSFER}`, `{RESERVED_RERANK}` and `{RESERVED_OPEN_PREFIX}...` name the run's own iterations); rename the stage",
                    spec.name
                )));
            }
            for (knob, values) in &spec.space {
                let allowed = template
                    .knobs
                    .iter()
                    .find(|(k, _)| k == knob)
                    .map(|(_, v)| v)
                    .ok_or_else(|| err(format!("space names `{knob}`, which is not a knob of {} (knobs: {})", spec.template, knob_names(&template))))?;
                if let Some(bad) = values.iter().find(|v| !allowed.contains(v)) {
                    return Err(err(format!("space.{knob} = {bad} is not allowed by {} (allowed: {allowed:?})", spec.template)));
                }
                if values.is_empty() {
                    return Err(err(format!("space.{knob} is empty")));
                }
            }
            let space: Vec<(String, Vec<i64>)> = template
                .knobs
                .iter()
                .map(|(k, allowed)| (k.clone(), spec.space.get(k).cloned().unwrap_or_else(|| allowed.clone())))
                .collect();
            let mut start = Params::new();
            for (k, values) in &space {
                let v = match spec.start.get(k) {
                    Some(v) if values.contains(v) => *v,
                    Some(v) => return Err(err(format!("start.{k} = {v} is outside the searched values {values:?}"))),
                    None => values[0],
                };
                start.insert(k.clone(), v);
            }
            if !spec.shapes.is_empty() {
                // Evaluated once on a Llama-3-8B decode shape on an H100, so that a typo fails
                // at load, naming the stage, not when the run reaches it.
                let probe: BTreeMap<String, i64> = SHAPE_VAR_NAMES
                    .iter()
                    .map(|n| {
                        let v = match *n {
                            "HQ" => 32,
                            "HKV" => 8,
                            "G" => 4,
                            "SK" => 4096,
                            "D" => 128,
                            "ELEM_BYTES" => 2,
                            "SMS" => 132,
                            "SMEM_OPTIN" => 232_448,
                            "CC" => 90,
                            _ => 1, // B, SQ, CAUSAL; BSHD 1 is as valid as 0
                        };
                        (n.to_string(), v)
                    })
                    .collect();
                eval_bool_expr(&spec.shapes, &probe).map_err(|e| {
                    err(format!("shapes = \"{}\": {e}; write a boolean expression over the shape names {}", spec.shapes, SHAPE_VAR_NAMES.join(", ")))
                })?;
            }
            if let Some(k) = spec.start.keys().find(|k| !space.iter().any(|(n, _)| n == *k)) {
                return Err(err(format!("start names `{k}`, which is not a knob of {} (knobs: {})", spec.template, knob_names(&template))));
            }
            stages.push(Stage { spec, template, space, start });
        }
        if stages.is_empty() {
            return Err(PlanError::Parse { path: path.into(), line: 0, message: "no [[stage]]".into() });
        }
        if let Some(t) = parsed.open_phase.templates.iter().find(|t| !stages.iter().any(|s: &Stage| &s.spec.template == *t)) {
            return Err(PlanError::Parse {
                path: path.into(),
                line: 0,
                message: format!("[open_phase] templates names {t}, which no stage of the plan uses (add a stage for it, or remove it)"),
            });
        }
        parsed.open_phase.validate().map_err(|message| PlanError::Parse { path: path.into(), line: 0, message: format!("{message} (in [open_phase])") })?;
        Ok(Plan { path: path.into(), stages, open_phase: parsed.open_phase })
    }
}

fn knob_names(t: &Template) -> String {
    t.knobs.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(", ")
}
