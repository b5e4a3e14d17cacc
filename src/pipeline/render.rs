//! Render: a template plus a candidate's knob values becomes standalone CUDA source.
//!
//! Knobs become `#define`s in front of the template text, and local `#include "..."`
//! lines are inlined, so the committed source compiles on its own (NVRTC, nvcc, an
//! export) and its hash identifies exactly what ran.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::spec::assets;
use crate::spec::protocol::DType;
use crate::spec::template::{Params, Template, TemplateError};

/// One candidate's rendered source and identity.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub source: String,
    /// sha256 of `source`, hex.
    pub hash: String,
}

pub fn render(template: &Template, params: &Params, dtype: DType, templates_dir: &Path) -> Result<Rendered, TemplateError> {
    template.validate_params(params).map_err(|message| TemplateError::Spec { path: template.file.clone().into(), message })?;
    let mut out = String::new();
    out.push_str(&format!(
        "// optimizerd candidate: template `{}` ({}), dtype {}\n// params: {}\n",
        template.name(),
        template.file,
        dtype.as_str(),
        serde_json::to_string(params).unwrap_or_default()
    ));
    out.push_str(&format!("#define OPTD_BF16 {}\n", (dtype == DType::Bf16) as i32));
    for (name, value) in params {
        out.push_str(&format!("#define {name} {value}\n"));
    }
    out.push('\n');
    inline_includes(&template.text, templates_dir, &mut out, 0)?;
    let hash = hex(&Sha256::digest(out.as_bytes()));
    Ok(Rendered { source: out, hash })
}

fn inline_includes(text: &str, dir: &Path, out: &mut String, depth: usize) -> Result<(), TemplateError> {
    for line in text.lines() {
        match local_include(line) {
            Some(file) if depth < 4 => {
                out.push_str(&format!("// ---- begin {file} ----\n"));
                let inner = assets::read(dir, file)?;
                inline_includes(&inner, dir, out, depth + 1)?;
                out.push_str(&format!("// ---- end {file} ----\n"));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    Ok(())
}

/// `#include "x.cuh"` -> `x.cuh`; system includes (`<...>`) are left to NVRTC.
fn local_include(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix('#')?.trim_start().strip_prefix("include")?.trim();
    rest.strip_prefix('"')?.strip_suffix('"')
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
