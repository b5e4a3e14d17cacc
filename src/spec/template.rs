//! Kernel templates: loading a `.cu` file, parsing its spec comment, and evaluating
//! the formulas it declares (derived values, launch grid, block, shared memory).
//!
//! A template is plain CUDA whose knobs are macros. Its machine-read spec sits in a
//! `/* optimizerd:spec ... */` comment (TOML), so the formulas a human reads in the
//! header are the ones the daemon evaluates. Expressions are minijinja expressions
//! over the knobs, the shape (B, H, S, D, CAUSAL, ELEM_BYTES) and the device
//! (SMS, SMEM_OPTIN, CC), with `cdiv`, `min` and `max`.
//!
//! A template made for one regime declares `max_sq = N` under `[template]` (decode.cu:
//! 16): the gate refuses shapes with more query rows, with the reason, the plan's stage
//! of such a template runs on the shapes it admits only (skipped, with the reason, when
//! there are none), and the open phase offers it only to the classes it admits.
//!
//! Hopper templates may also declare
//! - `arch_specific = true` under `[template]`: compiled for `sm_<cc>a` (e.g. `sm_90a`,
//!   for wgmma and setmaxnreg) instead of `sm_<cc>`. Such a cubin runs only on exactly
//!   that compute capability, so the template is usable only when the device's cc
//!   equals its `min_cc` ([`Meta::target_arch`]).
//! - `[[tensor_map]]` entries (`tensor` = q|k|v|o, `box_rows` = a formula, optional
//!   `box_panels` = a formula (panels of D per box; default all), `swizzle` =
//!   32|64|128 bytes): TMA tensor maps the worker encodes against the tensor's device
//!   pointer and appends, in declaration order, after the 16 ABI parameters of every
//!   launch (`const __grid_constant__ optd_tensor_map tm_x`, 128 bytes by value). The
//!   geometry is a fixed convention over the tensor of 2-byte elements as the launch's
//!   strides lay it out: with swizzle W and P = W/2 elements per panel, rank 5, dims
//!   {P, rows, D/P, heads, B} (innermost first), byte strides {row, P*2, head, batch}, box
//!   {P, box_rows, box_panels, 1, 1}; see
//!   [`crate::spec::protocol::TensorMap::geometry`], the one place it is computed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::spec::assets;
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
}

impl Meta {
    /// Whether the template is for `shape` (its `max_sq`); Err: why not, in words.
    pub fn admits(&self, shape: &Shape) -> Result<(), String> {
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
    /// Bytes: 32, 64 or 128.
    pub swizzle: u32,
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
    /// TMA tensor maps, in kernel-parameter order (after the 16 ABI parameters).
    pub tensor_maps: Vec<TensorMapSpec>,
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
        if spec.launch.is_empty() {
            return Err(err("declares no [[launch]]".into()));
        }
        for (i, m) in spec.tensor_map.iter().enumerate() {
            if !matches!(m.swizzle, 32 | 64 | 128) {
                return Err(err(format!(
                    "tensor_map[{i}] ({}): swizzle = {} is not allowed (allowed: 32, 64, 128 bytes)",
                    m.tensor.as_str(),
                    m.swizzle
                )));
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
        if spec.template.arch_specific && spec.template.min_cc == 0 {
            return Err(err(
                "arch_specific = true needs min_cc: the one compute capability its sm_<cc>a cubin runs on (e.g. min_cc = 90 for sm_90a)".into(),
            ));
        }
        let t = Template {
            meta: spec.template,
            file: file.to_string(),
            text,
            knobs,
            derived,
            launches: spec.launch,
            tensor_maps: spec.tensor_map,
        };
        Ok(t)
    }

    pub fn name(&self) -> &str {
        &self.meta.name
    }

    /// The first allowed value of every knob: the template's own default candidate.
    pub fn default_params(&self) -> Params {
        self.knobs.iter().map(|(k, v)| (k.clone(), v[0])).collect()
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
        let mut vars = shape_vars(shape, device);
        vars.extend(params.iter().map(|(k, v)| (k.clone(), *v)));
        let env = formula_env();
        for (name, expr) in &self.derived {
            let v = self.eval_int(&env, name, expr, &vars)?;
            vars.insert(name.clone(), v);
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
            tensor_maps.push(TensorMap { tensor: m.tensor, box_rows, swizzle: m.swizzle, box_panels });
        }
        let splits = vars.get("splits").copied().unwrap_or(1);
        let n_splits = u32::try_from(splits)
            .ok()
            .filter(|&s| s >= 1)
            .ok_or_else(|| self.formula_err("splits", "", format!("gave {splits}; must be >= 1")))?;
        Ok(ShapePlan { shape: *shape, n_splits, launches, tensor_maps })
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
        compiled.eval(minijinja::Value::from_serialize(vars)).map_err(|e| {
            let mut message = e.to_string();
            if uses_v1_names(expr) {
                message.push_str(" (kernel ABI v2 names the shape HQ, HKV, G, SQ and SK: H became HQ or HKV, S became SQ or SK)");
            }
            self.formula_err(name, expr, message)
        })
    }

    fn eval_int(&self, env: &minijinja::Environment<'static>, name: &str, expr: &str, vars: &BTreeMap<String, i64>) -> Result<i64, TemplateError> {
        let v = self.eval(env, name, expr, vars)?;
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
        if v.is_undefined() {
            return Err(self.formula_err(name, expr, "uses an undefined name".into()));
        }
        Ok(v.is_true())
    }
}

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
    vars.insert("BSHD".into(), (shape.layout == crate::spec::protocol::Layout::Bshd) as i64);
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

/// Evaluate one integer expression outside a template (e.g. a stage's `min_ctas`).
pub fn eval_int_expr(expr: &str, vars: &BTreeMap<String, i64>) -> Result<i64, String> {
    let env = formula_env();
    let v = env
        .compile_expression(expr)
        .and_then(|e| e.eval(minijinja::Value::from_serialize(vars)))
        .map_err(|e| e.to_string())?;
    i64::try_from(v.clone()).map_err(|_| format!("gave {v}, not an integer"))
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
