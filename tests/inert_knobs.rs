//! Inert knobs through the run loop (scripted worker, real SQLite and git): a template's
//! `[inert]` knob changes nothing on the shapes where its expression holds, so the plan's
//! searches and the open phase measure each distinct kernel once, in its canonical form
//! (the knob at its first declared value), and never spend a candidate on the other values.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::Project;
use optimizerd::engine::RunEnd;
use optimizerd::spec::protocol::{DType, Layout, Shape};
use optimizerd::spec::template::{Params, Template};
use optimizerd::storage::ledger::{IterationRecord, Ledger};
use serde_json::json;

/// baseline.cu as template `hinted`, with WARPS_PER_CTA 4, 8 or 16 and a knob HINT (0, 1)
/// that the kernel ignores, declared inert where `inert` holds.
fn hinted_template(inert: &str) -> String {
    let text = std::fs::read_to_string(common::repo_root().join("kernel-templates/baseline.cu")).unwrap();
    let replaced = text
        .replace("name = \"baseline\"", "name = \"hinted\"")
        .replace("WARPS_PER_CTA = [4]\n", "WARPS_PER_CTA = [4, 8, 16]\nHINT = [0, 1]\n")
        .replace("[[launch]]", &format!("[inert]\nHINT = \"{inert}\"\n\n[[launch]]"));
    assert!(replaced.contains("name = \"hinted\"") && replaced.contains("HINT = [0, 1]") && replaced.contains("[inert]"), "baseline.cu's spec moved");
    replaced
}

/// A project whose templates folder is the repository's plus `hinted.cu`.
fn project(plan: &str, inert: &str) -> Project {
    let p = Project::new(plan, json!([{ "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } }]), json!({ "ok": { "us": 80.0 } }));
    let templates = p.path().join("templates");
    copy_dir(&common::repo_root().join("kernel-templates"), &templates);
    std::fs::write(templates.join("hinted.cu"), hinted_template(inert)).unwrap();
    let config = std::fs::read_to_string(p.path().join("agent.toml")).unwrap();
    let config: Vec<String> =
        config.lines().map(|l| if l.starts_with("templates_dir") { format!("templates_dir = \"{}\"", templates.display()) } else { l.to_string() }).collect();
    std::fs::write(p.path().join("agent.toml"), config.join("\n")).unwrap();
    p
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let e = entry.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// (stage, WARPS_PER_CTA, HINT) of every `hinted` iteration, in order.
fn hinted(its: &[IterationRecord]) -> Vec<(String, i64, i64)> {
    its.iter()
        .filter(|i| i.template == "hinted")
        .map(|i| {
            let p: Params = serde_json::from_str(&i.params_json).unwrap();
            (i.stage.clone(), p["WARPS_PER_CTA"], p["HINT"])
        })
        .collect()
}

/// Every iteration of one stage measured a different point.
fn assert_distinct_per_stage(its: &[IterationRecord]) {
    let mut seen = BTreeSet::new();
    for it in its {
        assert!(seen.insert((it.stage.clone(), it.template.clone(), it.params_json.clone())), "{} measured {} {} twice", it.stage, it.template, it.params_json);
    }
}

/// Two exhaustive WARPS_PER_CTA points, then an evolve pass from the best one.
const PLAN_TUNING: &str = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "hinted"
template = "hinted.cu"
search = "exhaustive"
space = { WARPS_PER_CTA = [4, 8] }
max_candidates = 2

[[stage]]
name = "hinted-tuning"
template = "hinted.cu"
search = "evolve"
start_from_best = true
max_candidates = 6

[open_phase]
enabled = false
"#;

/// HINT 0 and 1 at WARPS_PER_CTA 4, then the open phase over the whole space.
const PLAN_OPEN: &str = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "hinted"
template = "hinted.cu"
search = "exhaustive"
space = { WARPS_PER_CTA = [4] }

[open_phase]
patience = 1000
"#;

/// HINT is inert on both workload shapes (SQ 128 and 512): the exhaustive stage's two
/// candidates are two WARPS_PER_CTA values (not HINT 0 and 1 of the first), and the tuning
/// stage after it has one kernel left to try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_knob_inert_on_every_shape_costs_no_candidate_in_the_plan_s_searches() {
    let p = project(PLAN_TUNING, "SQ <= 512");
    assert_eq!(p.run("inert", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let its = Ledger::open(&p.db()).await.unwrap().iterations("inert").await.unwrap();
    assert_distinct_per_stage(&its);
    let got = hinted(&its);
    let expect: Vec<(String, i64, i64)> = [("hinted", 4, 0), ("hinted", 8, 0), ("hinted-tuning", 16, 0)].iter().map(|(s, w, h)| (s.to_string(), *w, *h)).collect();
    assert_eq!(got, expect, "HINT recorded at its first value only, each kernel once");
}

/// HINT is inert at D 64 only: the plan's stage (both shapes) measures both HINT values;
/// in the open phase the D 64 class measures each WARPS_PER_CTA once with HINT 0 (the plan's
/// HINT 1 point is its HINT 0 kernel there), and the D 128 class searches HINT too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_phase_searches_a_knob_only_in_the_classes_where_it_matters() {
    let p = project(PLAN_OPEN, "D == 64");
    let end = p.run("classes", Duration::from_secs(600)).await;
    let RunEnd::Finished(msg) = &end else { panic!("{end:?}") };
    assert!(msg.contains("latency-d64: every point of every template measured") && msg.contains("latency-d128-causal: every point"), "{msg}");
    let its = Ledger::open(&p.db()).await.unwrap().iterations("classes").await.unwrap();
    assert_distinct_per_stage(&its);
    let got = hinted(&its);
    let of = |stage: &str| -> BTreeSet<(i64, i64)> { got.iter().filter(|(s, _, _)| s == stage).map(|(_, w, h)| (*w, *h)).collect() };
    assert_eq!(of("hinted"), BTreeSet::from([(4, 0), (4, 1)]), "HINT matters on the D 128 shape");
    assert_eq!(of("open/latency-d64"), BTreeSet::from([(8, 0), (16, 0)]), "{got:?}");
    assert_eq!(of("open/latency-d128-causal"), BTreeSet::from([(8, 0), (8, 1), (16, 0), (16, 1)]), "{got:?}");
    assert_eq!(got.len(), 2 + 2 + 4, "{got:?}");
}

/// `optimizerd ARGS` in the project, with the scripted worker (and a failpoint, if any).
fn cli(p: &Project, args: &[&str], failpoint: Option<&str>) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_optimizerd"));
    cmd.current_dir(p.path()).args(args).arg("--worker-script").arg(p.path().join("script.json"));
    cmd.env_remove(optimizerd::failpoint::ENV).env_remove("RUST_BACKTRACE");
    if let Some(f) = failpoint {
        cmd.env(optimizerd::failpoint::ENV, f);
    }
    cmd.stdin(std::process::Stdio::null()).output().expect("run optimizerd")
}

/// A run killed in the tuning stage, and one killed in the open phase, resume and replay
/// their searches' canonical points (the ledger holds those) to the same end as a run that
/// was never killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_replays_the_canonical_points_it_recorded() {
    let finished = |its: Vec<IterationRecord>| -> Vec<(String, String)> {
        its.into_iter().filter(|i| i.verdict.is_final() && i.stage != "sustained-rerank").map(|i| (i.stage, i.params_json)).collect()
    };
    for (plan, inert, kill) in [(PLAN_TUNING, "SQ <= 512", "candidate-committed@4"), (PLAN_OPEN, "D == 64", "candidate-committed@6")] {
        let reference = project(plan, inert);
        let ran = cli(&reference, &["start", "--budget", "10m", "--foreground", "--run-id", "ref"], None);
        assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
        let all = finished(Ledger::open(&reference.db()).await.unwrap().iterations("ref").await.unwrap());

        let p = project(plan, inert);
        let o = cli(&p, &["start", "--budget", "10m", "--foreground", "--run-id", "r"], Some(kill));
        assert!(!o.status.success(), "killed at {kill}: {}", String::from_utf8_lossy(&o.stderr));
        let before = finished(Ledger::open(&p.db()).await.unwrap().iterations("r").await.unwrap());
        assert!(!before.is_empty() && before.len() < all.len(), "killed inside the run at {kill}: {before:?} of {all:?}");
        let o = cli(&p, &["resume", "--foreground", "r"], None);
        assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert_eq!(finished(Ledger::open(&p.db()).await.unwrap().iterations("r").await.unwrap()), all, "{kill}");
    }
}

/// Every shipped template: kernel-templates/*.cu and testing/*.cu.
fn shipped_templates() -> Vec<Template> {
    let dir = common::repo_root().join("kernel-templates");
    let mut files: Vec<String> = Vec::new();
    for sub in ["", "testing/"] {
        for e in std::fs::read_dir(dir.join(sub)).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".cu") {
                files.push(format!("{sub}{name}"));
            }
        }
    }
    files.sort();
    files.iter().map(|f| Template::load(&dir, f).unwrap_or_else(|e| panic!("{e}"))).collect()
}

fn shape(hq: u32, hkv: u32, sq: u32, d: u32, causal: bool) -> Shape {
    Shape { b: 2, hq, hkv, sq, sk: sq.max(1024), d, causal, window: None, dtype: DType::Bf16, layout: Layout::Bhsd }
}

/// A declaration may only reset a knob where the point's launch plan (grid, block, shared
/// memory, splits, tensor maps) stays what the first value's is: an inert knob that changed
/// the plan would not be inert. Checked for every shipped template, every declared knob and
/// value, at two points (every knob first, every knob last), on MHA, GQA (G 2, 3, 4, 8, 16,
/// 32), both head dims, causal or not, prefill and decode; and wgmma_tma's PACK_GQA is
/// declared exactly: inert wherever the plan does not change.
#[test]
fn an_inert_declaration_never_resets_a_knob_that_changes_the_launch_plan() {
    let dev = common::h100();
    let mut shapes = Vec::new();
    for d in [64, 128] {
        for causal in [false, true] {
            for (hq, hkv) in [(16, 16), (16, 8), (24, 8), (32, 8), (64, 8), (32, 2), (32, 1)] {
                shapes.push(shape(hq, hkv, 2048, d, causal));
            }
        }
        shapes.push(shape(32, 8, 1, d, true));
    }
    let templates = shipped_templates();
    assert!(templates.iter().any(|t| t.name() == "wgmma-tma" && t.inert.iter().any(|(k, _)| k == "PACK_GQA")), "wgmma_tma.cu declares PACK_GQA inert");
    for t in templates.iter().filter(|t| !t.inert.is_empty()) {
        let first = t.default_params();
        let last: Params = t.knobs.iter().map(|(k, v)| (k.clone(), *v.last().unwrap())).collect();
        for (knob, expr) in &t.inert {
            let values = &t.knobs.iter().find(|(k, _)| k == knob).unwrap().1;
            let mut reset = 0;
            for base in [&first, &last] {
                for v in values {
                    let mut p = base.clone();
                    p.insert(knob.clone(), *v);
                    for s in &shapes {
                        let c = t.canonical(&p, std::slice::from_ref(s), &dev).unwrap_or_else(|e| panic!("{e}"));
                        let declared = |k: &str| t.inert.iter().any(|(n, _)| n == k);
                        let first_of = |k: &str| t.knobs.iter().find(|(n, _)| n == k).unwrap().1[0];
                        assert!(c.iter().all(|(k, cv)| p[k] == *cv || declared(k) && *cv == first_of(k)), "{}: only inert knobs go to their first value: {p:?} -> {c:?}", t.name());
                        let same_plan = format!("{:?}", t.plan(&p, s, &dev)) == format!("{:?}", t.plan(&c, s, &dev));
                        assert!(c == p || same_plan, "{} resets {p:?} to {c:?} on {} but the plan changes", t.name(), s.key());
                        let differs = c[knob] != p[knob];
                        reset += usize::from(differs);
                        if t.name() == "wgmma-tma" && knob == "PACK_GQA" && *v == 1 {
                            let mut off = p.clone();
                            off.insert(knob.clone(), 0);
                            let unchanged = format!("{:?}", t.plan(&p, s, &dev)) == format!("{:?}", t.plan(&off, s, &dev));
                            assert_eq!(differs, unchanged, "PACK_GQA 1 on {}: inert exactly where it packs nothing", s.key());
                        }
                    }
                }
            }
            assert!(reset > 0, "{} `{knob} = \"{expr}\"` holds on none of the shapes", t.name());
        }
    }
}
