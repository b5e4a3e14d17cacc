//! Templates: spec parsing, rendering, launch formulas and the static gates.

mod common;

use std::path::PathBuf;

use optimizerd::pipeline::gate;
use optimizerd::strategy::plan::Plan;
use optimizerd::spec::protocol::{DType, Layout, Shape};
use optimizerd::pipeline::render::render;
use optimizerd::spec::template::{Params, Template};

fn templates_dir() -> PathBuf {
    common::repo_root().join("kernel-templates")
}

fn shape(b: u32, h: u32, s: u32, d: u32, causal: bool) -> Shape {
    Shape::mha(b, h, s, d, causal, DType::Fp16)
}

/// Grouped-query attention with SQ query rows against SK keys (ABI v2 shapes).
fn gqa(b: u32, hq: u32, hkv: u32, sq: u32, sk: u32, d: u32, causal: bool, layout: Layout) -> Shape {
    Shape { b, hq, hkv, sq, sk, d, causal, window: None, dtype: DType::Fp16, layout }
}

fn params(t: &Template, pairs: &[(&str, i64)]) -> Params {
    let mut p = t.default_params();
    for (k, v) in pairs {
        p.insert(k.to_string(), *v);
    }
    p
}

#[test]
fn both_shipped_plans_load_with_their_templates() {
    for plan in ["default.toml", "fault-drill.toml"] {
        let path = common::repo_root().join("strategies").join(plan);
        let p = Plan::load(&path, &templates_dir()).unwrap_or_else(|e| panic!("{plan}: {e}"));
        assert_eq!(p.stages[0].spec.name, "baseline");
        assert!(p.stages.iter().any(|s| s.spec.name == "kv-split"));
    }
}

#[test]
fn a_plan_naming_a_knob_the_template_lacks_is_rejected_with_the_knobs() {
    let text = "[[stage]]\nname = \"x\"\ntemplate = \"kv_split.cu\"\nsearch = \"coordinate\"\nspace = { BLOCK_Q = [1] }\n";
    let err = Plan::parse(&PathBuf::from("p.toml"), text, &templates_dir()).unwrap_err().to_string();
    assert!(err.contains("BLOCK_Q") && err.contains("BLOCK_M") && err.contains("stage `x`"), "{err}");
    let text = "[[stage]]\nname = \"x\"\ntemplate = \"kv_split.cu\"\nsearch = \"coordinate\"\nspace = { BLOCK_M = [48] }\n";
    let err = Plan::parse(&PathBuf::from("p.toml"), text, &templates_dir()).unwrap_err().to_string();
    assert!(err.contains("48") && err.contains("allowed"), "{err}");
    let text = "[[stage]]\nname = \"x\"\ntemplate = \"kv_split.cu\"\nsearch = \"sideways\"\n";
    let err = Plan::parse(&PathBuf::from("p.toml"), text, &templates_dir()).unwrap_err().to_string();
    assert!(err.contains("sideways") && err.contains("coordinate") && err.contains("p.toml:4"), "{err}");
}

#[test]
fn rendering_defines_every_knob_inlines_the_prelude_and_is_deterministic() {
    let t = Template::load(&templates_dir(), "kv_split.cu").unwrap();
    let p = params(&t, &[("BLOCK_M", 64), ("MAX_SPLITS", 8)]);
    let a = render(&t, &p, DType::Bf16, &templates_dir()).unwrap();
    let b = render(&t, &p, DType::Bf16, &templates_dir()).unwrap();
    assert_eq!(a.hash, b.hash);
    assert!(a.source.contains("#define BLOCK_M 64\n") && a.source.contains("#define MAX_SPLITS 8\n"));
    assert!(a.source.contains("#define OPTD_BF16 1\n"));
    assert!(!a.source.lines().any(|l| l.trim_start().starts_with("#include \"")), "local include not inlined");
    assert!(a.source.contains("OPTD_ARGS"));
    let c = render(&t, &p, DType::Fp16, &templates_dir()).unwrap();
    assert_ne!(a.hash, c.hash);
}

#[test]
fn rendering_rejects_values_the_template_does_not_allow() {
    let t = Template::load(&templates_dir(), "kv_split.cu").unwrap();
    let err = render(&t, &params(&t, &[("BLOCK_M", 48)]), DType::Fp16, &templates_dir()).unwrap_err().to_string();
    assert!(err.contains("BLOCK_M") && err.contains("48"), "{err}");
}

#[test]
fn kv_split_grid_follows_its_declared_formula_and_skips_combine_without_splits() {
    let t = Template::load(&templates_dir(), "kv_split.cu").unwrap();
    let dev = common::h100();
    // Small problem: splits fill the GPU and the combine kernel runs.
    let p = params(&t, &[("BLOCK_M", 32), ("MAX_SPLITS", 8)]);
    let plan = t.plan(&p, &shape(1, 1, 512, 64, false), &dev).unwrap();
    assert_eq!(plan.launches[0].kernel, "optd_fwd_d64");
    assert_eq!(plan.launches[0].grid, [16, 1, plan.n_splits]);
    assert!(plan.n_splits > 1 && plan.n_splits <= 8);
    assert_eq!(plan.launches.len(), 2);
    assert_eq!(plan.launches[1].kernel, "optd_combine_d64");
    // Large problem: already fills the GPU, one split, no combine.
    let plan = t.plan(&p, &shape(2, 16, 4096, 128, true), &dev).unwrap();
    assert_eq!(plan.n_splits, 1);
    assert_eq!(plan.launches.len(), 1);
    assert_eq!(plan.launches[0].grid, [128, 32, 1]);
    assert_eq!(plan.launches[0].kernel, "optd_fwd_d128");
}

#[test]
fn kv_split_grids_count_query_heads_and_rows_and_split_the_keys() {
    // Decode under GQA: one query row per head, 4096 keys. The forward grid has a
    // query block per query head (HQ, not HKV) and splits SK; combine covers the
    // B * HQ * SQ output rows.
    let t = Template::load(&templates_dir(), "kv_split.cu").unwrap();
    let dev = common::h100();
    let p = params(&t, &[("BLOCK_M", 16), ("MAX_SPLITS", 8)]);
    let plan = t.plan(&p, &gqa(2, 32, 8, 1, 4096, 128, true, Layout::Bshd), &dev).unwrap();
    // 64 CTAs fill under 80% of the 132 SMs: cdiv(132, 64) = 3 splits of the 128 key tiles.
    assert_eq!(plan.n_splits, 3, "{plan:?}");
    assert_eq!(plan.launches[0].grid, [1, 64, 3]);
    assert_eq!(plan.launches[1].kernel, "optd_combine_d128");
    assert_eq!(plan.launches[1].grid, [16, 1, 1]);
    // Chunked prefill: SQ query rows (not SK) make the query blocks, SK the key tiles.
    let plan = t.plan(&p, &gqa(1, 8, 2, 100, 1000, 64, true, Layout::Bhsd), &dev).unwrap();
    assert_eq!(plan.launches[0].grid, [7, 8, 3]);
    assert_eq!(plan.launches[1].grid, [200, 1, 1]);
}

#[test]
fn every_knob_combination_plans_every_default_shape() {
    let dev = common::h100();
    let config = optimizerd::spec::config::Config::parse("", std::path::Path::new("x"), std::path::Path::new(".")).unwrap();
    let extra = [
        shape(1, 1, 1, 64, false),
        shape(1, 1, 17, 128, true),
        shape(1, 2, 4097, 64, true),
        gqa(2, 32, 8, 1, 4096, 128, true, Layout::Bshd),
        gqa(1, 32, 1, 4, 999, 64, false, Layout::Bhsd),
        gqa(1, 8, 2, 100, 1000, 128, true, Layout::Bshd),
    ];
    for file in ["baseline.cu", "kv_split.cu", "memory.cu", "mma_fa2.cu", "wmma.cu", "testing/oob_write.cu", "testing/infinite_loop.cu"] {
        let t = Template::load(&templates_dir(), file).unwrap();
        let space: Vec<(String, Vec<i64>)> = t.knobs.clone();
        let mut s = optimizerd::strategy::search::Search::new(optimizerd::strategy::search::SearchKind::Exhaustive, space, t.default_params(), 10_000);
        let (mut n, mut too_big) = (0, 0);
        while let Some(p) = s.next() {
            n += 1;
            let shapes: Vec<Shape> = config.shapes().into_iter().chain(extra).collect();
            // A combination that needs more shared memory than the device has is the
            // gate's to reject (mma-fa2's KV_WARPS 4 at D 128); anything else is a bug.
            let plans = match gate::check(&t, &p, &shapes, &dev, "1") {
                Ok(plans) => plans,
                Err(e) if e.0.contains("dynamic shared memory, device allows") => {
                    too_big += 1;
                    continue;
                }
                Err(e) => panic!("{file} {p:?}: {}", e.0),
            };
            for plan in plans {
                for l in &plan.launches {
                    assert!(l.ctas() >= 1 && l.dyn_smem <= dev.smem_optin, "{file} {p:?} {l:?}");
                }
            }
        }
        assert!(n >= 1, "{file} has no knob combination");
        assert!(too_big * 4 <= n, "{file}: {too_big} of {n} combinations do not fit the H100's shared memory");
    }
}

#[test]
fn the_gate_demands_enough_ctas_to_fill_the_gpu() {
    let t = Template::load(&templates_dir(), "kv_split.cu").unwrap();
    let dev = common::h100();
    let shapes = [shape(1, 1, 512, 64, false)];
    let min = "min(SMS, B * HQ * cdiv(SQ, 32))";
    let no_split = params(&t, &[("BLOCK_M", 64), ("MAX_SPLITS", 1)]);
    let err = gate::check(&t, &no_split, &shapes, &dev, min).unwrap_err();
    assert!(err.0.contains("8 CTAs") && err.0.contains("at least 16"), "{}", err.0);
    let split = params(&t, &[("BLOCK_M", 64), ("MAX_SPLITS", 16)]);
    assert!(gate::check(&t, &split, &shapes, &dev, min).is_ok());
}

const SYNTHETIC: &str = r#"
/* optimizerd:spec
[template]
name = "synthetic"
[knobs]
TILE = [1, 4096]
[[launch]]
kernel = "fwd"
grid = ["1 if TILE == 1 else cdiv(SQ, 64)", "B * HQ", "1"]
block = ["128", "1", "1"]
smem = "TILE * D * 2"
*/
"#;

#[test]
fn the_gate_rejects_a_one_cta_grid_and_too_much_shared_memory() {
    let t = Template::parse("synthetic.cu", SYNTHETIC.to_string()).unwrap();
    let dev = common::h100();
    let shapes = [shape(4, 16, 1024, 64, false)];
    let one = params(&t, &[("TILE", 1)]);
    let err = gate::check(&t, &one, &shapes, &dev, "SMS").unwrap_err();
    assert!(err.0.contains("64 CTAs") && err.0.contains("at least 132"), "{}", err.0);
    let huge = params(&t, &[("TILE", 4096)]);
    let err = gate::check(&t, &huge, &shapes, &dev, "1").unwrap_err();
    assert!(err.0.contains("524288 B") && err.0.contains("232448"), "{}", err.0);
}

#[test]
fn a_formula_error_names_the_template_and_the_formula() {
    let bad = SYNTHETIC.replace("TILE * D * 2", "TILES * D");
    let t = Template::parse("bad.cu", bad).unwrap();
    let err = gate::check(&t, &t.default_params(), &[shape(1, 1, 8, 64, false)], &common::h100(), "1").unwrap_err();
    assert!(err.0.contains("synthetic") && err.0.contains("TILES * D"), "{}", err.0);
}

#[test]
fn a_stage_named_like_the_runs_own_iterations_is_rejected() {
    for name in ["warm-start", "open/compute-d64"] {
        let text = format!("[[stage]]\nname = \"{name}\"\ntemplate = \"baseline.cu\"\nsearch = \"exhaustive\"\n");
        let err = Plan::parse(&PathBuf::from("p.toml"), &text, &templates_dir()).unwrap_err().to_string();
        assert!(err.contains(&format!("the stage name `{name}` is reserved")) && err.contains("rename the stage"), "{err}");
    }
}

/// An exhaustive stage takes its space in order and stops at max_candidates: a knob added to a
/// template that the stage's `space` does not pin enters the product with every value and
/// silently cuts the stage's coverage (wgmma-tma's TAIL_SPLIT doubled the Hopper stage to 32
/// points with max_candidates 16, and an 8-minute LLM run never reached BLOCK_N 192).
#[test]
fn every_exhaustive_stage_of_the_shipped_plans_covers_its_whole_space() {
    for plan in ["default.toml", "fault-drill.toml"] {
        let path = common::repo_root().join("strategies").join(plan);
        let p = Plan::load(&path, &templates_dir()).unwrap_or_else(|e| panic!("{plan}: {e}"));
        for stage in &p.stages {
            if let Some((points, max, unpinned)) = stage.truncated() {
                panic!(
                    "{plan}: stage `{}` searches {points} points but stops at max_candidates = {max}: pin the knobs it does not mean to search in its `space` (unpinned: {unpinned:?})",
                    stage.spec.name
                );
            }
        }
    }
}

/// `[[refuse]]`: where `when` holds, the plan fails with the template's reason, the gate
/// refuses the candidate for that shape only (saying why), and a `when` naming what no
/// formula sees, or a refusal without a reason, is refused when the template is read.
#[test]
fn a_refused_point_is_gated_with_its_reason_and_a_bad_refusal_is_caught_at_parse() {
    let spec = |refuse: &str| {
        format!(
            "/* optimizerd:spec\n[template]\nname = \"t\"\nhead_dims = [64, 256]\n[knobs]\nW = [2, 3]\n[derived]\nsplits = \"1\"\n\
             {refuse}\n[[launch]]\nkernel = \"fwd\"\ngrid = [\"B * HQ\", \"1\", \"1\"]\nblock = [\"32 * W\", \"1\", \"1\"]\nsmem = \"0\"\n*/\n"
        )
    };
    let t = Template::parse("t.cu", spec("[[refuse]]\nwhen = \"D == 256 and W == 3\"\nwhy = \"three warps cannot hold O at D 256\"")).unwrap();
    let dev = common::h100();
    let (d64, d256) = (shape(1, 8, 128, 64, false), shape(1, 8, 128, 256, false));
    let w3 = params(&t, &[("W", 3)]);
    let err = t.plan(&w3, &d256, &dev).unwrap_err().to_string();
    assert!(err.contains("three warps cannot hold O at D 256") && err.contains("D == 256 and W == 3") && err.contains("fix:"), "{err}");
    assert!(t.plan(&w3, &d64, &dev).is_ok() && t.plan(&params(&t, &[("W", 2)]), &d256, &dev).is_ok());
    let each = gate::check_each(&t, &w3, &[d64, d256], &dev, "1").unwrap();
    assert_eq!(each.plans.len(), 1);
    assert_eq!(each.refused.len(), 1);
    assert!(each.refused[0].0 == d256.key() && each.refused[0].1.contains("three warps"), "{:?}", each.refused);

    let err = Template::parse("t.cu", spec("[[refuse]]\nwhen = \"D == 256 and WARPS == 3\"\nwhy = \"x\"")).unwrap_err().to_string();
    assert!(err.contains("refuse[0].when") && err.contains("WARPS"), "{err}");
    let err = Template::parse("t.cu", spec("[[refuse]]\nwhen = \"D == 256\"\nwhy = \" \"")).unwrap_err().to_string();
    assert!(err.contains("no `why`"), "{err}");
    let err = Template::parse("t.cu", spec("[[refuse]]\nwhen = \"D == 256\"\nwhy = \"x\"\nbecause = \"y\"")).unwrap_err().to_string();
    assert!(err.contains("because"), "{err}");
}

/// wgmma_tma.cu refuses 3 consumer warpgroups at D 256 by its `[[refuse]]` (their registers
/// cannot hold O), not by a shared-memory figure: its formula gives the layout's real bytes.
#[test]
fn wgmma_tma_refuses_three_consumers_at_d256_with_the_register_reason() {
    let t = Template::load(&templates_dir(), "wgmma_tma.cu").unwrap();
    let dev = common::h100();
    let p = params(&t, &[("CONSUMERS", 3), ("BLOCK_N", 64), ("STAGES", 2), ("EPI_TMA", 0), ("Q_STAGES", 1)]);
    let err = gate::check(&t, &p, &[gqa(1, 16, 8, 4096, 4096, 256, true, Layout::Bhsd)], &dev, "1").unwrap_err();
    assert!(err.0.contains("registers") && !err.0.contains("shared memory"), "{}", err.0);
    assert!(gate::check(&t, &p, &[gqa(1, 16, 8, 4096, 4096, 128, true, Layout::Bhsd)], &dev, "1").is_ok());
    let smem = t.layout_smem(&p, 256);
    assert_eq!(smem[0].1, Ok(1024 + 2 * 256 * (192 + 2 * 2 * 64)), "{smem:?}");
}

/// `knobs_read`: the knobs a formula depends on, through the derived values it reads.
#[test]
fn knobs_read_follows_derived_values_to_the_knobs() {
    let t = Template::load(&templates_dir(), "wgmma_tma.cu").unwrap();
    let smem: Vec<&str> = t.launches.iter().map(|l| l.smem.as_str()).collect();
    // CLUSTER_SPLIT through q_slots: a cluster per tile is never persistent (one Q slot).
    assert_eq!(t.knobs_read(&smem), ["BLOCK_N", "STAGES", "CONSUMERS", "PERSISTENT", "EPI_TMA", "Q_STAGES", "CLUSTER_SPLIT"]);
    // box_rows "64 // pack": pack is derived from PACK_GQA (and the shape's G).
    let q = &t.tensor_maps[0];
    assert_eq!(t.knobs_read(&[q.box_rows.as_str(), q.swizzle.as_str()]), ["PACK_GQA"]);
    assert!(t.knobs_read(&["D * 2"]).is_empty());
    assert_eq!(t.knobs_read(&["(("]).len(), t.knobs.len(), "a formula that does not compile reads everything");
}
