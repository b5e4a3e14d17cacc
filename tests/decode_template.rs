//! The flash-decoding templates on the CPU: decode.cu (`decode-split`) and
//! decode_cluster.cu (`decode-cluster`, sm_90). Their specs plan decode shapes (the
//! split count, grids and shared memory their headers state), the gate refuses prefill
//! shapes with the reason, every pairwise-covering variant compiles with NVRTC, and a
//! decode plan stage runs on a workload's decode shapes only (scripted worker), and is
//! skipped, with the reason recorded, on a workload without any.

mod common;

use std::time::Duration;

use common::{h100, Project};
use optimizerd::engine::RunEnd;
use optimizerd::nvrtc;
use optimizerd::pipeline::gate;
use optimizerd::pipeline::render::render;
use optimizerd::spec::protocol::{DType, Layout, Shape};
use optimizerd::spec::template::{Params, Template};
use optimizerd::storage::ledger::Ledger;
use serde_json::{json, Value};

fn decode() -> Template {
    Template::load(&common::repo_root().join("kernel-templates"), "decode.cu").unwrap_or_else(|e| panic!("{e}"))
}

fn gqa(b: u32, hq: u32, hkv: u32, sq: u32, sk: u32, causal: bool) -> Shape {
    Shape { b, hq, hkv, sq, sk, d: 128, causal, window: None, dtype: DType::Bf16, layout: Layout::Bhsd }
}

fn knobs(block_n: i64, warps: i64, stages: i64, waves: i64, min_tiles: i64) -> Params {
    [("BLOCK_N", block_n), ("NUM_WARPS", warps), ("STAGES", stages), ("SPLIT_WAVES", waves), ("MIN_SPLIT_TILES", min_tiles), ("FUSED_COMBINE", 0), ("WARP_LOADS", 0), ("M_TILES", 1)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// (n_splits, [(kernel, grid)]) of one plan.
fn planned(t: &Template, p: &Params, s: &Shape) -> (u32, Vec<(String, [u32; 3])>) {
    let plan = t.plan(p, s, &h100()).unwrap_or_else(|e| panic!("{e}"));
    (plan.n_splits, plan.launches.iter().map(|l| (l.kernel.clone(), l.grid)).collect())
}

#[test]
fn the_spec_splits_the_cache_to_fill_the_sms_and_packs_the_group_into_row_tiles() {
    let t = decode();
    assert_eq!(t.name(), "decode-split");
    assert_eq!(t.meta.max_sq, Some(16));
    let p = knobs(32, 4, 3, 1, 1); // 128 keys per tile
    let fwd = |splits: u32, groups: u32, row_tiles: u32| ("optd_fwd_d128".to_string(), [splits, groups, row_tiles]);
    let combine = |ctas: u32| ("optd_combine_d128".to_string(), [ctas, 1, 1]);

    // Llama-3 B 1, SK 1024: 8 groups of 4 query heads, 8 tiles; 132 SMs want 17 splits per
    // group, the keys allow 8. One 16-row tile holds the group's 4 rows.
    assert_eq!(planned(&t, &p, &gqa(1, 32, 8, 1, 1024, false)), (8, vec![fwd(8, 8, 1), combine(8)]));
    // B 64: 512 groups fill the GPU alone: one split, O written directly, no combine.
    assert_eq!(planned(&t, &p, &gqa(64, 32, 8, 1, 4096, false)), (1, vec![fwd(1, 512, 1)]));
    // MQA: 32 query heads on one KV head are two row tiles; 16 CTAs per split want 9
    // splits, 32 tiles make that 4 tiles per split, so 8 splits (none left empty).
    assert_eq!(planned(&t, &p, &gqa(8, 32, 1, 1, 4096, true)), (8, vec![fwd(8, 8, 2), combine(64)]));
    // Ragged SK 4000 counts its partial last tile: 32 tiles; B 8: 64 groups want 3 splits.
    assert_eq!(planned(&t, &p, &gqa(8, 32, 8, 1, 4000, true)), (3, vec![fwd(3, 64, 1), combine(64)]));
    // Speculative decoding, SQ 4: 4 heads x 4 rows are one full tile; SQ 16 takes four.
    // (8 groups want 17 splits of 32 tiles: 2 tiles each, 16 splits.)
    assert_eq!(planned(&t, &p, &gqa(1, 32, 8, 4, 4096, true)).1[0], fwd(16, 8, 1));
    // SQ 16: 64 rows, four row tiles; 32 CTAs per split want 5 splits.
    assert_eq!(planned(&t, &p, &gqa(1, 32, 8, 16, 4096, true)).1[0].1, [5, 8, 4]);

    // The split knobs: MIN_SPLIT_TILES keeps at least that many tiles per split,
    // SPLIT_WAVES asks for more CTAs.
    assert_eq!(planned(&t, &knobs(32, 4, 3, 1, 4), &gqa(1, 32, 8, 1, 1024, false)).0, 2);
    assert_eq!(planned(&t, &knobs(32, 4, 3, 1, 1), &gqa(8, 32, 8, 1, 16384, false)).0, 3);
    assert_eq!(planned(&t, &knobs(32, 4, 3, 2, 1), &gqa(8, 32, 8, 1, 16384, false)).0, 5);
    // A cache shorter than one tile is one split.
    assert_eq!(planned(&t, &p, &gqa(1, 8, 8, 1, 100, true)), (1, vec![fwd(1, 8, 1)]));
    // FUSED_COMBINE: the same splits in one launch (the last CTA of each group combines).
    let mut fused = p.clone();
    fused.insert("FUSED_COMBINE".into(), 1);
    assert_eq!(planned(&t, &fused, &gqa(8, 32, 1, 1, 4096, true)), (8, vec![fwd(8, 8, 2)]));
    assert_eq!(planned(&t, &fused, &gqa(1, 32, 8, 1, 1024, false)), (8, vec![fwd(8, 8, 1)]));
    // M_TILES 2: MQA's 32 rows in one CTA, the 4 warps split 2 x 2 (64 keys per tile): 8
    // groups want 17 splits of 64 tiles, 4 tiles each, 16 splits; one row block.
    let mut two = p.clone();
    two.insert("M_TILES".into(), 2);
    assert_eq!(planned(&t, &two, &gqa(8, 32, 1, 1, 4096, true)), (16, vec![fwd(16, 8, 1), combine(64)]));
    // SQ 16 x G 4 = 64 rows: two row blocks of 32.
    assert_eq!(planned(&t, &two, &gqa(1, 32, 8, 16, 4096, true)).1[0].1[2], 2);
    let plan2 = t.plan(&two, &gqa(8, 32, 1, 1, 4096, true), &h100()).unwrap();
    assert_eq!(plan2.launches[0].dyn_smem, 256 * 32 + 3 * 2 * 64 * 256, "32 Q rows, a ring of 64-key tiles");

    // Shared memory: the Q tile plus the K/V ring (or the merge's fp32 rows), as the
    // header states; D 128, 4 warps of 32 keys, 3 stages: 4 KiB + 192 KiB.
    let plan = t.plan(&p, &gqa(1, 32, 8, 1, 1024, false), &h100()).unwrap();
    assert_eq!(plan.launches[0].dyn_smem, 256 * 16 + 3 * 2 * 128 * 256);
    assert_eq!(plan.launches[0].block, [128, 1, 1]);
    assert_eq!(plan.launches[1].dyn_smem, 0);
    let layout = t.layout_smem(&p, 128);
    assert_eq!(layout[0], ("fwd".to_string(), Ok(plan.launches[0].dyn_smem)), "the renderer's define is the launch's bytes");
}

#[test]
fn the_gate_refuses_prefill_shapes_with_the_reason_and_plans_the_decode_ones() {
    let t = decode();
    let p = knobs(16, 4, 3, 1, 2);
    let prefill = gqa(1, 32, 8, 512, 4096, true);
    let shapes = [gqa(8, 32, 8, 1, 4096, true), prefill, gqa(2, 32, 8, 16, 2048, false)];
    let each = gate::check_each(&t, &p, &shapes, &h100(), "1").unwrap();
    let planned: Vec<String> = each.plans.iter().map(|p| p.shape.key()).collect();
    assert_eq!(planned, [shapes[0].key(), shapes[2].key()]);
    assert_eq!(each.refused.len(), 1);
    let (key, why) = &each.refused[0];
    assert_eq!(key, &prefill.key());
    assert!(why.contains("template decode-split is for SQ <= 16") && why.contains("SQ = 512"), "{why}");
    // Only prefill shapes: the candidate fails as a whole, with that reason.
    let err = gate::check(&t, &p, &[prefill], &h100(), "1").unwrap_err();
    assert!(err.0.contains("max_sq"), "{}", err.0);
    // A ring over the device's shared memory is refused as for every template.
    let err = gate::check(&t, &knobs(64, 8, 3, 1, 1), &shapes[..1], &h100(), "1").unwrap_err();
    assert!(err.0.contains("dynamic shared memory"), "{}", err.0);
}

#[test]
fn max_sq_is_validated_and_optional() {
    let text = |extra: &str| {
        format!(
            "/* optimizerd:spec\n[template]\nname = \"t\"\n{extra}\n[knobs]\nX = [1]\n[[launch]]\nkernel = \"fwd\"\ngrid = [\"1\", \"1\", \"1\"]\nblock = [\"32\", \"1\", \"1\"]\nsmem = \"0\"\n*/\n"
        )
    };
    let err = Template::parse("t.cu", text("max_sq = 0")).unwrap_err().to_string();
    assert!(err.contains("max_sq = 0 admits no shape"), "{err}");
    // A string is refused, at its line of the file.
    let err = Template::parse("t.cu", text("max_sq = \"16\"")).unwrap_err().to_string();
    assert!(err.contains("line 4") && err.contains("expected u32"), "{err}");
    let any = Template::parse("t.cu", text("")).unwrap();
    assert_eq!(any.meta.max_sq, None);
    assert!(any.meta.admits(&gqa(1, 8, 8, 4096, 4096, true)).is_ok());
}

/// Every variant of a covering set of the knobs the code reads (the split knobs only
/// enter the launch formulas) compiles with NVRTC, each for one of `archs` in one element
/// type (every pair of the two among the variants), and exports its kernels; the check
/// build once. Three values per knob: the orthogonal array (i, j, i + j, i + 2j mod 3)
/// covers every pair of values of up to 4 knobs in 9 points (tests/nvrtc_templates.rs
/// compiles a pairwise cover of every knob, element type and arch).
fn compile_covering_set(file: &str, code_knobs: &[&str], fixed: &[(&str, i64)], archs: &[&str]) {
    let tc = nvrtc::locate().unwrap_or_else(|e| panic!("NVRTC is required for this test (run scripts/setup.sh): {e}"));
    let dir = common::repo_root().join("kernel-templates");
    let t = Template::load(&dir, file).unwrap();
    let values: Vec<&Vec<i64>> = code_knobs.iter().map(|k| &t.knobs.iter().find(|(n, _)| n == k).unwrap().1).collect();
    assert!(values.iter().all(|v| v.len() == 3) && code_knobs.len() <= 4);
    let mut variants = Vec::new();
    for i in 0..3 {
        for j in 0..3 {
            let mut p = t.default_params();
            for (k, v) in fixed {
                p.insert(k.to_string(), *v);
            }
            for (n, (k, v)) in code_knobs.iter().zip(&values).enumerate() {
                p.insert(k.to_string(), v[[i, j, (i + j) % 3, (i + 2 * j) % 3][n]]);
            }
            variants.push(p);
        }
    }
    let mut pairs = std::collections::BTreeSet::new();
    for p in &variants {
        for (x, a) in code_knobs.iter().enumerate() {
            for b in &code_knobs[x + 1..] {
                pairs.insert((*a, p[*a], *b, p[*b]));
            }
        }
    }
    let n = code_knobs.len();
    assert_eq!(pairs.len(), 9 * n * (n - 1) / 2, "every pair of values of the code knobs");
    // One element type and one arch per variant, taking turns so that every (type, arch) pair
    // compiles (9 variants, 2 x 2 targets): these sets add the fixed knobs' three-way
    // interactions to tests/nvrtc_templates.rs's pairwise cover, which already compiles every
    // knob value in both types for every arch; all of them in both types for both archs was
    // 216 full builds, 5 of CI's minutes. The first variant's check build (CTA counting) too.
    let types = [DType::Fp16, DType::Bf16];
    let mut jobs: Vec<(Params, DType, &str, bool)> =
        variants.iter().enumerate().map(|(i, v)| (v.clone(), types[i % 2], archs[(i / 2) % archs.len()], false)).collect();
    let check_arch = if archs.contains(&"sm_90") { "sm_90" } else { archs[0] };
    jobs.push((variants[0].clone(), DType::Bf16, check_arch, true));
    let failures = std::sync::Mutex::new(Vec::new());
    let queue = std::sync::Mutex::new(jobs);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let Some((p, dtype, arch, count)) = queue.lock().unwrap().pop() else { break };
                let src = render(&t, &p, dtype, &dir).unwrap();
                let defines: Vec<(&str, String)> = if count { vec![("OPTD_COUNT_CTAS", "1".into())] } else { vec![] };
                match nvrtc::compile(&tc, &src.source, file, arch, &defines) {
                    Ok(c) => {
                        for k in t.kernel_names(&t.meta.head_dims) {
                            if !c.cubin.windows(k.len()).any(|w| w == k.as_bytes()) {
                                failures.lock().unwrap().push(format!("{file} {p:?} {arch}: {k} not exported"));
                            }
                        }
                    }
                    Err(e) => failures.lock().unwrap().push(format!("{file} {p:?} {} {arch}: {e}", dtype.as_str())),
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_pairwise_variant_compiles_with_nvrtc() {
    // Both ways to combine the splits (a second launch, the last CTA of each group).
    for fused in [0, 1] {
        compile_covering_set("decode.cu", &["BLOCK_N", "NUM_WARPS", "STAGES"], &[("FUSED_COMBINE", fused)], &["sm_80", "sm_90"]);
    }
    // Two row tiles per CTA, the key slices' warp pairs meeting at named barriers.
    compile_covering_set("decode.cu", &["BLOCK_N", "NUM_WARPS", "STAGES"], &[("FUSED_COMBINE", 1), ("M_TILES", 2), ("WARP_LOADS", 1)], &["sm_90"]);
    // Clusters and distributed shared memory: sm_90 only (its min_cc).
    // Every way to combine (push to rank 0: asynchronous stores or stores and an
    // arrive; pull through two cluster barriers).
    for combine in [2, 3, 1, 0] {
        compile_covering_set("decode_cluster.cu", &["BLOCK_N", "NUM_WARPS", "STAGES", "CLUSTER"], &[("COMBINE", combine)], &["sm_90"]);
    }
    compile_covering_set("decode_cluster.cu", &["BLOCK_N", "NUM_WARPS", "STAGES", "CLUSTER"], &[("COMBINE", 2), ("M_TILES", 2)], &["sm_90"]);
    // K's copies a group ahead of V's: two waits per tile, at the CTA barrier (decode.cu) and
    // at the key slices' named barriers (decode-wide's start).
    compile_covering_set("decode.cu", &["BLOCK_N", "NUM_WARPS", "STAGES"], &[("K_FIRST", 1)], &["sm_90"]);
    compile_covering_set(
        "decode_cluster.cu",
        &["BLOCK_N", "NUM_WARPS", "STAGES", "CLUSTER"],
        &[("COMBINE", 3), ("M_TILES", 2), ("WARP_LOADS", 1), ("K_FIRST", 1)],
        &["sm_90"],
    );
    // One wgmma warpgroup per split (sm_90a only): the ring depths against the cluster sizes
    // (whose receive area and scatter shares change) at the largest tile with two 32-row CTAs,
    // and at 64 keys with one CTA of 64 rows.
    for (block_n, rows) in [(128, 32), (64, 64)] {
        compile_covering_set("decode_wgmma.cu", &["STAGES", "CLUSTER"], &[("BLOCK_N", block_n), ("ROWS", rows)], &["sm_90a"]);
    }
}

/// decode-wgmma: CLUSTER splits x (B x HKV groups) x row tiles of ROWS packed rows, 160 threads
/// (a consumer warpgroup and a producer warp), K and V by tensor maps of BLOCK_N rows, shared
/// memory as its spec's formula; Hopper only, decode only, head dims 64 and 128.
#[test]
fn the_wgmma_decode_template_holds_a_splits_packed_rows_in_one_warpgroup_and_needs_sm_90a() {
    use optimizerd::spec::protocol::TensorName;
    let t = Template::load(&common::repo_root().join("kernel-templates"), "decode_wgmma.cu").unwrap();
    assert_eq!((t.name(), t.meta.max_sq, t.meta.min_cc, t.meta.arch_specific), ("decode-wgmma", Some(16), 90, true));
    assert_eq!(t.meta.head_dims, [64, 128]);
    let mut p = t.default_params();
    assert_eq!((p["BLOCK_N"], p["STAGES"], p["CLUSTER"], p["ROWS"]), (128, 3, 8, 32));
    // Llama-3 x SQ 16: 4 query heads x 16 rows = 64 packed rows, two CTAs of 32 per split.
    let plan = t.plan(&p, &gqa(8, 32, 8, 16, 4096, true), &h100()).unwrap();
    assert_eq!((plan.n_splits, plan.launches.len()), (1, 1), "no global partials, one launch");
    assert_eq!((plan.launches[0].grid, plan.launches[0].block), ([8, 64, 2], [160, 1, 1]));
    let recv = 7 * ((32 * 128 / 4usize).div_ceil(8) * 16 + 32 * 4);
    assert_eq!(plan.launches[0].dyn_smem as usize, 1024 + 2 * 128 * 64 + 2 * 3 * 2 * 128 * 128 + recv + 128);
    let maps: Vec<_> = plan.tensor_maps.iter().map(|m| (m.tensor, m.box_rows, m.swizzle)).collect();
    assert_eq!(maps, [(TensorName::K, 128, 128), (TensorName::V, 128, 128)]);
    // ROWS 64: one CTA per split holds the 64 rows; MQA's 32 rows at ROWS 32 are one row tile.
    p.insert("ROWS".into(), 64);
    p.insert("CLUSTER".into(), 2);
    assert_eq!(t.plan(&p, &gqa(8, 32, 8, 16, 4096, true), &h100()).unwrap().launches[0].grid, [2, 64, 1]);
    assert_eq!(t.plan(&p, &gqa(8, 32, 1, 1, 4096, true), &h100()).unwrap().launches[0].grid, [2, 8, 1]);
    // Refused below sm_90, on prefill shapes and at head dims it has no kernel for.
    let err = gate::check(&t, &p, &[gqa(8, 32, 8, 16, 4096, true)], &common::l4(), "1").unwrap_err();
    assert!(err.0.contains("needs sm_90a"), "{}", err.0);
    let err = gate::check(&t, &p, &[gqa(1, 32, 8, 64, 1024, false)], &h100(), "1").unwrap_err();
    assert!(err.0.contains("SQ <= 16"), "{}", err.0);
    let d256 = Shape { d: 256, ..gqa(1, 16, 8, 1, 1024, true) };
    assert!(gate::check(&t, &p, &[d256], &h100(), "1").is_err(), "no D 256 kernel");
}

#[test]
fn the_cluster_template_is_one_launch_of_one_cluster_per_group_and_needs_sm_90() {
    let t = Template::load(&common::repo_root().join("kernel-templates"), "decode_cluster.cu").unwrap();
    assert_eq!((t.name(), t.meta.max_sq, t.meta.min_cc), ("decode-cluster", Some(16), 90));
    let mut p = t.default_params();
    let plan = t.plan(&p, &gqa(1, 32, 8, 1, 1024, false), &h100()).unwrap();
    assert_eq!(plan.n_splits, 1, "no global partials");
    assert_eq!(plan.launches.len(), 1);
    assert_eq!((plan.launches[0].grid, plan.launches[0].block), ([8, 8, 1], [128, 1, 1]));
    p.insert("CLUSTER".into(), 2);
    assert_eq!(t.plan(&p, &gqa(8, 32, 1, 4, 4000, true), &h100()).unwrap().launches[0].grid, [2, 8, 8], "MQA x SQ 4: 8 row tiles");
    // M_TILES 2: MQA B 8 is 8 clusters of 8 (one wave on the H100), each CTA 32 rows; rank
    // 0 receives 7 x 32 rows and LSEs.
    p.insert("CLUSTER".into(), 8);
    p.insert("M_TILES".into(), 2);
    let plan = t.plan(&p, &gqa(8, 32, 1, 1, 4096, false), &h100()).unwrap();
    assert_eq!(plan.launches[0].grid, [8, 8, 1]);
    let (warps, block_n, stages) = (p["NUM_WARPS"], p["BLOCK_N"], p["STAGES"]);
    let ring = 256 * 2 * stages * (warps / 2) * block_n;
    let ring_or_merge = ring.max(warps * 16 * 136 * 4);
    assert_eq!(plan.launches[0].dyn_smem as i64, 256 * 32 + ring_or_merge + 7 * 32 * 129 * 4 + 16);
    p.insert("CLUSTER".into(), 2);
    p.insert("M_TILES".into(), 1);
    // Refused below sm_90 (the stage is skipped there, with this reason) and on prefill shapes.
    let err = gate::check(&t, &p, &[gqa(1, 32, 8, 1, 1024, false)], &common::l4(), "1").unwrap_err();
    assert!(err.0.contains("needs compute capability 90"), "{}", err.0);
    let err = gate::check(&t, &p, &[gqa(1, 32, 8, 64, 1024, false)], &h100(), "1").unwrap_err();
    assert!(err.0.contains("SQ <= 16"), "{}", err.0);
}

/// The shipped plan's order: the Hopper prefill stages (skipped elsewhere, and where a workload has
/// no prefill shape) before the decode stages, so that a 2-minute run of a mixed workload tunes
/// its prefill shapes at all (docs/BENCHMARKS.md (36): behind the decode stages' 96 s they ended
/// on the baseline kernel at 0.01-0.03x SDPA); then decode-split (B 64's best, which a
/// decode-cluster incumbent within the 2% min_gain would keep out), the wide groups' stage (a
/// few seconds), decode-wgmma (speculative decoding's wide groups) and its start for few wide
/// groups (MQA's best), decode-cluster and the deep ring.
#[test]
fn the_default_plan_runs_the_hopper_prefill_stages_then_the_decode_stages_after_the_baseline() {
    let path = common::repo_root().join("strategies/default.toml");
    let plan = optimizerd::strategy::plan::Plan::load(&path, &common::repo_root().join("kernel-templates")).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = plan.stages.iter().map(|s| s.spec.name.as_str()).collect();
    assert_eq!(
        &names[..9],
        ["baseline", "tensor-cores-hopper", "tensor-cores-hopper-d256", "decode", "decode-wide", "decode-wgmma", "decode-wgmma-few", "decode-cluster", "decode-deep-ring"]
    );
    let stage = |name: &str| plan.stages.iter().find(|s| s.spec.name == name).unwrap_or_else(|| panic!("no stage {name}"));
    let shapes = [gqa(1, 32, 8, 1, 1024, false), gqa(8, 32, 1, 1, 4096, true), gqa(64, 32, 8, 1, 16384, false)];
    for (stage, template) in [stage("decode"), stage("decode-cluster")].into_iter().zip(["decode-split", "decode-cluster"]) {
        assert_eq!(stage.template.name(), template);
        assert!(stage.spec.when.is_empty(), "decode shapes need it whatever the diagnosis");
        // Its start point fits the H100 on the issue's shapes.
        gate::check(&stage.template, &stage.start, &shapes, &h100(), &stage.spec.min_ctas).unwrap_or_else(|e| panic!("{}", e.0));
    }
    // The wide-group stage: decode-cluster with two row tiles per CTA, on MQA only.
    let wide = stage("decode-wide");
    assert_eq!((wide.template.name(), wide.spec.shapes.as_str()), ("decode-cluster", "G * SQ > 16"));
    assert_eq!(wide.start["M_TILES"], 2);
    gate::check(&wide.template, &wide.start, &shapes[1..2], &h100(), &wide.spec.min_ctas).unwrap_or_else(|e| panic!("{}", e.0));
    // Groups whose packed rows fill most of an m64 tile (speculative decoding's SQ 8-16):
    // decode-wgmma, whose start fits them (and MQA, which it is also tried on).
    let wg = stage("decode-wgmma");
    assert_eq!((wg.template.name(), wg.spec.shapes.as_str()), ("decode-wgmma", "G * SQ > 16"));
    let spec = [gqa(8, 32, 8, 16, 4096, true), gqa(8, 28, 4, 8, 4000, true), gqa(8, 32, 1, 1, 4096, true)];
    gate::check(&wg.template, &wg.start, &spec, &h100(), &wg.spec.min_ctas).unwrap_or_else(|e| panic!("{}", e.0));
    // Few wide groups (MQA at batch 8: 8 groups of 32 rows): 128-key tiles at clusters of 8, two
    // knobs from decode-wgmma's start, in a stage of its own that the many-group shapes skip.
    let few = stage("decode-wgmma-few");
    assert_eq!((few.template.name(), few.spec.shapes.as_str()), ("decode-wgmma", "G * SQ > 16 and B * HKV <= 16"));
    assert_eq!((few.start["BLOCK_N"], few.start["STAGES"], few.start["CLUSTER"], few.start["ROWS"]), (128, 3, 8, 32));
    gate::check(&few.template, &few.start, &spec[2..], &h100(), &few.spec.min_ctas).unwrap_or_else(|e| panic!("{}", e.0));
    // Long caches of narrow groups: the deep ring (32 keys x 3 stages, the scatter combine) as
    // the start, which the decode-cluster stage's one-knob moves cannot reach (32 keys x 3
    // stages with its push combine does not fit at clusters of 8: the gate refuses it).
    let deep = stage("decode-deep-ring");
    assert_eq!(
        (deep.template.name(), deep.spec.shapes.as_str()),
        ("decode-cluster", "2 * B * HKV * (SK if WINDOW == 0 else min(SK, WINDOW)) * D * ELEM_BYTES >= 67108864 and G * SQ <= 16")
    );
    assert_eq!((deep.start["BLOCK_N"], deep.start["STAGES"], deep.start["COMBINE"]), (32, 3, 3));
    let long = [gqa(1, 32, 8, 1, 65536, true), gqa(8, 32, 8, 1, 16384, true)];
    gate::check(&deep.template, &deep.start, &long, &h100(), &deep.spec.min_ctas).unwrap_or_else(|e| panic!("{}", e.0));
    let mut push = deep.start.clone();
    push.insert("COMBINE".into(), 2);
    assert!(gate::check(&deep.template, &push, &long[..1], &h100(), &deep.spec.min_ctas).is_err(), "the push combine's receive area beside the deep ring");
    // The prefill stages leave decode shapes to the decode templates (timing a generic kernel
    // on a decode shape's KV cache was most of a candidate's time, and it never won one).
    for stage in plan.stages.iter().filter(|s| s.spec.search != optimizerd::strategy::search::SearchKind::Agent
        && s.spec.search != optimizerd::strategy::search::SearchKind::AgentTuning && s.template.meta.max_sq.is_none()
        && s.spec.name != "baseline")
    {
        // (A stage for one head dim narrows it further: `SQ > 16 and D == 256`.)
        let s = stage.spec.shapes.as_str();
        assert!(s == "SQ > 16" || s.starts_with("SQ > 16 and "), "stage {}: shapes = {s:?}", stage.spec.name);
    }
}

/// Baseline, then the decode stage over two points; no open phase.
const PLAN: &str = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "decode"
template = "decode.cu"
search = "exhaustive"
space = { BLOCK_N = [16], NUM_WARPS = [4, 8], STAGES = [3], SPLIT_WAVES = [1], MIN_SPLIT_TILES = [2], FUSED_COMBINE = [1], WARP_LOADS = [0], M_TILES = [1], K_FIRST = [0] }

[open_phase]
enabled = false
"#;

/// Llama-3's GQA decode (4 packed rows per KV head), a chunked prefill, and MQA x SQ 4 (128).
const MIXED: &str = "shapes = [ { b = 8, hq = 32, hkv = 8, sq = 1, sk = 4096, d = 128, causal = true }, \
     { b = 1, hq = 32, hkv = 8, sq = 512, sk = 2048, d = 128, causal = true }, \
     { b = 8, hq = 32, hkv = 1, sq = 4, sk = 4000, d = 128, causal = true } ]";

fn rules() -> serde_json::Value {
    json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": ["template `decode-split`"], "behaviour": { "ok": { "us": 10.0 } } }
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decode_stage_is_skipped_with_its_reason_on_a_prefill_workload() {
    let p = Project::new(PLAN, rules(), json!({ "ok": { "us": 50.0 } }));
    assert_eq!(p.run("prefill", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("prefill").await.unwrap();
    assert!(!its.is_empty() && its.iter().all(|i| i.stage == "baseline"), "{:?}", its.iter().map(|i| &i.stage).collect::<Vec<_>>());
    let events = ledger.events("prefill").await.unwrap();
    let skipped: Vec<&String> = events.iter().filter(|e| e.kind.as_str() == "stage_skipped").map(|e| &e.message).collect();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(
        skipped[0].contains("stage decode skipped (decode.cu): no workload shape is in its template's regime")
            && skipped[0].contains("SQ <= 16"),
        "{}",
        skipped[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decode_stage_runs_on_the_decode_shapes_of_a_mixed_workload() {
    let p = Project::new(PLAN, rules(), json!({ "ok": { "us": 50.0 } }));
    p.set_workload(MIXED);
    assert_eq!(p.run("mixed", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("mixed").await.unwrap();
    let decode: Vec<_> = its.iter().filter(|i| i.stage == "decode").collect();
    assert_eq!(decode.len(), 2, "both points of the stage's space");
    for it in &decode {
        let keys: Vec<&str> = it.shapes.iter().map(|s| s.shape.as_str()).collect();
        assert_eq!(keys, ["b8hq32hkv8sq1sk4096d128-causal", "b8hq32hkv1sq4sk4000d128-causal"], "iteration {}", it.seq);
        assert!(it.shapes.iter().all(|s| s.gated.is_none()), "nothing gated: the prefill shape is not the stage's");
        assert!(it.score_us.is_some(), "scored on its shapes");
    }
    // The decode kernels win the decode shapes; the prefill shape keeps the baseline.
    let best = ledger.best("mixed").await.unwrap();
    for b in &best {
        let it = its.iter().find(|i| i.seq == b.seq).unwrap();
        let want = if b.shape.contains("sq512") { "baseline" } else { "decode" };
        assert_eq!(it.stage, want, "{}", b.shape);
    }
    let events = ledger.events("mixed").await.unwrap();
    assert!(!events.iter().any(|e| e.kind.as_str() == "stage_skipped"), "{events:?}");
}

/// A workload of several head dims: the baseline (written for all of them) serves every
/// shape; a template's stage runs on the shapes of the head dims its spec lists
/// (`head_dims`), and is skipped, naming them, when the workload has none of those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_runs_on_the_head_dims_its_template_is_written_for() {
    use optimizerd::spec::config::HEAD_DIMS;
    let head_dims = decode().meta.head_dims.clone();
    let dims: String = HEAD_DIMS.iter().map(|d| format!("{{ b = 2, hq = 16, hkv = 8, sq = 1, sk = 1000, d = {d}, causal = true }}, ")).collect();
    let p = Project::new(PLAN, rules(), json!({ "ok": { "us": 50.0 } }));
    p.set_workload(&format!("shapes = [ {dims} ]"));
    assert_eq!(p.run("dims", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("dims").await.unwrap();
    let base = its.iter().find(|i| i.stage == "baseline").unwrap();
    assert_eq!(base.shapes.len(), HEAD_DIMS.len(), "the baseline serves every head dim");
    assert!(base.shapes.iter().all(|s| s.gated.is_none() && s.median_us.is_some()), "{:?}", base.shapes);
    let want: Vec<String> = head_dims.iter().map(|d| format!("b2hq16hkv8sq1sk1000d{d}-causal")).collect();
    for it in its.iter().filter(|i| i.stage == "decode") {
        let keys: Vec<String> = it.shapes.iter().map(|s| s.shape.clone()).collect();
        assert_eq!(keys, want, "iteration {}: the decode template's head dims {head_dims:?}", it.seq);
        // Gated only where a point does not fit (D 256's K/V ring at 8 warps), never for its head dim.
        assert!(it.shapes.iter().all(|s| s.gated.as_deref().is_none_or(|g| g.contains("shared memory"))), "{:?}", it.shapes);
    }
    // A workload of only head dims the decode template is not written for skips its stage.
    let Some(other) = HEAD_DIMS.iter().find(|d| !head_dims.contains(d)) else { return };
    let p = Project::new(PLAN, rules(), json!({ "ok": { "us": 50.0 } }));
    p.set_workload(&format!("shapes = [ {{ b = 2, hq = 16, hkv = 8, sq = 1, sk = 1000, d = {other} }} ]"));
    assert_eq!(p.run("other", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    assert!(ledger.iterations("other").await.unwrap().iter().all(|i| i.stage == "baseline"));
    let skipped: Vec<String> =
        ledger.events("other").await.unwrap().into_iter().filter(|e| e.kind.as_str() == "stage_skipped").map(|e| e.message).collect();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0].contains(&format!("written for head dims {head_dims:?}")) && skipped[0].contains(&format!("D = {other}")), "{}", skipped[0]);
}

/// Baseline, then a decode stage for the wide groups only (`shapes`).
const PLAN_WIDE: &str = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "wide"
template = "decode.cu"
search = "exhaustive"
shapes = "G * SQ > 16"
space = { BLOCK_N = [16], NUM_WARPS = [4], STAGES = [3], SPLIT_WAVES = [1], MIN_SPLIT_TILES = [2], FUSED_COMBINE = [1], WARP_LOADS = [0], M_TILES = [2], K_FIRST = [0] }

[open_phase]
enabled = false
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_with_a_shapes_filter_runs_on_the_shapes_it_selects_and_is_skipped_without_them() {
    let p = Project::new(PLAN_WIDE, rules(), json!({ "ok": { "us": 50.0 } }));
    p.set_workload(MIXED);
    assert_eq!(p.run("wide", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("wide").await.unwrap();
    let wide: Vec<_> = its.iter().filter(|i| i.stage == "wide").collect();
    assert_eq!(wide.len(), 1);
    let keys: Vec<&str> = wide[0].shapes.iter().map(|s| s.shape.as_str()).collect();
    assert_eq!(keys, ["b8hq32hkv1sq4sk4000d128-causal"], "only the wide group");

    // Without a wide group the stage is skipped, and the event says which filter left nothing.
    let p = Project::new(PLAN_WIDE, rules(), json!({ "ok": { "us": 50.0 } }));
    p.set_workload("shapes = [ { b = 8, hq = 32, hkv = 8, sq = 1, sk = 4096, d = 128, causal = true } ]");
    assert_eq!(p.run("narrow", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    assert!(ledger.iterations("narrow").await.unwrap().iter().all(|i| i.stage == "baseline"));
    let events = ledger.events("narrow").await.unwrap();
    let skipped: Vec<&String> = events.iter().filter(|e| e.kind.as_str() == "stage_skipped").map(|e| &e.message).collect();
    assert_eq!(skipped, [&"stage wide skipped (decode.cu): no workload shape in its template's regime has G * SQ > 16".to_string()]);
}

#[test]
fn a_shapes_filter_that_names_no_shape_variable_fails_at_load_naming_the_stage() {
    let dir = common::repo_root().join("kernel-templates");
    let bad = PLAN_WIDE.replace("G * SQ > 16", "G * SQQ > 16");
    let err = optimizerd::strategy::plan::Plan::parse(std::path::Path::new("plan.toml"), &bad, &dir).unwrap_err().to_string();
    assert!(err.contains("wide") && err.contains("G * SQQ > 16") && err.contains("HQ, HKV, G, SQ"), "{err}");
}

/// A plan of the baseline and one stage of the shipped plan, as the file has it, without the
/// open phase: what one stage does on a workload, with the scripted worker.
fn shipped_stage_after_baseline(name: &str) -> String {
    let shipped = std::fs::read_to_string(common::repo_root().join("strategies/default.toml")).unwrap();
    let stage = shipped
        .split("[[stage]]")
        .find(|s| s.contains(&format!("name = \"{name}\"")))
        .unwrap_or_else(|| panic!("the shipped plan has no stage {name}"));
    format!(
        "[[stage]]\nname = \"baseline\"\ntemplate = \"baseline.cu\"\nsearch = \"exhaustive\"\nmax_candidates = 1\n\n\
         [[stage]]{stage}\n[open_phase]\nenabled = false\n"
    )
}

/// The shipped plan's `decode-deep-ring` stage: on narrow groups whose call reads >= 64 MiB of K
/// and V (a long cache at batch 1, a 4K cache at batch 4), not on a 16.8 MB call (B 1 x SK 4096),
/// not on MQA, whose packed rows are decode-wide's, not under a window of 4096 keys over a long
/// cache; from 32 keys x 3 stages with the scatter combine, then the other cluster sizes; three
/// candidates, and the winner serves those shapes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deep_ring_stage_runs_on_long_caches_of_narrow_groups_only() {
    let plan = shipped_stage_after_baseline("decode-deep-ring");
    let dc = "template `decode-cluster`";
    let rules = json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 500.0 } } },
        { "source_contains": [dc, "#define CLUSTER 2\n"], "behaviour": { "ok": { "us": 50.0 } } },
        { "source_contains": [dc, "#define CLUSTER 4\n"], "behaviour": { "ok": { "us": 80.0 } } },
        { "source_contains": [dc], "behaviour": { "ok": { "us": 60.0 } } }
    ]);
    let p = Project::new(&plan, rules, json!({ "ok": { "us": 900.0 } }));
    p.append_config("\n[baseline]\nsdpa = false\n");
    p.set_workload(
        "shapes = [ { b = 1, hq = 32, hkv = 8, sq = 1, sk = 4096, d = 128, causal = true }, \
         { b = 1, hq = 32, hkv = 8, sq = 1, sk = 65536, d = 128, causal = true }, \
         { b = 8, hq = 32, hkv = 1, sq = 1, sk = 65536, d = 128, causal = true }, \
         { b = 1, hq = 32, hkv = 8, sq = 1, sk = 65536, d = 128, causal = true, window = 4096 }, \
         { b = 4, hq = 32, hkv = 8, sq = 1, sk = 4096, d = 128, causal = false } ]",
    );
    assert_eq!(p.run("deep", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("deep").await.unwrap();
    let long = "b1hq32hkv8sq1sk65536d128-causal";
    let batch4 = "b4hq32hkv8sq1sk4096d128";
    let deep: Vec<_> = its.iter().filter(|i| i.stage == "decode-deep-ring").collect();
    let mut clusters = Vec::new();
    let mut both_measured = false;
    for it in &deep {
        let params: optimizerd::spec::template::Params = serde_json::from_str(&it.params_json).unwrap();
        assert_eq!((params["BLOCK_N"], params["STAGES"], params["COMBINE"]), (32, 3, 3), "{}", it.params_json);
        clusters.push(params["CLUSTER"]);
        let measured: Vec<&str> = it.shapes.iter().filter(|s| s.median_us.is_some()).map(|s| s.shape.as_str()).collect();
        // A candidate far behind on its first shape is rejected early, unmeasured on the rest.
        assert!(
            !measured.is_empty() && measured.iter().all(|s| [long, batch4].contains(s)),
            "iteration {}: the two calls of >= 64 MiB of narrow groups only: {measured:?}",
            it.seq
        );
        both_measured |= measured == [long, batch4];
    }
    assert!(both_measured, "a candidate measured on both shapes");
    clusters.sort();
    assert_eq!(clusters, [2, 4, 8], "the start (8), then the other cluster sizes");
    let dispatch: Value = serde_json::from_str(&std::fs::read_to_string(p.workspace("deep").join("kernels/dispatch.json")).unwrap()).unwrap();
    for shape in [long, batch4] {
        assert_eq!(dispatch[shape]["params"]["CLUSTER"], 2, "{shape}: the fastest of the three");
    }
    for other in ["b1hq32hkv8sq1sk4096d128-causal", "b8hq32hkv1sq1sk65536d128-causal", "b1hq32hkv8sq1sk65536d128-causal-w4096"] {
        assert_eq!(dispatch[other]["template"], "baseline", "{other}: not the stage's shape");
    }
}

/// decode-wgmma-few runs where a workload's wide groups are few (MQA at batch 8, one sequence of
/// 16 draft rows), starting at MQA's point (128-key tiles, clusters of 8, 32 rows), and leaves
/// speculative decoding at batch 8 (64 groups: decode-wgmma's own stage) and narrow groups alone.
#[tokio::test]
async fn the_few_wide_groups_stage_starts_at_mqas_point_on_those_shapes_only() {
    let plan = shipped_stage_after_baseline("decode-wgmma-few");
    let wg = "template `decode-wgmma`";
    let rules = json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 500.0 } } },
        { "source_contains": [wg, "#define BLOCK_N 128\n"], "behaviour": { "ok": { "us": 40.0 } } },
        { "source_contains": [wg], "behaviour": { "ok": { "us": 60.0 } } }
    ]);
    let p = Project::new(&plan, rules, json!({ "ok": { "us": 900.0 } }));
    p.append_config("\n[baseline]\nsdpa = false\n");
    p.set_workload(
        "shapes = [ { b = 8, hq = 32, hkv = 1, sq = 1, sk = 4096, d = 128, causal = true }, \
         { b = 1, hq = 32, hkv = 8, sq = 16, sk = 4096, d = 128, causal = true }, \
         { b = 8, hq = 32, hkv = 8, sq = 16, sk = 4096, d = 128, causal = true }, \
         { b = 1, hq = 32, hkv = 8, sq = 1, sk = 4096, d = 128, causal = true } ]",
    );
    assert_eq!(p.run("few", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("few").await.unwrap();
    let (mqa, draft) = ("b8hq32hkv1sq1sk4096d128-causal", "b1hq32hkv8sq16sk4096d128-causal");
    let few: Vec<_> = its.iter().filter(|i| i.stage == "decode-wgmma-few").collect();
    assert_eq!(few.len(), 2, "the start and one neighbour (max_candidates)");
    let start: optimizerd::spec::template::Params = serde_json::from_str(&few[0].params_json).unwrap();
    assert_eq!((start["BLOCK_N"], start["STAGES"], start["CLUSTER"], start["ROWS"]), (128, 3, 8, 32), "{}", few[0].params_json);
    for it in &few {
        let measured: Vec<&str> = it.shapes.iter().filter(|s| s.median_us.is_some()).map(|s| s.shape.as_str()).collect();
        assert!(!measured.is_empty() && measured.iter().all(|s| [mqa, draft].contains(s)), "iteration {}: {measured:?}", it.seq);
    }
    let dispatch: Value = serde_json::from_str(&std::fs::read_to_string(p.workspace("few").join("kernels/dispatch.json")).unwrap()).unwrap();
    for shape in [mqa, draft] {
        assert_eq!(dispatch[shape]["template"], "decode-wgmma", "{shape}");
        assert_eq!(dispatch[shape]["params"]["BLOCK_N"], 128, "{shape}: the start, the faster one");
    }
    for other in ["b8hq32hkv8sq16sk4096d128-causal", "b1hq32hkv8sq1sk4096d128-causal"] {
        assert_eq!(dispatch[other]["template"], "baseline", "{other}: not the stage's shape");
    }
}
