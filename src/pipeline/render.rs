//! Render: a template plus a candidate's knob values becomes standalone CUDA source.
//!
//! Knobs become `#define`s in front of the template text, and local `#include "..."`
//! lines are inlined, so the committed source compiles on its own (NVRTC, nvcc, an
//! export) and its hash identifies exactly what ran. The shared memory the gate will
//! give each launch is defined too (`OPTD_SMEM_BYTES_<ROLE>_D<d>`, the spec's `smem`
//! formula for these knobs at each head dim the template lists), so that a template can
//! `static_assert` its layout against the number the launch really gets
//! (`OPTD_CHECK_SMEM` in common/optd.cuh).

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::spec::assets;
use crate::spec::config::HEAD_DIMS;
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
    smem_defines(template, params, &mut out);
    out.push('\n');
    inline_includes(&template.text, templates_dir, &mut out, 0)?;
    let hash = hex(&Sha256::digest(out.as_bytes()));
    Ok(Rendered { source: out, hash })
}

/// `#define OPTD_SMEM_BYTES_<ROLE>_D<d> <bytes>` per launch role and head dim of the
/// template (its `head_dims`); where the formula has no value per head dim (it reads the
/// shape or the device), a comment saying why instead, so that a template checking that
/// launch fails to compile on the name. A head dim of the project the template does not
/// list gets `OPTD_NOT_A_HEAD_DIM` (common/optd.cuh: -1, which no layout equals), so that
/// `OPTD_SMEM_BYTES(ROLE, D)` can name all four in one expression.
fn smem_defines(template: &Template, params: &Params, out: &mut String) {
    for d in HEAD_DIMS {
        if !template.meta.head_dims.contains(&d) {
            for (role, _) in template.layout_smem(params, d) {
                out.push_str(&format!("#define OPTD_SMEM_BYTES_{}_D{d} {NOT_A_HEAD_DIM}\n", role.to_ascii_uppercase()));
            }
            continue;
        }
        for (role, bytes) in template.layout_smem(params, d) {
            let name = format!("OPTD_SMEM_BYTES_{}_D{d}", role.to_ascii_uppercase());
            match bytes {
                Ok(n) => out.push_str(&format!("#define {name} {n}\n")),
                Err(why) => out.push_str(&format!("// {name} not defined: {why}\n")),
            }
        }
    }
}

/// The value of a shared-memory define at a head dim the template is not written for.
pub const NOT_A_HEAD_DIM: &str = "OPTD_NOT_A_HEAD_DIM";

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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;
    use crate::spec::protocol::Shape;

    fn templates_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kernel-templates")
    }

    /// Every `*.cu` under kernel-templates/ and kernel-templates/testing/.
    fn all_templates() -> Vec<Template> {
        let dir = templates_dir();
        let mut out = Vec::new();
        for sub in ["", "testing"] {
            let mut files: Vec<String> = std::fs::read_dir(dir.join(sub))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "cu"))
                .map(|p| p.strip_prefix(&dir).unwrap().display().to_string())
                .collect();
            files.sort();
            out.extend(files.iter().map(|f| Template::load(&dir, f).unwrap()));
        }
        out
    }

    /// Every combination of the template's knob values.
    fn every_point(t: &Template) -> Vec<Params> {
        product(Params::new(), t.knobs.iter())
    }

    /// About 300 points spread over `all` (all of them when there are fewer). The stride is odd:
    /// most knobs have 2 or 4 values, so an even one would keep the fastest knobs fixed.
    fn sample(all: &[Params]) -> Vec<&Params> {
        let stride = (all.len() / 300).max(1) | 1;
        all.iter().step_by(stride).collect()
    }

    /// `base` with every combination of the values of `knobs` written over it.
    fn product<'a>(base: Params, knobs: impl Iterator<Item = &'a (String, Vec<i64>)>) -> Vec<Params> {
        let mut points = vec![base];
        for (name, values) in knobs {
            points = points
                .into_iter()
                .flat_map(|p| values.iter().map(move |v| {
                    let mut q = p.clone();
                    q.insert(name.clone(), *v);
                    q
                }))
                .collect();
        }
        points
    }

    /// The points that decide a template's shared memory: every combination of the knobs its
    /// smem formulas read (directly or through derived values), the other knobs at their
    /// defaults. Every other point has the same formulas' inputs as one of these, so planning
    /// all ~56k knob combinations (minutes in a debug build) checks nothing more.
    fn smem_points(t: &Template) -> Vec<Params> {
        let smem: Vec<&str> = t.launches.iter().map(|l| l.smem.as_str()).collect();
        let decide = t.knobs_read(&smem);
        product(t.default_params(), t.knobs.iter().filter(|(n, _)| decide.contains(n)))
    }

    use crate::test_fixtures::h100;

    /// The shared-memory lines `render` writes for a point, without the template text: the
    /// checks below cover every knob combination (tens of thousands at wgmma_tma.cu), and
    /// rendering and hashing whole sources for each cost CI minutes for nothing they test.
    fn smem_lines(t: &Template, p: &Params) -> String {
        let mut out = String::new();
        smem_defines(t, p, &mut out);
        out
    }

    /// The `#define OPTD_SMEM_BYTES_*` lines of a rendered source.
    fn smem_defines_of(source: &str) -> BTreeMap<String, u32> {
        source
            .lines()
            .filter_map(|l| l.strip_prefix("#define OPTD_SMEM_BYTES_"))
            .filter(|rest| !rest.ends_with(NOT_A_HEAD_DIM))
            .map(|rest| {
                let (name, value) = rest.split_once(' ').unwrap();
                (format!("OPTD_SMEM_BYTES_{name}"), value.trim().parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn the_smem_defines_are_the_bytes_the_gate_gives_every_launch() {
        let dev = h100();
        let mut checked = 0;
        for t in all_templates() {
            let p = t.default_params();
            assert!(render(&t, &p, DType::Fp16, &templates_dir()).unwrap().source.contains(&smem_lines(&t, &p)), "{}", t.file);
            let points = smem_points(&t);
            // The reduced set yields the define of every point of the full product (a spread
            // sample of it: the whole of wgmma_tma.cu's ~80k points costs CI minutes).
            let reduced: std::collections::BTreeSet<String> = points.iter().map(|p| smem_lines(&t, p)).collect();
            for p in sample(&every_point(&t)) {
                assert!(reduced.contains(&smem_lines(&t, p)), "{} {p:?}: a define no smem point yields", t.file);
            }
            for p in points {
                let defines = smem_defines_of(&smem_lines(&t, &p));
                let dims = &t.meta.head_dims;
                assert_eq!(defines.len(), dims.len() * t.kernel_names(&[64]).len(), "{} {p:?}: {defines:?}", t.file);
                // The gate plans per shape; none of today's formulas may depend on more than D.
                for (s, causal, b, h) in [(1, false, 1, 1), (1000, true, 2, 3), (4097, false, 4, 16), (8192, true, 2, 16)] {
                    for &d in dims {
                        let shape = Shape::mha(b, h, s, d, causal, DType::Fp16);
                        let plan = match t.plan(&p, &shape, &dev) {
                            Ok(plan) => plan,
                            // [[refuse]]: the gate never launches it there; its define is still the layout's.
                            Err(crate::spec::template::TemplateError::Refused { .. }) => continue,
                            Err(e) => panic!("{} {p:?}: {e}", t.file),
                        };
                        for l in plan.launches {
                            let role = l.kernel.strip_prefix("optd_").unwrap().rsplit_once("_d").unwrap().0.to_ascii_uppercase();
                            let name = format!("OPTD_SMEM_BYTES_{role}_D{d}");
                            assert_eq!(defines.get(&name), Some(&l.dyn_smem), "{} {p:?} {}: {name}", t.file, shape.key());
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 500, "{checked}");
    }

    #[test]
    fn a_smem_formula_that_reads_the_shape_gets_a_comment_instead_of_a_define() {
        let text = "/* optimizerd:spec\n[template]\nname = \"t\"\n[knobs]\nW = [2]\n[derived]\nrows = \"cdiv(S, 64)\"\n\
                    [[launch]]\nkernel = \"fwd\"\ngrid = [\"rows\", \"1\", \"1\"]\nblock = [\"32\", \"1\", \"1\"]\nsmem = \"rows * W * D\"\n*/\n";
        let t = Template::parse("t.cu", text.to_string()).unwrap();
        let p: Params = [("W".to_string(), 2)].into();
        let src = render(&t, &p, DType::Fp16, &templates_dir()).unwrap().source;
        assert!(smem_defines_of(&src).is_empty(), "{src}");
        for d in [64, 128] {
            let line = src.lines().find(|l| l.starts_with(&format!("// OPTD_SMEM_BYTES_FWD_D{d} not defined: "))).unwrap_or_else(|| panic!("{src}"));
            assert!(line.contains("rows * W * D"), "{line}");
        }
        // A formula of the knobs and D alone is defined per head dim.
        let t = Template::parse("t.cu", text.replace("rows * W * D", "W * D + 16")).unwrap();
        let src = render(&t, &p, DType::Fp16, &templates_dir()).unwrap().source;
        assert_eq!(smem_defines_of(&src), [("OPTD_SMEM_BYTES_FWD_D64".into(), 144), ("OPTD_SMEM_BYTES_FWD_D128".into(), 272)].into());
        // One define per head dim the template lists, and none for the others.
        let t = Template::parse("t.cu", text.replace("rows * W * D", "W * D + 16").replace("name = \"t\"\n", "name = \"t\"\nhead_dims = [96, 256]\n")).unwrap();
        let src = render(&t, &p, DType::Fp16, &templates_dir()).unwrap().source;
        assert_eq!(smem_defines_of(&src), [("OPTD_SMEM_BYTES_FWD_D96".into(), 208), ("OPTD_SMEM_BYTES_FWD_D256".into(), 528)].into());
        for d in [64, 128] {
            assert!(src.contains(&format!("#define OPTD_SMEM_BYTES_FWD_D{d} {NOT_A_HEAD_DIM}\n")), "{src}");
        }
    }

    /// A template whose layout and the gate's number disagree does not compile, and NVRTC's
    /// message names both: the layout's bytes are the formula's, moved 16 bytes off here.
    #[test]
    fn a_wrong_smem_define_fails_to_compile_naming_both_numbers() {
        let tc = crate::nvrtc::locate().unwrap_or_else(|e| panic!("NVRTC is required for this test (run scripts/setup.sh): {e}"));
        let checked: Vec<Template> = all_templates().into_iter().filter(|t| t.text.contains("OPTD_CHECK_SMEM(FWD")).collect();
        let names: Vec<&str> = checked.iter().map(|t| t.file.as_str()).collect();
        for must in ["kv_split.cu", "memory.cu", "mma_fa2.cu", "wgmma_tma.cu", "wmma.cu"] {
            assert!(names.contains(&must), "{must} does not check its shared memory: {names:?}");
        }
        for t in &checked {
            let p = t.default_params();
            let src = render(t, &p, DType::Bf16, &templates_dir()).unwrap().source;
            let mut wrong = src.clone();
            let mut expect = Vec::new();
            for &d in &t.meta.head_dims {
                let line = format!("#define OPTD_SMEM_BYTES_FWD_D{d} ");
                let n: u32 = src.lines().find_map(|l| l.strip_prefix(&line)).unwrap().parse().unwrap();
                wrong = wrong.replace(&format!("{line}{n}\n"), &format!("{line}{}\n", n + 16));
                expect.push(format!("kLayoutBytes={n}LL, kFormulaBytes={}LL", n + 16));
            }
            let arch = if t.meta.arch_specific { format!("sm_{}a", t.meta.min_cc) } else { "sm_90".to_string() };
            match crate::nvrtc::compile(&tc, &wrong, "candidate.cu", &arch, &[]) {
                Ok(_) => panic!("{}: compiled with a wrong shared-memory size", t.file),
                Err(e) => {
                    let log = e.log();
                    assert!(log.contains("OPTD_CHECK_SMEM"), "{}: {log}", t.file);
                    for x in &expect {
                        assert!(log.contains(x.as_str()), "{}: no `{x}` in {log}", t.file);
                    }
                }
            }
        }
    }

    /// scripts/nvrtc_compile_check.py (the GPU checker's renderer) writes the same defines,
    /// point by point: every point that decides shared memory plus a spread sample of the
    /// rest, and it enumerates as many knob combinations as Rust does.
    #[test]
    fn the_python_twin_writes_the_same_smem_defines() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let templates = all_templates();
        let asked: BTreeMap<String, Vec<Params>> = templates
            .iter()
            .map(|t| {
                let all = every_point(t);
                let mut points = smem_points(t);
                points.extend(sample(&all).into_iter().cloned());
                (t.file.clone(), points)
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("points.json");
        std::fs::write(&input, serde_json::to_vec(&asked).unwrap()).unwrap();
        let out = std::process::Command::new("python3")
            .current_dir(root.join("scripts"))
            .args([
                "-c",
                "import json, sys, nvrtc_compile_check as n\n\
                 asked = json.load(open(sys.argv[1]))\n\
                 print(json.dumps({t.rel: {'combos': len(t.knob_combos()), 'defines': [n.smem_defines(t, k) for k in asked[t.rel]]} for t in n.load_templates()}))",
            ])
            .arg(&input)
            .output()
            .expect("python3");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        #[derive(serde::Deserialize)]
        struct Answer {
            combos: usize,
            defines: Vec<String>,
        }
        let py: BTreeMap<String, Answer> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(py.len(), templates.len());
        for t in &templates {
            let want = &py[&t.file];
            assert_eq!(every_point(t).len(), want.combos, "{}", t.file);
            let points = &asked[&t.file];
            assert_eq!(points.len(), want.defines.len(), "{}", t.file);
            for (p, python) in points.iter().zip(&want.defines) {
                assert_eq!(&smem_lines(t, p), python, "{} {p:?}", t.file);
            }
        }
    }
}
