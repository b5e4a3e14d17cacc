//! Kernel templates: loading a `.cu` file, parsing its spec comment, and evaluating
//! the formulas it declares (derived values, launch grid, block, shared memory).
//!
//! A template is plain CUDA whose knobs are macros. Its machine-read spec sits in a
//! `/* optimizerd:spec ... */` comment (TOML), so the formulas a human reads in the
//! header are the ones the daemon evaluates. Expressions are minijinja expressions
//! over the knobs, the shape (B, H, S, D, CAUSAL, ELEM_BYTES) and the device
//! (SMS, SMEM_OPTIN, CC), with `cdiv`, `min` and `max`.
//!
//! Knobs that change nothing for some shapes are declared in an optional `[inert]` table,
//! `KNOB = "<boolean expression>"`:
//!
//! ```toml
//! [derived]
//! pack = "G if PACK_GQA and G >= 2 and 8 % G == 0 else 1"
//!
//! [inert]
//! PACK_GQA = "pack == 1"   # packs nothing on this shape, whatever PACK_GQA is
//! ```
//!
//! The expression sees what the `[derived]` formulas see (knobs, shape and device
//! variables: [`SHAPE_VAR_NAMES`]) and the derived values themselves. Where it is true for
//! a shape, every value of the knob runs the same kernel there. [`Template::canonical`]
//! sets each knob inert on all of a set of shapes (a stage's, an open-phase class's) to
//! its first declared value, and the searches compare and propose points in that form
//! (`strategy::search::Canonical`), so a stage or class measures each distinct kernel once
//! and the ledger never shows a value that had no effect. The expression may read the knob
//! itself, or a derived value that depends on it: it is evaluated once per allowed value
//! of the knob (the other knobs as proposed), and the knob is inert on a shape only if it
//! is true for all of them. So `"pack == 1"` above means "pack is 1 whatever PACK_GQA is",
//! not "pack is 1 at this point" (true at PACK_GQA = 0 on every shape); spelling the
//! condition out without the knob (`"not (G >= 2 and 8 % G == 0)"`) is the
//! same. The parse checks that each key is a declared knob and that each expression
//! compiles and names only those variables; one that fails to evaluate for a shape is a
//! [`TemplateError::Formula`] from `canonical`. Declarations must be true statements about
//! the kernel: the walk that resets knobs assumes each says exactly when its knob is
//! irrelevant.
//!
//! A point that cannot run on some shapes (a head dim its registers cannot hold, say) is
//! declared in `[[refuse]]` entries, `when` a boolean expression over the same names and
//! `why` the reason: [`Template::plan`] fails with [`TemplateError::Refused`] where `when`
//! holds, so the gate refuses the candidate for that shape with the reason, and the export
//! writes the entries into the manifest for a loader to do the same.
//!
//! ```toml
//! [[refuse]]
//! when = "D == 256 and CONSUMERS == 3"
//! why = "three consumer warpgroups' 160 registers per thread cannot hold D 256's O"
//! ```
//!
//! Each launch role's kernel is exported once per head dim the template lists (`head_dims`
//! under `[template]`, e.g. `[64, 128]`, the default) as `optd_<role>_d<D>`, each of
//! them inside `#if OPTD_BUILD_D<D>` (common/optd.cuh sets every one to 1 unless the build
//! says otherwise): the worker builds only the run's head dims (`protocol::head_dim_defines`),
//! so a kernel outside its guard still builds, just always.
//!
//! A template made for one regime declares `max_sq = N` under `[template]` (decode.cu:
//! 16): the gate refuses shapes with more query rows, with the reason, the plan's stage
//! of such a template runs on the shapes it admits only (skipped, with the reason, when
//! there are none), and the open phase offers it only to the classes it admits. A template
//! whose kernels implement the sliding window (the ABI's `window`) says `windows = true`;
//! shapes with a window are admitted only by those, the same way.
//!
//! Hopper templates may also declare
//! - `arch_specific = true` under `[template]`: compiled for `sm_<cc>a` (e.g. `sm_90a`,
//!   for wgmma and setmaxnreg) instead of `sm_<cc>`. Such a cubin runs only on exactly
//!   that compute capability, so the template is usable only when the device's cc
//!   equals its `min_cc` ([`Meta::target_arch`]).
//! - `[[tensor_map]]` entries (`tensor` = q|k|v|o, `box_rows` = a formula, optional
//!   `box_panels` = a formula (panels of D per box; default all), `swizzle` =
//!   32|64|128 bytes, or a formula giving one per head dim): TMA tensor maps the worker encodes against the tensor's device
//!   pointer and appends, in declaration order, after the 17 ABI parameters of every
//!   launch (`const __grid_constant__ optd_tensor_map tm_x`, 128 bytes by value). The
//!   geometry is a fixed convention over the tensor of 2-byte elements as the launch's
//!   strides lay it out: with swizzle W and P = W/2 elements per panel, rank 5, dims
//!   {P, rows, D/P, heads, B} (innermost first), byte strides {row, P*2, head, batch}, box
//!   {P, box_rows, box_panels, 1, 1}; see
//!   [`crate::spec::protocol::TensorMap::geometry`], the one place it is computed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::spec::assets;
use crate::spec::config::HEAD_DIMS;
use crate::spec::protocol::{DeviceInfo, Launch, Shape, ShapePlan, TensorMap, TensorName};

/// Knob name -> chosen value. Ordered, so its JSON form is canonical.
pub type Params = BTreeMap<String, i64>;

const SPEC_START: &str = "/* optimizerd:spec";

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template {path}: {message}")]
    Spec { path: PathBuf, message: String },
    #[error("template {template}: formula `{name}` = \"{expr}\": {message}")]
    Formula { template: String, name: String, expr: String, message: String },
    /// A `[[refuse]]` entry holds for this point and shape: the kernel cannot run there.
    #[error("template {template} cannot run this point here ({when}): {why}; fix: other knob values for this shape")]
    Refused { template: String, when: String, why: String },
    #[error(transparent)]
    Asset(#[from] assets::AssetError),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    template: Meta,
    knobs: toml::Table,
    #[serde(default)]
    derived: toml::Table,
    launch: Vec<LaunchSpec>,
    #[serde(default)]
    tensor_map: Vec<TensorMapSpec>,
    #[serde(default)]
    inert: toml::Table,
    #[serde(default)]
    refuse: Vec<RefuseSpec>,
}

/// One `[[refuse]]` of the spec: where `when` holds, the point cannot run on the shape (a
/// register budget a head dim exceeds, say), and the gate says `why`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RefuseSpec {
    /// A boolean formula over what the `[derived]` formulas see, and the derived values.
    pub when: String,
    /// The reason, in words for the ledger.
    pub why: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Smallest compute capability (major*10+minor) the template compiles and runs on.
    #[serde(default)]
    pub min_cc: u32,
    /// Test-only templates (planted faults); never in the default plan.
    #[serde(default)]
    pub testing: bool,
    /// Compile for the arch-specific target `sm_<min_cc>a` (wgmma, setmaxnreg): the cubin
    /// runs only on a device whose compute capability is exactly `min_cc`.
    #[serde(default)]
    pub arch_specific: bool,
    /// The template's regime: the most query rows (SQ) a shape may have for it, e.g. 16
    /// for a decode template. The gate refuses shapes with more, with the reason; absent:
    /// every SQ.
    #[serde(default)]
    pub max_sq: Option<u32>,
    /// The head dims the kernels are written for, each exported as `optd_<role>_d<D>`: a
    /// subset of [`HEAD_DIMS`], ascending. Absent: 64 and 128, the two every template was
    /// first written for. The gate refuses a shape of another D, with the reason, and the
    /// plan's stages and the open phase offer the template only the shapes it admits.
    #[serde(default = "classic_head_dims")]
    pub head_dims: Vec<u32>,
    /// Whether the kernels implement the sliding window (the ABI's `window`). Absent: they
    /// do not, and the gate refuses shapes that have one, with the reason.
    #[serde(default)]
    pub windows: bool,
}

fn classic_head_dims() -> Vec<u32> {
    vec![64, 128]
}

impl Meta {
    /// Whether the template is for `shape` (its `max_sq`, its `head_dims`); Err: why not,
    /// in words.
    pub fn admits(&self, shape: &Shape) -> Result<(), String> {
        if !self.head_dims.contains(&shape.d) {
            return Err(format!(
                "template {} is written for head dims {:?} (its head_dims) and this shape has D = {}; the other templates serve it",
                self.name, self.head_dims, shape.d
            ));
        }
        if shape.window.is_some() && !self.windows {
            return Err(format!(
                "template {} does not implement a sliding window (its spec has no `windows = true`) and this shape has window = {}; the templates that do serve it",
                self.name,
                shape.abi_window()
            ));
        }
        match self.max_sq {
            Some(max) if shape.sq > max => Err(format!(
                "template {} is for SQ <= {max} (its max_sq: decode) and this shape has SQ = {}; the other templates serve it",
                self.name, shape.sq
            )),
            _ => Ok(()),
        }
    }
}

impl Meta {
    /// The NVRTC target for this template on `device`: `sm_90`, or `sm_90a` when
    /// arch-specific. Err: why the template cannot run there, in words.
    pub fn target_arch(&self, device: &DeviceInfo) -> Result<String, String> {
        let cc = device.cc();
        if !self.arch_specific {
            if cc < self.min_cc {
                return Err(format!("template {} needs compute capability {} and the device has {cc}", self.name, self.min_cc));
            }
            return Ok(device.arch.clone());
        }
        if cc != self.min_cc {
            return Err(format!(
                "{} needs sm_{}a (compute capability {}.{}); this GPU is sm_{}{}: an arch-specific cubin runs only on that exact compute capability",
                self.name,
                self.min_cc,
                self.min_cc / 10,
                self.min_cc % 10,
                device.cc_major,
                device.cc_minor
            ));
        }
        Ok(format!("sm_{}{}a", device.cc_major, device.cc_minor))
    }
}

/// One `[[tensor_map]]` of the spec: a TMA map passed after the ABI parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorMapSpec {
    pub tensor: TensorName,
    /// Rows of one box: a formula (`BLOCK_N`, `64`), evaluated per shape.
    #[serde(deserialize_with = "formula")]
    pub box_rows: String,
    /// Bytes: 32, 64 or 128; a formula of D and the knobs (wgmma_tma.cu: `64 if D == 96
    /// else 128`, since D 96 is no multiple of a 128-byte swizzle's 64-column panel).
    #[serde(deserialize_with = "formula")]
    pub swizzle: String,
    /// Panels of D per box: a formula; absent, all of them (D / (swizzle / 2)).
    #[serde(default, deserialize_with = "formula_opt")]
    pub box_panels: Option<String>,
}

fn formula_opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    formula(d).map(Some)
}

/// A formula written as a string, or as a plain integer (`box_rows = 64`).
fn formula<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum F {
        Int(i64),
        Expr(String),
    }
    match F::deserialize(d) {
        Ok(F::Int(i)) => Ok(i.to_string()),
        Ok(F::Expr(e)) => Ok(e),
        Err(_) => Err(serde::de::Error::custom("expected a formula string (e.g. \"BLOCK_N\") or an integer")),
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSpec {
    /// Role: the exported kernel is `optd_<role>_d<D>`.
    pub kernel: String,
    pub grid: [String; 3],
    pub block: [String; 3],
    pub smem: String,
    /// Launch only when this evaluates true (e.g. `splits > 1`).
    #[serde(default)]
    pub when: Option<String>,
}

/// A parsed template: its CUDA text, and its declared knobs and formulas.
#[derive(Debug, Clone)]
pub struct Template {
    pub meta: Meta,
    /// Where it was read from (path relative to the templates dir).
    pub file: String,
    pub text: String,
    /// Knob -> allowed values, in declaration order.
    pub knobs: Vec<(String, Vec<i64>)>,
    /// Derived name -> expression, in evaluation order.
    pub derived: Vec<(String, String)>,
    pub launches: Vec<LaunchSpec>,
    /// TMA tensor maps, in kernel-parameter order (after the 17 ABI parameters).
    pub tensor_maps: Vec<TensorMapSpec>,
    /// Knob -> expression (`[inert]`): where true for a shape, the knob changes nothing
    /// there ([`Template::canonical`]). In declaration order.
    pub inert: Vec<(String, String)>,
    /// What each `[inert]` expression reads, in the order of `inert` (worked out by the parse).
    inert_reads: Vec<InertReads>,
    /// `[[refuse]]`: the points and shapes the kernel cannot run, each with its reason.
    pub refusals: Vec<RefuseSpec>,
}

/// What one `[inert]` expression reads, so that [`Template::canonical`], asked for every
/// point of an exhaustive stage (thousands for wgmma-tma), evaluates only that.
#[derive(Debug, Clone, Default)]
struct InertReads {
    /// The derived values it needs, directly or through each other: indices into
    /// `derived`, in evaluation order.
    derived: Vec<usize>,
    /// Whether it reads its own knob (directly or through those values): then it is
    /// evaluated for each of the knob's values; else once per shape.
    knob: bool,
}

impl Template {
    /// Load `file` (e.g. `kv_split.cu`) from `dir`, or from the embedded copies.
    pub fn load(dir: &Path, file: &str) -> Result<Self, TemplateError> {
        let text = assets::read(dir, file)?;
        Self::parse(file, text)
    }

    pub fn parse(file: &str, text: String) -> Result<Self, TemplateError> {
        let err = |message: String| TemplateError::Spec { path: PathBuf::from(file), message };
        let start = text
            .find(SPEC_START)
            .ok_or_else(|| err(format!("no `{SPEC_START}` comment; every template declares its knobs and formulas there")))?;
        let body = &text[start + SPEC_START.len()..];
        let end = body.find("*/").ok_or_else(|| err("spec comment is not closed with `*/`".into()))?;
        let spec_text = &body[..end];
        let spec: SpecFile = toml::from_str(spec_text).map_err(|e| {
            let line = e.span().map_or(0, |s| text[..start].matches('\n').count() + spec_text[..s.start].matches('\n').count() + 1);
            err(format!("line {line}: {}", e.message()))
        })?;
        let mut knobs = Vec::new();
        for (name, values) in spec.knobs {
            let values: Vec<i64> = values
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_integer()).collect())
                .filter(|v: &Vec<i64>| !v.is_empty())
                .ok_or_else(|| err(format!("knob `{name}`: expected a non-empty list of integers, e.g. {name} = [32, 64]")))?;
            knobs.push((name, values));
        }
        let mut derived = Vec::new();
        for (name, expr) in spec.derived {
            let expr = expr
                .as_str()
                .ok_or_else(|| err(format!("derived `{name}`: expected an expression string")))?;
            derived.push((name, expr.to_string()));
        }
        if !derived.iter().any(|(n, _)| n == "splits") {
            derived.push(("splits".into(), "1".into()));
        }
        let mut inert = Vec::new();
        for (name, expr) in spec.inert {
            if !knobs.iter().any(|(k, _)| *k == name) {
                let declared: Vec<&str> = knobs.iter().map(|(k, _)| k.as_str()).collect();
                return Err(err(format!(
                    "[inert] names `{name}`, which is not a knob of this template (knobs: {}); an [inert] key is a knob declared under [knobs]: fix the name or remove the line",
                    declared.join(", ")
                )));
            }
            let expr = expr.as_str().ok_or_else(|| {
                err(format!("[inert] `{name}`: expected a boolean expression string, true for the shapes where the knob changes nothing (e.g. {name} = \"D == 128\")"))
            })?;
            inert.push((name, expr.to_string()));
        }
        if spec.launch.is_empty() {
            return Err(err("declares no [[launch]]".into()));
        }
        for (i, m) in spec.tensor_map.iter().enumerate() {
            // A literal is checked here; a formula's value per shape by the plan's geometry.
            if let Ok(w) = m.swizzle.trim().parse::<i64>() {
                if !matches!(w, 32 | 64 | 128) {
                    return Err(err(format!(
                        "tensor_map[{i}] ({}): swizzle = {w} is not allowed (allowed: 32, 64, 128 bytes, or a formula giving one of them)",
                        m.tensor.as_str(),
                    )));
                }
            }
        }
        if !spec.tensor_map.is_empty() && spec.template.min_cc < 90 {
            return Err(err(format!(
                "declares [[tensor_map]] but min_cc = {}: TMA tensor maps need compute capability 9.0; set min_cc = 90",
                spec.template.min_cc
            )));
        }
        if spec.template.max_sq == Some(0) {
            return Err(err("max_sq = 0 admits no shape; give the most query rows the template is for (e.g. max_sq = 16), or remove it".into()));
        }
        let hd = &spec.template.head_dims;
        if hd.is_empty() || hd.iter().any(|d| !HEAD_DIMS.contains(d)) || hd.windows(2).any(|w| w[0] >= w[1]) {
            return Err(err(format!(
                "head_dims = {hd:?}: expected a non-empty ascending list drawn from {HEAD_DIMS:?} (the head dims the project builds; \
                 a new one is added to HEAD_DIMS in src/spec/config.rs and to common/optd.cuh's OPTD_BUILD_D<d> macros)"
            )));
        }
        if spec.template.arch_specific && spec.template.min_cc == 0 {
            return Err(err(
                "arch_specific = true needs min_cc: the one compute capability its sm_<cc>a cubin runs on (e.g. min_cc = 90 for sm_90a)".into(),
            ));
        }
        let mut t = Template {
            meta: spec.template,
            file: file.to_string(),
            text,
            knobs,
            derived,
            launches: spec.launch,
            tensor_maps: spec.tensor_map,
            inert,
            inert_reads: Vec::new(),
            refusals: spec.refuse,
        };
        t.inert_reads = t.inert_reads()?;
        t.check_refusals()?;
        Ok(t)
    }

    /// The knobs `formulas` read, directly or through the derived values they read, in
    /// declaration order: the knobs that decide those formulas' values (a test that covers
    /// every combination of these covers every value the formulas take). A formula that does
    /// not compile is taken to read every knob.
    pub fn knobs_read(&self, formulas: &[&str]) -> Vec<String> {
        let env = formula_env();
        let reads = |expr: &str| -> Option<std::collections::HashSet<String>> { env.compile_expression(expr).ok().map(|c| c.undeclared_variables(false)) };
        let mut todo: Vec<String> = Vec::new();
        for f in formulas {
            match reads(f) {
                Some(names) => todo.extend(names),
                None => return self.knobs.iter().map(|(k, _)| k.clone()).collect(),
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        while let Some(name) = todo.pop() {
            if seen.insert(name.clone()) {
                if let Some((_, expr)) = self.derived.iter().find(|(n, _)| *n == name) {
                    match reads(expr) {
                        Some(names) => todo.extend(names),
                        None => return self.knobs.iter().map(|(k, _)| k.clone()).collect(),
                    }
                }
            }
        }
        self.knobs.iter().filter(|(k, _)| seen.contains(k)).map(|(k, _)| k.clone()).collect()
    }

    /// Whether a formula can read `name`: a knob, a derived value, a shape or device variable,
    /// or a function.
    fn visible(&self, name: &str) -> bool {
        self.knobs.iter().any(|(k, _)| k == name)
            || self.derived.iter().any(|(d, _)| d == name)
            || SHAPE_VAR_NAMES.contains(&name)
            || FUNCTIONS.contains(&name)
    }

    /// Each `[[refuse]]` has a reason and a `when` that compiles and names only what a formula
    /// can see (a typo would otherwise refuse nothing, or everything, at the first plan).
    fn check_refusals(&self) -> Result<(), TemplateError> {
        let env = formula_env();
        for (i, r) in self.refusals.iter().enumerate() {
            let name = format!("refuse[{i}].when");
            if r.why.trim().is_empty() {
                return Err(self.formula_err(&name, &r.when, "has no `why`: say in words why the point cannot run there".into()));
            }
            let compiled = env.compile_expression(&r.when).map_err(|e| self.formula_err(&name, &r.when, e.to_string()))?;
            let mut unknown: Vec<String> = compiled.undeclared_variables(false).into_iter().filter(|v| !self.visible(v)).collect();
            if !unknown.is_empty() {
                unknown.sort();
                return Err(self.formula_err(
                    &name,
                    &r.when,
                    format!("uses {}, not a knob, a [derived] value or a shape or device variable ({})", unknown.join(", "), SHAPE_VAR_NAMES.join(", ")),
                ));
            }
        }
        Ok(())
    }

    /// Each `[inert]` expression compiles and names only what a formula can see (a typo
    /// would otherwise surface only when a search first asks for a canonical point), and
    /// what it reads.
    fn inert_reads(&self) -> Result<Vec<InertReads>, TemplateError> {
        let env = formula_env();
        // The names each derived formula reads; one that does not compile (its error comes
        // with the plan) is taken to read everything before it.
        let derived_reads: Vec<Option<std::collections::HashSet<String>>> =
            self.derived.iter().map(|(_, expr)| env.compile_expression(expr).ok().map(|c| c.undeclared_variables(false))).collect();
        let mut out = Vec::with_capacity(self.inert.len());
        for (knob, expr) in &self.inert {
            let name = format!("inert.{knob}");
            let compiled = env.compile_expression(expr).map_err(|e| self.formula_err(&name, expr, e.to_string()))?;
            let reads = compiled.undeclared_variables(false);
            let mut unknown: Vec<String> = reads.iter().filter(|v| !self.visible(v)).cloned().collect();
            if !unknown.is_empty() {
                unknown.sort();
                let hint = if uses_v1_names(expr) { " (kernel ABI v2: H became HQ or HKV, S became SQ or SK)" } else { "" };
                return Err(self.formula_err(
                    &name,
                    expr,
                    format!(
                        "uses {}, which {} a knob, a [derived] value or a shape or device variable ({}){hint}",
                        unknown.iter().map(|u| format!("`{u}`")).collect::<Vec<_>>().join(", "),
                        if unknown.len() == 1 { "is not" } else { "are not" },
                        SHAPE_VAR_NAMES.join(", ")
                    ),
                ));
            }
            // The derived values it needs: a formula may read only those before it, so one
            // walk from the last to the first closes the set.
            let mut names = reads;
            let mut needed = Vec::new();
            for (i, (d, _)) in self.derived.iter().enumerate().rev() {
                if names.contains(d) {
                    needed.push(i);
                    match &derived_reads[i] {
                        Some(r) => names.extend(r.iter().cloned()),
                        None => names.extend(self.knobs.iter().map(|(k, _)| k.clone()).chain(self.derived[..i].iter().map(|(n, _)| n.clone()))),
                    }
                }
            }
            needed.reverse();
            out.push(InertReads { derived: needed, knob: names.contains(knob) });
        }
        Ok(out)
    }

    pub fn name(&self) -> &str {
        &self.meta.name
    }

    /// The first allowed value of every knob: the template's own default candidate.
    pub fn default_params(&self) -> Params {
        self.knobs.iter().map(|(k, v)| (k.clone(), v[0])).collect()
    }

    /// `params` with every knob it lacks at that knob's first value: a point recorded before
    /// the knob was added (a new knob's first value is the kernel as it was, the templates'
    /// convention), so that remembered configurations survive a release that adds knobs.
    /// Keys that are no knob stay, and `validate_params` refuses them.
    pub fn with_defaults(&self, params: &Params) -> Params {
        let mut out = params.clone();
        for (k, v) in &self.knobs {
            out.entry(k.clone()).or_insert(v[0]);
        }
        out
    }

    /// Check that `params` sets exactly this template's knobs to allowed values.
    pub fn validate_params(&self, params: &Params) -> Result<(), String> {
        for (name, allowed) in &self.knobs {
            match params.get(name) {
                None => return Err(format!("knob `{name}` not set (allowed: {allowed:?})")),
                Some(v) if !allowed.contains(v) => {
                    return Err(format!("knob `{name}` = {v} is not allowed (allowed: {allowed:?})"))
                }
                _ => {}
            }
        }
        if let Some(extra) = params.keys().find(|k| !self.knobs.iter().any(|(n, _)| n == *k)) {
            return Err(format!("`{extra}` is not a knob of template {}", self.name()));
        }
        Ok(())
    }

    /// Exported kernel names for the head dims in use, e.g. `optd_fwd_d64`.
    pub fn kernel_names(&self, head_dims: &[u32]) -> Vec<String> {
        let mut names = Vec::new();
        for d in head_dims {
            for l in &self.launches {
                let n = kernel_name(&l.kernel, *d);
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        names
    }

    /// Evaluate every formula for one shape on one device: the launches that will run.
    pub fn plan(&self, params: &Params, shape: &Shape, device: &DeviceInfo) -> Result<ShapePlan, TemplateError> {
        let env = formula_env();
        let vars = self.vars(&env, params, shape, device)?;
        for (i, r) in self.refusals.iter().enumerate() {
            if self.eval_bool(&env, &format!("refuse[{i}].when"), &r.when, &vars)? {
                return Err(TemplateError::Refused { template: self.meta.name.clone(), when: r.when.clone(), why: r.why.clone() });
            }
        }
        let mut launches = Vec::new();
        for (i, l) in self.launches.iter().enumerate() {
            if let Some(when) = &l.when {
                if !self.eval_bool(&env, &format!("launch[{i}].when"), when, &vars)? {
                    continue;
                }
            }
            let dims = |what: &str, exprs: &[String; 3]| -> Result<[u32; 3], TemplateError> {
                let mut out = [0u32; 3];
                for (j, e) in exprs.iter().enumerate() {
                    let v = self.eval_int(&env, &format!("launch[{i}].{what}[{j}]"), e, &vars)?;
                    out[j] = u32::try_from(v).map_err(|_| self.formula_err(&format!("launch[{i}].{what}[{j}]"), e, format!("gave {v}, outside 0..2^32")))?;
                }
                Ok(out)
            };
            let grid = dims("grid", &l.grid)?;
            let block = dims("block", &l.block)?;
            let smem = self.eval_int(&env, &format!("launch[{i}].smem"), &l.smem, &vars)?;
            let dyn_smem = u32::try_from(smem).map_err(|_| self.formula_err(&format!("launch[{i}].smem"), &l.smem, format!("gave {smem}")))?;
            launches.push(Launch { kernel: kernel_name(&l.kernel, shape.d), grid, block, dyn_smem });
        }
        let mut tensor_maps = Vec::with_capacity(self.tensor_maps.len());
        for (i, m) in self.tensor_maps.iter().enumerate() {
            let name = format!("tensor_map[{i}].box_rows");
            let rows = self.eval_int(&env, &name, &m.box_rows, &vars)?;
            let box_rows = u32::try_from(rows).map_err(|_| self.formula_err(&name, &m.box_rows, format!("gave {rows}, outside 0..2^32")))?;
            let box_panels = match &m.box_panels {
                Some(f) => {
                    let name = format!("tensor_map[{i}].box_panels");
                    let n = self.eval_int(&env, &name, f, &vars)?;
                    Some(u32::try_from(n).map_err(|_| self.formula_err(&name, f, format!("gave {n}, outside 0..2^32")))?)
                }
                None => None,
            };
            let name = format!("tensor_map[{i}].swizzle");
            let w = self.eval_int(&env, &name, &m.swizzle, &vars)?;
            let swizzle = u32::try_from(w).map_err(|_| self.formula_err(&name, &m.swizzle, format!("gave {w}; allowed: 32, 64, 128")))?;
            tensor_maps.push(TensorMap { tensor: m.tensor, box_rows, swizzle, box_panels });
        }
        let splits = vars.get("splits").copied().unwrap_or(1);
        let n_splits = u32::try_from(splits)
            .ok()
            .filter(|&s| s >= 1)
            .ok_or_else(|| self.formula_err("splits", "", format!("gave {splits}; must be >= 1")))?;
        Ok(ShapePlan { shape: *shape, n_splits, launches, tensor_maps })
    }

    /// What every formula of one shape sees: the shape and device variables, the knobs,
    /// then the derived values in declaration order (each may use the ones before it).
    fn vars(&self, env: &minijinja::Environment<'static>, params: &Params, shape: &Shape, device: &DeviceInfo) -> Result<BTreeMap<String, i64>, TemplateError> {
        let mut vars = shape_vars(shape, device);
        vars.extend(params.iter().map(|(k, v)| (k.clone(), *v)));
        for (name, expr) in &self.derived {
            let v = self.eval_int(env, name, expr, &vars)?;
            vars.insert(name.clone(), v);
        }
        Ok(vars)
    }

    /// `params` with every knob that is inert on all of `shapes` (its `[inert]` expression
    /// true on each) set to its first declared value: the one point searches propose, render
    /// and record for all the points that run the same kernel on these shapes. Knobs inert
    /// on only some of them keep their value (it matters on the others). Without `[inert]`,
    /// or without shapes, `params` as given. Err: an expression (or a derived value it
    /// reads) fails to evaluate.
    ///
    /// Idempotent. A knob set to its default can make another inert (an expression may
    /// read other knobs), so the knobs are walked again until nothing changes; each step
    /// replaces a point by one that runs the same kernel, so the result does too.
    pub fn canonical(&self, params: &Params, shapes: &[Shape], device: &DeviceInfo) -> Result<Params, TemplateError> {
        if self.inert.is_empty() || shapes.is_empty() {
            return Ok(params.clone());
        }
        let env = formula_env();
        let mut formulas = Compiled { derived: Vec::new(), inert: Vec::new() };
        for (name, expr) in &self.derived {
            let compiled = env.compile_expression(expr).map_err(|e| self.formula_err(name, expr, e.to_string()))?;
            formulas.derived.push((name, expr, compiled));
        }
        for (knob, expr) in &self.inert {
            let name = format!("inert.{knob}");
            let compiled = env.compile_expression(expr).map_err(|e| self.formula_err(&name, expr, e.to_string()))?;
            formulas.inert.push((knob, name, expr, compiled));
        }
        let mut out = params.clone();
        loop {
            let mut changed = false;
            for ((knob, name, expr, compiled), reads) in formulas.inert.iter().zip(&self.inert_reads) {
                let Some(values) = self.knobs.iter().find(|(k, _)| k == knob).map(|(_, v)| v) else { continue };
                // A knob at its default needs nothing; one the point lacks is not ours to add.
                let Some(&current) = out.get(*knob).filter(|v| **v != values[0]) else { continue };
                // Inert on every shape whatever value the knob has (the expression may read
                // it, or a derived value of it): "inert" must not depend on the knob itself.
                // An expression that does not read it gives one answer for all of them.
                let tried = if reads.knob { values.as_slice() } else { std::slice::from_ref(&current) };
                let mut inert = true;
                let mut p = out.clone();
                'shapes: for shape in shapes {
                    for v in tried {
                        p.insert(knob.to_string(), *v);
                        let mut vars = shape_vars(shape, device);
                        vars.extend(p.iter().map(|(k, v)| (k.clone(), *v)));
                        // One context for all the formulas of this point and shape, the derived
                        // values added as they come (serializing the variables for every
                        // formula was most of the cost).
                        let vars = std::sync::Arc::new(Vars(std::sync::Mutex::new(vars)));
                        let ctx = minijinja::Value::from_dyn_object(vars.clone());
                        for &i in &reads.derived {
                            let (d, dexpr, dc) = &formulas.derived[i];
                            let value = self.run_in(d, dexpr, dc, &ctx)?;
                            let value = self.int_value(d, dexpr, value)?;
                            vars.insert(d, value);
                        }
                        let holds = self.run_in(name, expr, compiled, &ctx)?;
                        if !self.bool_value(name, expr, holds)? {
                            inert = false;
                            break 'shapes;
                        }
                    }
                }
                if inert {
                    out.insert(knob.to_string(), values[0]);
                    changed = true;
                }
            }
            if !changed {
                return Ok(out);
            }
        }
    }

    /// The dynamic shared memory of each launch role at head dim `d`, for the renderer to
    /// hand the kernel (`OPTD_SMEM_BYTES_<ROLE>_D<d>`) so that it can check its layout at
    /// compile time. The `smem` formula is evaluated as [`Template::plan`] does, but over
    /// the knobs, `D` and `ELEM_BYTES` alone (and the derived values computable from them):
    /// a formula that reads the shape or the device has no single value per head dim and
    /// gives Err with the evaluator's reason. Roles in declaration order, each once; two
    /// launches of one role that disagree give Err.
    pub fn layout_smem(&self, params: &Params, d: u32) -> Vec<(String, Result<u32, String>)> {
        let env = formula_env();
        let mut vars: BTreeMap<String, i64> = params.iter().map(|(k, v)| (k.clone(), *v)).collect();
        vars.insert("D".into(), d as i64);
        vars.insert("ELEM_BYTES".into(), 2);
        for (name, expr) in &self.derived {
            // A derived value that needs the shape (m_blocks, splits) is simply not there.
            if let Ok(v) = self.eval_int(&env, name, expr, &vars) {
                vars.insert(name.clone(), v);
            }
        }
        let mut out: Vec<(String, Result<u32, String>)> = Vec::new();
        for (i, l) in self.launches.iter().enumerate() {
            let value = match self.eval_int(&env, &format!("launch[{i}].smem"), &l.smem, &vars) {
                Ok(v) => u32::try_from(v).map_err(|_| format!("smem \"{}\" gave {v}", l.smem)),
                Err(TemplateError::Formula { message, .. }) => {
                    Err(format!("smem \"{}\" has no value from the knobs and D alone ({})", l.smem, message.replace('\n', " ")))
                }
                Err(e) => Err(e.to_string().replace('\n', " ")),
            };
            match out.iter_mut().find(|(role, _)| *role == l.kernel) {
                None => out.push((l.kernel.clone(), value)),
                Some((_, seen)) if *seen != value => {
                    *seen = Err(format!("the launches of role `{}` declare different smem formulas", l.kernel))
                }
                Some(_) => {}
            }
        }
        out
    }

    fn formula_err(&self, name: &str, expr: &str, message: String) -> TemplateError {
        TemplateError::Formula { template: self.name().to_string(), name: name.into(), expr: expr.into(), message }
    }

    fn eval(&self, env: &minijinja::Environment<'static>, name: &str, expr: &str, vars: &BTreeMap<String, i64>) -> Result<minijinja::Value, TemplateError> {
        let compiled = env.compile_expression(expr).map_err(|e| self.formula_err(name, expr, e.to_string()))?;
        self.run(name, expr, &compiled, vars)
    }

    /// Evaluate a compiled formula (`name` and `expr` for the error).
    fn run(&self, name: &str, expr: &str, compiled: &minijinja::Expression<'_, '_>, vars: &BTreeMap<String, i64>) -> Result<minijinja::Value, TemplateError> {
        self.run_in(name, expr, compiled, &minijinja::Value::from_serialize(vars))
    }

    /// Evaluate a compiled formula in a context already made a value.
    fn run_in(&self, name: &str, expr: &str, compiled: &minijinja::Expression<'_, '_>, ctx: &minijinja::Value) -> Result<minijinja::Value, TemplateError> {
        compiled.eval(ctx).map_err(|e| {
            let mut message = e.to_string();
            if uses_v1_names(expr) {
                message.push_str(" (kernel ABI v2 names the shape HQ, HKV, G, SQ and SK: H became HQ or HKV, S became SQ or SK)");
            }
            self.formula_err(name, expr, message)
        })
    }

    fn eval_int(&self, env: &minijinja::Environment<'static>, name: &str, expr: &str, vars: &BTreeMap<String, i64>) -> Result<i64, TemplateError> {
        let v = self.eval(env, name, expr, vars)?;
        self.int_value(name, expr, v)
    }

    fn int_value(&self, name: &str, expr: &str, v: minijinja::Value) -> Result<i64, TemplateError> {
        if v.is_undefined() {
            let hint = if uses_v1_names(expr) { " (kernel ABI v2: H became HQ or HKV, S became SQ or SK)" } else { "" };
            return Err(self.formula_err(name, expr, format!("uses an undefined name{hint}")));
        }
        if let Ok(i) = i64::try_from(v.clone()) {
            return Ok(i);
        }
        match f64::try_from(v.clone()) {
            Ok(f) if f.fract() == 0.0 && f.is_finite() => Ok(f as i64),
            _ => Err(self.formula_err(name, expr, format!("gave {v}, not an integer (use // for integer division)"))),
        }
    }

    fn eval_bool(&self, env: &minijinja::Environment<'static>, name: &str, expr: &str, vars: &BTreeMap<String, i64>) -> Result<bool, TemplateError> {
        let v = self.eval(env, name, expr, vars)?;
        self.bool_value(name, expr, v)
    }

    fn bool_value(&self, name: &str, expr: &str, v: minijinja::Value) -> Result<bool, TemplateError> {
        if v.is_undefined() {
            return Err(self.formula_err(name, expr, "uses an undefined name".into()));
        }
        Ok(v.is_true())
    }
}

/// A template's formulas compiled once for [`Template::canonical`], which evaluates them for
/// every shape (and every value of a knob whose expression reads it).
struct Compiled<'e> {
    /// (name, expression, compiled), in declaration order.
    derived: Vec<(&'e str, &'e str, minijinja::Expression<'e, 'e>)>,
    /// (knob, `inert.<knob>`, expression, compiled).
    inert: Vec<(&'e str, String, &'e str, minijinja::Expression<'e, 'e>)>,
}

/// The variables of one evaluation context that grows as derived values are computed.
#[derive(Debug)]
struct Vars(std::sync::Mutex<BTreeMap<String, i64>>);

impl Vars {
    fn insert(&self, name: &str, value: i64) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(name.to_string(), value);
        }
    }
}

impl minijinja::value::Object for Vars {
    fn get_value(self: &std::sync::Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        let m = self.0.lock().ok()?;
        m.get(key.as_str()?).map(|v| minijinja::Value::from(*v))
    }
}

/// The names [`shape_vars`] defines (a unit test keeps the two in step).
pub const SHAPE_VAR_NAMES: [&str; 14] = [
    "B",
    "HQ",
    "HKV",
    "G",
    "SQ",
    "SK",
    "D",
    "CAUSAL",
    "WINDOW",
    "BSHD",
    "ELEM_BYTES",
    "SMS",
    "SMEM_OPTIN",
    "CC",
];

/// The functions [`formula_env`] adds.
const FUNCTIONS: [&str; 3] = ["cdiv", "min", "max"];

/// The names every formula may use besides knobs: the shape and the device.
/// Since kernel ABI v2 a shape has HQ query heads over HKV KV heads (G = HQ / HKV per
/// group) and SQ query rows over SK keys; the version-1 names H and S are gone on
/// purpose, so a formula that still uses them fails with "uses an undefined name"
/// instead of launching a grid sized for the wrong one.
pub fn shape_vars(shape: &Shape, device: &DeviceInfo) -> BTreeMap<String, i64> {
    let mut vars = BTreeMap::new();
    vars.insert("B".into(), shape.b as i64);
    vars.insert("HQ".into(), shape.hq as i64);
    vars.insert("HKV".into(), shape.hkv as i64);
    vars.insert("G".into(), shape.group() as i64);
    vars.insert("SQ".into(), shape.sq as i64);
    vars.insert("SK".into(), shape.sk as i64);
    vars.insert("D".into(), shape.d as i64);
    vars.insert("CAUSAL".into(), shape.causal as i64);
    // The sliding window's keys, 0 for none (as the kernel ABI passes it).
    vars.insert("WINDOW".into(), shape.abi_window() as i64);
    vars.insert(
        "BSHD".into(),
        (shape.layout == crate::spec::protocol::Layout::Bshd) as i64,
    );
    vars.insert("ELEM_BYTES".into(), 2);
    vars.insert("SMS".into(), device.sm_count as i64);
    vars.insert("SMEM_OPTIN".into(), device.smem_optin as i64);
    vars.insert("CC".into(), device.cc() as i64);
    vars
}

/// Whether a formula names the version-1 shape variables `H` or `S` as whole words.
fn uses_v1_names(expr: &str) -> bool {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).any(|w| w == "H" || w == "S")
}

/// Evaluate one expression outside a template, in the formulas' environment.
fn eval_expr(expr: &str, vars: &BTreeMap<String, i64>) -> Result<minijinja::Value, String> {
    formula_env()
        .compile_expression(expr)
        .and_then(|e| e.eval(minijinja::Value::from_serialize(vars)))
        .map_err(|e| e.to_string())
}

/// Evaluate one integer expression outside a template (e.g. a stage's `min_ctas`).
pub fn eval_int_expr(expr: &str, vars: &BTreeMap<String, i64>) -> Result<i64, String> {
    let v = eval_expr(expr, vars)?;
    i64::try_from(v.clone()).map_err(|_| format!("gave {v}, not an integer"))
}

/// Evaluate one boolean expression outside a template (a stage's `shapes`): true where it
/// gives true or a non-zero integer.
pub fn eval_bool_expr(expr: &str, vars: &BTreeMap<String, i64>) -> Result<bool, String> {
    let v = eval_expr(expr, vars)?;
    if v.is_undefined() {
        return Err("uses an undefined name".into());
    }
    Ok(v.is_true())
}

pub fn kernel_name(role: &str, d: u32) -> String {
    format!("optd_{role}_d{d}")
}

fn formula_env() -> minijinja::Environment<'static> {
    use minijinja::value::Rest;
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.add_function("cdiv", |a: i64, b: i64| -> Result<i64, minijinja::Error> {
        if b <= 0 {
            return Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, "cdiv by a non-positive number"));
        }
        Ok((a + b - 1).div_euclid(b))
    });
    env.add_function("min", |xs: Rest<i64>| xs.iter().copied().min().unwrap_or(0));
    env.add_function("max", |xs: Rest<i64>| xs.iter().copied().max().unwrap_or(0));
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::protocol::{DType, Layout};
    use crate::test_fixtures::h100;

    /// A template whose `PACK` packs a KV head's query heads at D 64 with G in {2, 4, 8}
    /// (wgmma_tma's PACK_GQA in small), with two more knobs `SPLIT` and `ALIGN` that the
    /// tests declare inert under various conditions; `[inert]` is `inert`.
    fn spec(inert: &str) -> String {
        format!(
            r#"/* optimizerd:spec
[template]
name = "toy"

[knobs]
TILE = [64, 128]
PACK = [0, 1]
SPLIT = [0, 1]
ALIGN = [16, 8]

[derived]
pack = "G if PACK and D == 64 and G >= 2 and 8 % G == 0 else 1"
m_blocks = "cdiv(SQ, TILE // pack)"

[inert]
{inert}

[[launch]]
kernel = "fwd"
grid = ["m_blocks", "B * HQ // pack", "1"]
block = ["128", "1", "1"]
smem = "0"
*/
"#
        )
    }

    fn toy(inert: &str) -> Template {
        Template::parse("toy.cu", spec(inert)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn shape(hq: u32, hkv: u32, d: u32) -> Shape {
        Shape {
            b: 2,
            hq,
            hkv,
            sq: 1024,
            sk: 1024,
            d,
            causal: true,
            window: None,
            dtype: DType::Bf16,
            layout: Layout::Bhsd,
        }
    }

    fn point(tile: i64, pack: i64, split: i64, align: i64) -> Params {
        [("TILE", tile), ("PACK", pack), ("SPLIT", split), ("ALIGN", align)].into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    #[test]
    fn shape_var_names_are_what_shape_vars_defines() {
        let names: Vec<String> = shape_vars(&shape(8, 8, 64), &h100()).into_keys().collect();
        let mut declared: Vec<String> = SHAPE_VAR_NAMES.iter().map(|s| s.to_string()).collect();
        declared.sort();
        assert_eq!(names, declared);
    }

    /// A shape with a sliding window goes only to templates that say `windows = true`; the
    /// refusal names the template and the key; formulas read the window as WINDOW.
    #[test]
    fn only_templates_that_implement_the_window_admit_windowed_shapes() {
        let local = shape(8, 4, 64).with_window(Some(256));
        let plain = toy("");
        let why = plain.meta.admits(&local).unwrap_err();
        assert!(
            why.contains("template toy does not implement a sliding window")
                && why.contains("windows = true")
                && why.contains("window = 256"),
            "{why}"
        );
        plain.meta.admits(&shape(8, 4, 64)).unwrap();
        let windowed = Template::parse(
            "toy.cu",
            spec("ALIGN = \"WINDOW > 0\"")
                .replace("name = \"toy\"", "name = \"toy\"\nwindows = true"),
        )
        .unwrap();
        windowed.meta.admits(&local).unwrap();
        assert_eq!(shape_vars(&local, &h100())["WINDOW"], 256);
        assert_eq!(shape_vars(&shape(8, 4, 64), &h100())["WINDOW"], 0);
    }

    #[test]
    fn an_inert_key_that_is_not_a_knob_names_the_file_the_key_and_the_fix() {
        let err = Template::parse("toy.cu", spec("PACK_GQA = \"pack == 1\"")).unwrap_err();
        assert!(matches!(err, TemplateError::Spec { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.starts_with("template toy.cu: [inert] names `PACK_GQA`, which is not a knob"), "{msg}");
        assert!(msg.contains("knobs: TILE, PACK, SPLIT, ALIGN") && msg.contains("fix the name or remove the line"), "{msg}");

        let msg = Template::parse("toy.cu", spec("PACK = 1")).unwrap_err().to_string();
        assert!(msg.starts_with("template toy.cu: [inert] `PACK`: expected a boolean expression string") && msg.contains("PACK = \"D == 128\""), "{msg}");
    }

    #[test]
    fn an_inert_formula_that_does_not_compile_or_names_an_unknown_variable_is_a_formula_error() {
        let err = Template::parse("toy.cu", spec("PACK = \"pack ==\"")).unwrap_err();
        assert!(matches!(&err, TemplateError::Formula { name, .. } if name == "inert.PACK"), "{err:?}");
        assert!(err.to_string().starts_with("template toy: formula `inert.PACK` = \"pack ==\": "), "{err}");

        let msg = Template::parse("toy.cu", spec("ALIGN = \"DIM == 64 or packs > 1\"")).unwrap_err().to_string();
        assert!(msg.starts_with("template toy: formula `inert.ALIGN` = \"DIM == 64 or packs > 1\": uses `DIM`, `packs`, which are not a knob"), "{msg}");
        assert!(msg.contains("B, HQ, HKV, G, SQ, SK, D"), "lists the shape variables: {msg}");
        // Version-1 names get the ABI v2 hint, as the other formulas' errors do.
        let msg = Template::parse("toy.cu", spec("ALIGN = \"H == 8\"")).unwrap_err().to_string();
        assert!(msg.contains("uses `H`") && msg.contains("H became HQ or HKV"), "{msg}");
        // Knobs, derived values, shape and device variables and the formula functions are known.
        toy("ALIGN = \"D == 64 and cdiv(SQ, TILE) > min(SMS, CC) and m_blocks > 0 and not BSHD\"");
    }

    #[test]
    fn canonical_resets_a_knob_inert_on_every_shape_and_keeps_one_that_matters_on_some() {
        let t = toy("ALIGN = \"D == 64\"");
        let (d64, d128) = (shape(8, 8, 64), shape(8, 8, 128));
        let p = point(128, 0, 1, 8);
        assert_eq!(t.canonical(&p, &[d64, d64], &h100()).unwrap(), point(128, 0, 1, 16), "ALIGN to its first value");
        assert_eq!(t.canonical(&p, &[d64, d128], &h100()).unwrap(), p, "ALIGN matters at D 128");
        assert_eq!(t.canonical(&p, &[d128], &h100()).unwrap(), p);
        assert_eq!(t.canonical(&p, &[], &h100()).unwrap(), p, "no shapes: nothing to be inert on");
        let q = t.canonical(&p, &[d64], &h100()).unwrap();
        assert_eq!(t.canonical(&q, &[d64], &h100()).unwrap(), q, "idempotent");
        // Without [inert], the identity.
        let plain = Template::parse("plain.cu", spec("").replace("[inert]\n", "")).unwrap();
        assert!(plain.inert.is_empty());
        assert_eq!(plain.canonical(&p, &[d64], &h100()).unwrap(), p);
    }

    #[test]
    fn an_inert_expression_over_a_value_derived_from_its_own_knob_holds_whatever_the_knob_is() {
        // `pack == 1` is true at PACK 0 on every shape; PACK is inert where it is 1 at PACK 1 too.
        let t = toy("PACK = \"pack == 1\"");
        let mha = shape(8, 8, 64);
        let gqa64 = shape(32, 8, 64);
        let gqa128 = shape(32, 8, 128);
        let g3 = shape(24, 8, 64);
        let packed = point(128, 1, 0, 16);
        let plain = point(128, 0, 0, 16);
        for shapes in [vec![mha], vec![gqa128], vec![g3], vec![mha, gqa128, g3]] {
            assert_eq!(t.canonical(&packed, &shapes, &h100()).unwrap(), plain, "PACK 1 packs nothing on {shapes:?}");
        }
        for shapes in [vec![gqa64], vec![mha, gqa64]] {
            assert_eq!(t.canonical(&packed, &shapes, &h100()).unwrap(), packed, "PACK 1 packs G 4 at D 64 ({shapes:?})");
        }
        // The same as spelling the condition out without the knob.
        let spelled = toy("PACK = \"not (D == 64 and G >= 2 and 8 % G == 0)\"");
        for shapes in [vec![mha], vec![gqa64], vec![gqa128], vec![g3], vec![mha, gqa64]] {
            assert_eq!(spelled.canonical(&packed, &shapes, &h100()).unwrap(), t.canonical(&packed, &shapes, &h100()).unwrap(), "{shapes:?}");
        }
        // Through two derived values (m_blocks reads pack, which reads PACK): the same again.
        let t2 = toy("PACK = \"m_blocks == cdiv(SQ, TILE)\"");
        assert_eq!(t2.inert_reads[0].derived, [0, 1], "pack, then m_blocks");
        assert!(t2.inert_reads[0].knob);
        for shapes in [vec![mha], vec![gqa64], vec![gqa128], vec![g3], vec![mha, gqa64]] {
            assert_eq!(t2.canonical(&packed, &shapes, &h100()).unwrap(), t.canonical(&packed, &shapes, &h100()).unwrap(), "{shapes:?}");
        }
        // An expression that reads neither its knob nor a derived value is evaluated alone.
        let t3 = toy("ALIGN = \"D == 64\"");
        assert!(t3.inert_reads[0].derived.is_empty() && !t3.inert_reads[0].knob);
        // An expression true for one value of its own knob only is never inert.
        let t = toy("PACK = \"not PACK\"");
        assert_eq!(t.canonical(&packed, &[mha], &h100()).unwrap(), packed);
    }

    #[test]
    fn a_knob_made_inert_by_another_knob_s_default_is_reset_too() {
        // ALIGN matters only with SPLIT on; SPLIT is inert at D 64. The walk resets SPLIT,
        // then goes round again and finds ALIGN inert at SPLIT's default.
        let t = toy("ALIGN = \"SPLIT == 0\"\nSPLIT = \"D == 64\"");
        let (d64, d128) = (shape(8, 8, 64), shape(8, 8, 128));
        assert_eq!(t.canonical(&point(64, 0, 1, 8), &[d64], &h100()).unwrap(), point(64, 0, 0, 16), "SPLIT reset, then ALIGN");
        assert_eq!(t.canonical(&point(64, 0, 1, 8), &[d64, d128], &h100()).unwrap(), point(64, 0, 1, 8), "both matter at D 128");
        assert_eq!(t.canonical(&point(64, 0, 0, 8), &[d128], &h100()).unwrap(), point(64, 0, 0, 16), "ALIGN inert without SPLIT");
        // Consistent declarations give one answer whatever their order: SPLIT matters only
        // when nothing packs, PACK only where it packs.
        for inert in ["SPLIT = \"pack > 1\"\nPACK = \"pack == 1\"", "PACK = \"pack == 1\"\nSPLIT = \"pack > 1\""] {
            let t = toy(inert);
            assert_eq!(t.canonical(&point(64, 1, 1, 8), &[shape(32, 8, 64)], &h100()).unwrap(), point(64, 1, 0, 8), "{inert}: packed, SPLIT inert");
            assert_eq!(t.canonical(&point(64, 1, 1, 8), &[d64], &h100()).unwrap(), point(64, 0, 1, 8), "{inert}: nothing packs, PACK inert");
        }
    }

    #[test]
    fn an_inert_expression_that_fails_to_evaluate_is_a_formula_error() {
        let t = toy("ALIGN = \"TILE // (D - D) == 1\"");
        let err = t.canonical(&point(64, 0, 0, 8), &[shape(8, 8, 64)], &h100()).unwrap_err();
        assert!(matches!(&err, TemplateError::Formula { template, name, .. } if template == "toy" && name == "inert.ALIGN"), "{err:?}");
    }
}
