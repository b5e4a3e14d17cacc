//! Template variants compile with NVRTC for sm_80, sm_89 and sm_90 (those at or above its
//! `min_cc`), in both builds (timed, and the CTA-counting check build) and both element
//! types, and export the kernels their spec launches: the default variant for every arch
//! and type, every other variant for one of them, so that each knob value compiles for
//! each arch and in each type (`target_cover`). An arch-specific template
//! (`arch_specific = true`, e.g. wgmma_tma.cu) is compiled only for its own target,
//! `sm_<min_cc>a`, the one the daemon uses. A variant is a combination of the knobs the
//! code uses (knobs only the launch formulas read change no code); each template compiles
//! a covering set of them: its default, then greedily the variants that cover the most
//! value pairs not yet covered, until every pair of values of every two code knobs has
//! compiled together. (The full products grew past 2,000 compiles, most of CI's time; a
//! knob interaction that breaks a build is a two-knob one in every case met so far.)
//! Every `*.cu` under kernel-templates/ and kernel-templates/testing/ is compiled, so a
//! new template is covered as soon as it exists. Needs NVRTC: `bash scripts/setup.sh`.

mod common;

use std::path::Path;
use std::sync::Mutex;

use optimizerd::nvrtc;
use optimizerd::spec::config::HEAD_DIMS;
use optimizerd::spec::protocol::DType;
use optimizerd::pipeline::render::render;
use optimizerd::strategy::search::{Search, SearchKind};
use optimizerd::spec::template::{Params, Template};

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
        let mut distinct = Vec::new();
        while let Some(p) = s.next() {
            let relevant: Vec<(&String, &i64)> = p.iter().filter(|(k, _)| !launch_only.contains(k)).collect();
            if compiled_code.insert(format!("{relevant:?}")) {
                distinct.push(p);
            }
        }
        let code_knobs: Vec<String> = t.knobs.iter().map(|(k, _)| k.clone()).filter(|k| !launch_only.contains(k)).collect();
        // The default variant builds every head dim at once (as a run with all of them does);
        // every variant of the cover builds one head dim, chosen so that every knob value also
        // compiles at every head dim (`head_dim_cover`): a build of one head dim's kernels is a
        // third to a quarter of a build of all of them.
        let cover = pairwise_cover(&t.default_params(), distinct, &code_knobs);
        let mut builds: Vec<(Params, Vec<u32>)> = vec![(cover[0].clone(), t.meta.head_dims.clone())];
        builds.extend(head_dim_cover(&cover, &code_knobs, &t.meta.head_dims).into_iter().map(|(p, d)| (p, vec![d])));
        // Each build in one element type for one arch, but the first (every target); see target_cover.
        let first_targets = TYPES.len() * archs.len();
        for (n, (p, dims, dtype, arch)) in target_cover(&builds, &code_knobs, &TYPES, &archs).into_iter().enumerate() {
            let src = render(&t, &p, dtype, &dir).unwrap();
            jobs.push((t.clone(), p.clone(), dims.clone(), dtype, arch.clone(), src.source.clone(), false));
            // The check build differs by one define; compile it for the first variant of each template, at every target.
            if n < first_targets {
                jobs.push((t.clone(), p, dims, dtype, arch, src.source, true));
            }
        }
    }
    let total = jobs.len();
    let jobs = Mutex::new(jobs);
    let failures = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let Some((t, p, dims, dtype, arch, source, count)) = jobs.lock().unwrap().pop() else { break };
                let mut defines: Vec<(&str, String)> = if count { vec![("OPTD_COUNT_CTAS", "1".into())] } else { vec![] };
                if dims != t.meta.head_dims {
                    defines.extend(optimizerd::spec::protocol::head_dim_defines(&dims));
                }
                let what = format!("{} {p:?} D {dims:?} {} {arch}{}", t.file, dtype.as_str(), if count { " (check build)" } else { "" });
                match nvrtc::compile(&tc, &source, "candidate.cu", &arch, &defines) {
                    Ok(c) => {
                        assert!(c.cubin.starts_with(b"\x7fELF"), "{what}: not a cubin");
                        for k in t.kernel_names(&dims) {
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

/// A build asked for some head dims holds their kernels and no others, in every template
/// (`#if OPTD_BUILD_D<d>` around each kernel, the defines the worker passes for a run's
/// head dims), and a build asked for none of them in particular holds them all: exactly
/// the head dims the template's spec lists (`head_dims`).
#[test]
fn a_build_holds_the_kernels_of_the_head_dims_it_is_asked_for_and_no_others() {
    use optimizerd::spec::protocol::head_dim_defines;
    let tc = nvrtc::locate().unwrap_or_else(|e| {
        panic!("NVRTC is required for this test (CI={:?}; run scripts/setup.sh): {e}", std::env::var("CI").ok())
    });
    let dir = common::repo_root().join("kernel-templates");
    let mut jobs = Vec::new();
    for file in template_files(&dir) {
        let t = Template::load(&dir, &file).unwrap_or_else(|e| panic!("{e}"));
        for asked in t.meta.head_dims.iter().map(|&d| vec![d]).chain([vec![]]) {
            jobs.push((t.clone(), asked));
        }
    }
    let jobs = Mutex::new(jobs);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..std::thread::available_parallelism().map_or(2, |n| n.get()).min(8) {
            s.spawn(|| loop {
                let Some((t, asked)) = jobs.lock().unwrap().pop() else { break };
                let src = render(&t, &t.default_params(), DType::Bf16, &dir).unwrap();
                let arch = targets(&t).remove(0);
                let defines = head_dim_defines(&asked);
                let what = format!("{} asked for head dims {asked:?} ({arch})", t.file);
                let c = match nvrtc::compile(&tc, &src.source, "candidate.cu", &arch, &defines) {
                    Ok(c) => c,
                    Err(e) => {
                        failures.lock().unwrap().push(format!("{what}: {e}"));
                        continue;
                    }
                };
                let holds = |k: &str| c.cubin.windows(k.len()).any(|w| w == k.as_bytes());
                // A head dim the template does not list has no kernel in any build.
                for d in HEAD_DIMS {
                    let wanted = t.meta.head_dims.contains(&d) && (asked.is_empty() || asked.contains(&d));
                    for k in t.kernel_names(&[d]) {
                        if holds(&k) != wanted {
                            failures.lock().unwrap().push(format!("{what}: kernel {k} {}", if wanted { "missing" } else { "built anyway" }));
                        }
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
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

/// One head dim per variant of `cover`, then more (variant, head dim) builds where needed,
/// greedily, until every value of every knob has been built at every head dim: the (knob value,
/// head dim) pairs a template's code may get wrong (a panel count, a register budget), with
/// every variant still built once so the knob pairs of `cover` stay covered.
fn head_dim_cover(cover: &[Params], knobs: &[String], head_dims: &[u32]) -> Vec<(Params, u32)> {
    type Triple = (usize, i64, u32);
    let triples = |p: &Params, d: u32| -> Vec<Triple> { knobs.iter().enumerate().map(|(i, k)| (i, p[k], d)).collect() };
    let mut uncovered: std::collections::BTreeSet<Triple> =
        cover.iter().flat_map(|p| head_dims.iter().flat_map(|&d| triples(p, d))).collect();
    let mut out: Vec<(Params, u32)> = Vec::new();
    let gain = |p: &Params, d: u32, uncovered: &std::collections::BTreeSet<Triple>| triples(p, d).iter().filter(|x| uncovered.contains(x)).count();
    // Every variant once, at the head dim that covers the most (ties: the first listed).
    for p in cover {
        let d = *head_dims.iter().max_by_key(|&&d| (gain(p, d, &uncovered), std::cmp::Reverse(d))).expect("a template lists a head dim");
        for x in triples(p, d) {
            uncovered.remove(&x);
        }
        out.push((p.clone(), d));
    }
    while !uncovered.is_empty() {
        let (p, d) = cover
            .iter()
            .flat_map(|p| head_dims.iter().map(move |&d| (p, d)))
            .filter(|(p, d)| !out.iter().any(|(q, e)| q == *p && e == d))
            .max_by_key(|(p, d)| gain(p, *d, &uncovered))
            .expect("uncovered triples come from the cover");
        for x in triples(p, d) {
            uncovered.remove(&x);
        }
        out.push((p.clone(), d));
    }
    out
}

/// The element types a variant compiles in.
const TYPES: [DType; 2] = [DType::Fp16, DType::Bf16];

/// The target, element type and arch, of every compile of `builds` (variant, head dims).
/// The first build (the daemon's start point, every head dim) compiles for every target;
/// every other build for one, chosen greedily so that every knob value and every head dim
/// also compiles in every element type and for every arch; a build compiles for a second
/// target only where those pairs outnumber the builds. (Every build for every target was
/// 2-6 compiles per build, most of this test's 8 minutes on CI; a knob that breaks one
/// type or arch breaks it at any value pairing, so the value's pair with the target is
/// what needs a compile.) Deterministic: ties keep the builds' and the targets' order.
fn target_cover(builds: &[(Params, Vec<u32>)], knobs: &[String], types: &[DType], archs: &[String]) -> Vec<(Params, Vec<u32>, DType, String)> {
    // (knob index, or usize::MAX for a head dim; its value; 0 = element type, 1 = arch; that target's index)
    type Feature = (usize, i64, u8, usize);
    let targets: Vec<(usize, usize)> = (0..types.len()).flat_map(|t| (0..archs.len()).map(move |a| (t, a))).collect();
    let features = |b: usize, (t, a): (usize, usize)| -> Vec<Feature> {
        let (p, dims) = &builds[b];
        let mut out = Vec::new();
        for (side, i) in [(0u8, t), (1u8, a)] {
            out.extend(knobs.iter().enumerate().map(|(k, name)| (k, p[name], side, i)));
            out.extend(dims.iter().map(|&d| (usize::MAX, i64::from(d), side, i)));
        }
        out
    };
    let mut uncovered: std::collections::BTreeSet<Feature> =
        (0..builds.len()).flat_map(|b| targets.iter().flat_map(move |&tg| features(b, tg))).collect();
    let mut chosen: Vec<(usize, (usize, usize))> = Vec::new();
    let take = |b: usize, tg: (usize, usize), uncovered: &mut std::collections::BTreeSet<Feature>, chosen: &mut Vec<(usize, (usize, usize))>| {
        for f in features(b, tg) {
            uncovered.remove(&f);
        }
        chosen.push((b, tg));
    };
    for &tg in &targets {
        take(0, tg, &mut uncovered, &mut chosen);
    }
    for b in 1..builds.len() {
        let gain = |tg: (usize, usize)| features(b, tg).iter().filter(|f| uncovered.contains(*f)).count();
        let best = *targets.iter().rev().max_by_key(|&&tg| gain(tg)).expect("at least one target");
        take(b, best, &mut uncovered, &mut chosen);
    }
    while !uncovered.is_empty() {
        let gain = |b: usize, tg: (usize, usize)| features(b, tg).iter().filter(|f| uncovered.contains(*f)).count();
        let (b, tg) = (0..builds.len())
            .flat_map(|b| targets.iter().map(move |&tg| (b, tg)))
            .filter(|x| !chosen.contains(x))
            .rev()
            .max_by_key(|&(b, tg)| gain(b, tg))
            .expect("uncovered pairs come from the builds");
        take(b, tg, &mut uncovered, &mut chosen);
    }
    chosen
        .into_iter()
        .map(|(b, (t, a))| (builds[b].0.clone(), builds[b].1.clone(), types[t], archs[a].clone()))
        .collect()
}

/// A covering set of `variants` (distinct in their `knobs`): `default` first when it is
/// one of them, then, greedily, the variant that covers the most pairs of (knob, value)
/// not covered yet, until every pair that occurs in `variants` is covered (with fewer
/// than two knobs: every value of each). The result is deterministic (ties keep order).
fn pairwise_cover(default: &Params, variants: Vec<Params>, knobs: &[String]) -> Vec<Params> {
    type Pair = (usize, i64, usize, i64);
    let pairs_of = |p: &Params| -> Vec<Pair> {
        let mut out = Vec::new();
        for (i, a) in knobs.iter().enumerate() {
            // A lone knob still needs each value once: pair it with itself.
            if knobs.len() == 1 {
                out.push((i, p[a], i, p[a]));
            }
            for (j, b) in knobs.iter().enumerate().skip(i + 1) {
                out.push((i, p[a], j, p[b]));
            }
        }
        out
    };
    let mut uncovered: std::collections::BTreeSet<Pair> = variants.iter().flat_map(&pairs_of).collect();
    let mut pool = variants;
    let mut chosen = Vec::new();
    if let Some(i) = pool.iter().position(|p| knobs.iter().all(|k| p[k] == default[k])) {
        let p = pool.remove(i);
        for x in pairs_of(&p) {
            uncovered.remove(&x);
        }
        chosen.push(p);
    }
    while !uncovered.is_empty() {
        let gain = |p: &Params| pairs_of(p).iter().filter(|x| uncovered.contains(x)).count();
        let best = (0..pool.len()).max_by_key(|&i| (gain(&pool[i]), std::cmp::Reverse(i))).expect("uncovered pairs come from the pool");
        let p = pool.remove(best);
        for x in pairs_of(&p) {
            uncovered.remove(&x);
        }
        chosen.push(p);
    }
    if chosen.is_empty() {
        chosen.extend(pool.into_iter().take(1));
    }
    chosen
}

#[test]
fn the_covering_set_holds_every_value_pair_and_far_fewer_variants_than_the_product() {
    let knobs: Vec<String> = ["A", "B", "C", "D"].iter().map(|s| s.to_string()).collect();
    let mut all = Vec::new();
    for a in [1, 2, 3] {
        for b in [1, 2, 3] {
            for c in [0, 1] {
                for d in [4, 8, 16] {
                    all.push(Params::from_iter([("A".into(), a), ("B".into(), b), ("C".into(), c), ("D".into(), d)]));
                }
            }
        }
    }
    let default = Params::from_iter([("A".into(), 2), ("B".into(), 1), ("C".into(), 1), ("D".into(), 8)]);
    let cover = pairwise_cover(&default, all.clone(), &knobs);
    assert_eq!(cover[0], default, "the daemon's starting point compiles first");
    assert!(cover.len() <= 12 && cover.len() >= 9, "3 x 3 pairs need at least 9 variants, got {}", cover.len());
    for (i, a) in knobs.iter().enumerate() {
        for b in &knobs[i + 1..] {
            for p in &all {
                assert!(cover.iter().any(|c| c[a] == p[a] && c[b] == p[b]), "{a}={} with {b}={} not covered", p[a], p[b]);
            }
        }
    }
    // One knob: each value once; none: the one variant.
    let one: Vec<Params> = [1, 2, 3].iter().map(|&v| Params::from_iter([("A".into(), v)])).collect();
    assert_eq!(pairwise_cover(&one[1], one.clone(), &knobs[..1]).len(), 3);
    assert_eq!(pairwise_cover(&Params::new(), vec![Params::new()], &[]).len(), 1);
}

#[test]
fn every_knob_value_is_built_at_every_head_dim_and_every_variant_once() {
    let knobs: Vec<String> = ["A", "B"].iter().map(|s| s.to_string()).collect();
    let mut all = Vec::new();
    for a in [1, 2, 3] {
        for b in [0, 1] {
            all.push(Params::from_iter([("A".into(), a), ("B".into(), b)]));
        }
    }
    let cover = pairwise_cover(&all[0], all.clone(), &knobs);
    let dims = [64, 96, 128, 256];
    let builds = head_dim_cover(&cover, &knobs, &dims);
    for p in &cover {
        assert!(builds.iter().any(|(q, _)| q == p), "{p:?} never built");
    }
    for k in &knobs {
        for p in &all {
            for d in dims {
                assert!(builds.iter().any(|(q, e)| q[k] == p[k] && *e == d), "{k}={} never built at D {d}", p[k]);
            }
        }
    }
    // 3 values of A at 4 head dims need 12 builds at least; no (variant, head dim) twice.
    assert!(builds.len() >= 12 && builds.len() <= 16, "{} builds", builds.len());
    let distinct: std::collections::BTreeSet<String> = builds.iter().map(|(p, d)| format!("{p:?}{d}")).collect();
    assert_eq!(distinct.len(), builds.len());
    // One head dim: each variant once, at it.
    assert_eq!(head_dim_cover(&cover, &knobs, &[128]).len(), cover.len());
}

#[test]
fn every_knob_value_and_head_dim_compiles_in_every_type_for_every_arch_in_far_fewer_compiles() {
    let knobs: Vec<String> = ["A", "B", "C"].iter().map(|s| s.to_string()).collect();
    let mut all = Vec::new();
    for a in [1, 2, 3] {
        for b in [0, 1] {
            for c in [16, 32] {
                all.push(Params::from_iter([("A".into(), a), ("B".into(), b), ("C".into(), c)]));
            }
        }
    }
    let cover = pairwise_cover(&all[0], all.clone(), &knobs);
    let dims = [64, 128];
    let mut builds: Vec<(Params, Vec<u32>)> = vec![(cover[0].clone(), dims.to_vec())];
    builds.extend(head_dim_cover(&cover, &knobs, &dims).into_iter().map(|(p, d)| (p, vec![d])));
    let archs: Vec<String> = ["sm_80", "sm_89", "sm_90"].iter().map(|s| s.to_string()).collect();
    let compiles = target_cover(&builds, &knobs, &TYPES, &archs);
    // The first build for every target, first; every build at least once; no compile twice.
    assert!(compiles.len() >= 6 && compiles[..6].iter().all(|(p, d, _, _)| *p == builds[0].0 && *d == builds[0].1), "{compiles:?}");
    for (p, d) in &builds {
        assert!(compiles.iter().any(|(q, e, _, _)| q == p && e == d), "{p:?} D {d:?} never compiled");
    }
    let distinct: std::collections::BTreeSet<String> = compiles.iter().map(|(p, d, t, a)| format!("{p:?}{d:?}{}{a}", t.as_str())).collect();
    assert_eq!(distinct.len(), compiles.len());
    // Every knob value and head dim in both types and for all three archs.
    for t in TYPES {
        for arch in &archs {
            for k in &knobs {
                for p in &all {
                    assert!(compiles.iter().any(|(q, _, u, _)| q[k] == p[k] && *u == t), "{k}={} never in {}", p[k], t.as_str());
                    assert!(compiles.iter().any(|(q, _, _, a)| q[k] == p[k] && a == arch), "{k}={} never for {arch}", p[k]);
                }
            }
            for d in dims {
                assert!(compiles.iter().any(|(_, e, u, _)| e.contains(&d) && *u == t), "D {d} never in {}", t.as_str());
                assert!(compiles.iter().any(|(_, e, _, a)| e.contains(&d) && a == arch), "D {d} never for {arch}");
            }
        }
    }
    // Far fewer than every build for every target (what the test compiled before).
    assert!(compiles.len() * 2 < builds.len() * 6, "{} compiles for {} builds", compiles.len(), builds.len());
    // One target: each build once.
    assert_eq!(target_cover(&builds, &knobs, &TYPES[..1], &archs[..1]).len(), builds.len());
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
