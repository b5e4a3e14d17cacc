//! Every template variant compiles with NVRTC for sm_80, sm_89 and sm_90, in both
//! builds (timed, and the CTA-counting check build) and both element types, and
//! exports the kernels its spec launches. A variant is a combination of the knobs the
//! code uses (knobs only the launch formulas read change no code). Needs NVRTC:
//! `bash scripts/setup.sh`.

mod common;

use std::sync::Mutex;

use optimizerd::nvrtc;
use optimizerd::protocol::DType;
use optimizerd::render::render;
use optimizerd::search::{Search, SearchKind};
use optimizerd::template::Template;

const ARCHS: [&str; 3] = ["sm_80", "sm_89", "sm_90"];
const TEMPLATES: [&str; 7] = ["baseline.cu", "kv_split.cu", "memory.cu", "mma_fa2.cu", "wmma.cu", "testing/oob_write.cu", "testing/infinite_loop.cu"];

#[test]
fn every_template_variant_compiles_for_every_arch() {
    let tc = nvrtc::locate().unwrap_or_else(|e| panic!("NVRTC is required for this test (run scripts/setup.sh): {e}"));
    let dir = common::repo_root().join("kernel-templates");
    let mut jobs = Vec::new();
    for file in TEMPLATES {
        let t = Template::load(&dir, file).unwrap();
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
                for arch in ARCHS {
                    // The check build differs by one define; compile it for the first variant of each template and arch.
                    jobs.push((t.clone(), p.clone(), dtype, arch, src.source.clone(), false));
                    if first {
                        jobs.push((t.clone(), p.clone(), dtype, arch, src.source.clone(), true));
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
                match nvrtc::compile(&tc, &source, "candidate.cu", arch, &defines) {
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
