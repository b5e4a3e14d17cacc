//! Every template variant compiles with NVRTC for sm_80, sm_89 and sm_90 (those at or
//! above its `min_cc`), in both builds (timed, and the CTA-counting check build) and
//! both element types, and exports the kernels its spec launches. An arch-specific
//! template (`arch_specific = true`, e.g. wgmma_tma.cu) is compiled only for its own
//! target, `sm_<min_cc>a`, the one the daemon uses. A variant is a combination of the
//! knobs the code uses (knobs only the launch formulas read change no code). Every
//! `*.cu` under kernel-templates/ and kernel-templates/testing/ is compiled, so a new
//! template is covered as soon as it exists. Needs NVRTC: `bash scripts/setup.sh`.

mod common;

use std::path::Path;
use std::sync::Mutex;

use optimizerd::nvrtc;
use optimizerd::spec::protocol::DType;
use optimizerd::pipeline::render::render;
use optimizerd::strategy::search::{Search, SearchKind};
use optimizerd::spec::template::Template;

const ARCHS: [(&str, u32); 3] = [("sm_80", 80), ("sm_89", 89), ("sm_90", 90)];

/// Template files relative to kernel-templates/, sorted: `*.cu` and `testing/*.cu`.
fn template_files(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for sub in ["", "testing"] {
        for e in std::fs::read_dir(dir.join(sub)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(sub).display())) {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "cu") {
                files.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    files.sort();
    files
}

/// The NVRTC targets a template is compiled for: its arch-specific target only, or every
/// listed arch it supports.
fn targets(t: &Template) -> Vec<String> {
    if t.meta.arch_specific {
        return vec![format!("sm_{}a", t.meta.min_cc)];
    }
    ARCHS.iter().filter(|(_, cc)| *cc >= t.meta.min_cc).map(|(a, _)| a.to_string()).collect()
}

#[test]
fn every_template_variant_compiles_for_every_arch() {
    let tc = nvrtc::locate().unwrap_or_else(|e| {
        panic!("NVRTC is required for this test (CI={:?}; run scripts/setup.sh): {e}", std::env::var("CI").ok())
    });
    let dir = common::repo_root().join("kernel-templates");
    let files = template_files(&dir);
    for known in ["baseline.cu", "kv_split.cu", "mma_fa2.cu", "testing/tensor_map_probe.cu"] {
        assert!(files.iter().any(|f| f == known), "{known} not found among {files:?}");
    }
    let mut jobs = Vec::new();
    for file in &files {
        let t = Template::load(&dir, file).unwrap_or_else(|e| panic!("{e}"));
        let archs = targets(&t);
        assert!(!archs.is_empty(), "{file}: min_cc {} leaves no arch to compile for", t.meta.min_cc);
        // Knobs the CUDA code never mentions (only the launch formulas use them, like
        // MAX_SPLITS) give identical code: compile one variant per code-relevant combination.
        let code = strip_comments(&t.text);
        let launch_only: Vec<String> = t.knobs.iter().map(|(k, _)| k.clone()).filter(|k| !code.contains(k.as_str())).collect();
        let mut compiled_code: std::collections::BTreeSet<String> = Default::default();
        let mut s = Search::new(SearchKind::Exhaustive, t.knobs.clone(), t.default_params(), 100_000);
        let mut first = true;
        while let Some(p) = s.next() {
            let relevant: Vec<(&String, &i64)> = p.iter().filter(|(k, _)| !launch_only.contains(k)).collect();
            if !compiled_code.insert(format!("{relevant:?}")) {
                continue;
            }
            for dtype in [DType::Fp16, DType::Bf16] {
                let src = render(&t, &p, dtype, &dir).unwrap();
                for arch in &archs {
                    // The check build differs by one define; compile it for the first variant of each template and arch.
                    jobs.push((t.clone(), p.clone(), dtype, arch.clone(), src.source.clone(), false));
                    if first {
                        jobs.push((t.clone(), p.clone(), dtype, arch.clone(), src.source.clone(), true));
                    }
                }
            }
            first = false;
        }
    }
    let total = jobs.len();
    let jobs = Mutex::new(jobs);
    let failures = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let Some((t, p, dtype, arch, source, count)) = jobs.lock().unwrap().pop() else { break };
                let defines: Vec<(&str, String)> = if count { vec![("OPTD_COUNT_CTAS", "1".into())] } else { vec![] };
                let what = format!("{} {p:?} {} {arch}{}", t.file, dtype.as_str(), if count { " (check build)" } else { "" });
                match nvrtc::compile(&tc, &source, "candidate.cu", &arch, &defines) {
                    Ok(c) => {
                        assert!(c.cubin.starts_with(b"\x7fELF"), "{what}: not a cubin");
                        for k in t.kernel_names(&[64, 128]) {
                            if !c.cubin.windows(k.len()).any(|w| w == k.as_bytes()) {
                                failures.lock().unwrap().push(format!("{what}: kernel {k} not exported"));
                            }
                        }
                    }
                    Err(e) => failures.lock().unwrap().push(format!("{what}: {e}")),
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{} of {total} compiles failed:\n{}", failures.len(), failures.join("\n"));
    eprintln!("{total} template variants compiled");
}

/// An arch-specific template really needs its `a` target: the probe template refuses
/// plain sm_90 (so the test above compiling it for sm_90a proves the target is used).
#[test]
fn arch_specific_templates_compile_only_for_their_arch_specific_target() {
    let tc = nvrtc::locate().unwrap_or_else(|e| {
        panic!("NVRTC is required for this test (CI={:?}; run scripts/setup.sh): {e}", std::env::var("CI").ok())
    });
    let dir = common::repo_root().join("kernel-templates");
    let t = Template::load(&dir, "testing/tensor_map_probe.cu").unwrap();
    assert_eq!(targets(&t), vec!["sm_90a".to_string()]);
    let src = render(&t, &t.default_params(), DType::Bf16, &dir).unwrap();
    match nvrtc::compile(&tc, &src.source, "candidate.cu", "sm_90", &[]) {
        Err(nvrtc::CompileFailure::Rejected { log }) => assert!(log.contains("sm_90a"), "{log}"),
        other => panic!("plain sm_90 must be refused: {:?}", other.map(|c| c.cubin.len())),
    }
    let c = nvrtc::compile(&tc, &src.source, "candidate.cu", "sm_90a", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.cubin.starts_with(b"\x7fELF"));
    // Templates without the flag keep the plain targets their min_cc allows.
    let base = Template::load(&dir, "baseline.cu").unwrap();
    assert_eq!(targets(&base), vec!["sm_80", "sm_89", "sm_90"]);
}

/// The CUDA text without /* */ and // comments (the prose header names every knob).
fn strip_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = rest[i + 2..].split_once("*/").map_or("", |(_, after)| after);
    }
    out.push_str(rest);
    out.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}
