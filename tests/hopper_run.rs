//! A Hopper template through the run loop (scripted worker): compiled for sm_90a on an
//! sm_90 GPU with the target recorded, skipped with the reason on an sm_89 GPU, its
//! tensor maps carried into the dispatch table and the export manifest, and resumed.

mod common;

use std::time::Duration;

use common::Project;
use optimizerd::engine::{self, Mode, RunEnd, RunOptions};
use optimizerd::storage::ledger::Ledger;
use serde_json::{json, Value};

const PLAN: &str = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "hopper"
template = "testing/tensor_map_probe.cu"
search = "exhaustive"

[open_phase]
enabled = false
"#;

fn rules() -> Value {
    json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": ["template `test-tensor-map-probe`", "#define BOX_ROWS 64\n"], "behaviour": { "ok": { "us": 50.0 } } },
        { "source_contains": ["template `test-tensor-map-probe`", "#define BOX_ROWS 16\n"], "behaviour": { "ok": { "us": 50.0 } } }
    ])
}

fn project() -> Project {
    let p = Project::new(PLAN, rules(), json!({ "ok": { "us": 500.0 } }));
    p.append_config("\n[baseline]\nsdpa = false\n");
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arch_specific_template_is_compiled_for_sm_90a_and_exported_with_its_tensor_maps() {
    let p = project();
    assert_eq!(p.run("h", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("h").await.unwrap();
    let rows: Vec<(&str, &str, Option<&str>)> = its.iter().map(|i| (i.stage.as_str(), i.verdict.as_str(), i.arch.as_deref())).collect();
    assert_eq!(
        rows,
        vec![("baseline", "baseline", Some("sm_90")), ("hopper", "accepted", Some("sm_90a")), ("hopper", "rejected", Some("sm_90a"))]
    );
    let history = optimizerd::ops::report::history_text(&its);
    assert!(history.lines().next().unwrap().contains("arch"), "{history}");
    assert!(history.lines().any(|l| l.contains("hopper") && l.contains("sm_90a")), "{history}");

    // The dispatch table keeps each shape's resolved maps, so a resume or an export has them.
    let dispatch: Value = serde_json::from_str(&std::fs::read_to_string(p.workspace("h").join("kernels/dispatch.json")).unwrap()).unwrap();
    assert_eq!(dispatch["b1h1s128d64"]["tensor_maps"], json!([{ "tensor": "k", "box_rows": 64, "swizzle": 128 }]));

    let out = p.path().join("exported");
    let manifest = optimizerd::ops::export::export(&ledger, "h", &out).await.unwrap();
    let m: Value = serde_json::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    let k = &m["kernels"][0];
    assert_eq!(k["template"], "test-tensor-map-probe", "{m:#}");
    assert_eq!((k["arch"].clone(), k["arch_specific"].clone()), (json!("sm_90a"), json!(true)));
    assert_eq!(
        k["tensor_maps"],
        json!([{
            "param_index": 17, "tensor": "k", "data_type": "uint16", "rank": 5,
            "dims": ["64", "SK", "D // 64", "HKV", "B"], "strides_bytes": ["strides.k_s * 2", "128", "strides.k_h * 2", "strides.k_b * 2"],
            "box": ["64", "BOX_ROWS", "D // 64", "1", "1"], "element_strides": [1, 1, 1, 1, 1],
            "swizzle_bytes": 128, "interleave": "none", "l2_promotion": "128B", "oob_fill": "none"
        }])
    );
    let shapes = k["shapes"].as_array().unwrap();
    let by_key = |key: &str| shapes.iter().find(|s| s["key"] == key).unwrap_or_else(|| panic!("{key} not exported: {m:#}"));
    let small = &by_key("b1h1s128d64")["tensor_maps"][0];
    assert_eq!((small["param_index"].clone(), small["tensor"].clone()), (json!(17), json!("k")));
    assert_eq!((small["dims"].clone(), small["strides_bytes"].clone(), small["box"].clone()), (json!([64, 128, 1, 1, 1]), json!([128, 128, 16384, 16384]), json!([64, 64, 1, 1, 1])));
    let big = &by_key("b2h8s512d128-causal")["tensor_maps"][0];
    assert_eq!((big["dims"].clone(), big["strides_bytes"].clone(), big["box"].clone()), (json!([64, 512, 2, 8, 2]), json!([256, 128, 131072, 8 * 131072]), json!([64, 64, 2, 1, 1])));
    assert_eq!(big["swizzle_bytes"], 128);
    assert_eq!(big["data_type"], "uint16");
    assert!(m["abi"]["tensor_maps"].as_str().unwrap().contains("__grid_constant__"));
    // The exported source is what was timed, and compiles for the recorded target only.
    let src = std::fs::read_to_string(out.join(k["file"].as_str().unwrap())).unwrap();
    let tc = optimizerd::nvrtc::locate().expect("NVRTC (scripts/setup.sh)");
    optimizerd::nvrtc::compile(&tc, &src, "exported.cu", "sm_90a", &[]).expect("the exported kernel compiles for sm_90a");

    // Resume: the incumbent is rebuilt for sm_90a from its own spec, and re-validated.
    ledger.set_state("h", optimizerd::spec::states::RunState::Stopped, None, None).await.unwrap();
    ledger.close().await;
    assert_eq!(resume(&p, "h", false).await.unwrap(), RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let events = ledger.events("h").await.unwrap();
    assert!(events.iter().any(|e| e.kind.as_str() == "incumbents_revalidated"), "{events:?}");
    ledger.set_state("h", optimizerd::spec::states::RunState::Stopped, None, None).await.unwrap();
    ledger.close().await;
    // On an sm_89 GPU (--rebaseline) the sm_90a incumbent cannot be rebuilt: said plainly.
    p.set_device(&common::l4());
    let err = format!("{:#}", resume(&p, "h", true).await.unwrap_err());
    assert!(err.contains("cannot run on this GPU") && err.contains("needs sm_90a") && err.contains("sm_89"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_an_sm_89_gpu_the_arch_specific_stage_is_skipped_with_the_reason() {
    let p = project();
    p.set_device(&common::l4());
    assert_eq!(p.run("ada", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("ada").await.unwrap();
    let rows: Vec<(&str, Option<&str>)> = its.iter().map(|i| (i.stage.as_str(), i.arch.as_deref())).collect();
    assert_eq!(rows, vec![("baseline", Some("sm_89"))], "nothing of the hopper stage ran");
    let skipped: Vec<String> = ledger.events("ada").await.unwrap().into_iter().filter(|e| e.kind.as_str() == "stage_skipped").map(|e| e.message).collect();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(
        skipped[0].contains("stage hopper skipped")
            && skipped[0].contains("test-tensor-map-probe needs sm_90a (compute capability 9.0); this GPU is sm_89"),
        "{skipped:?}"
    );
}

async fn resume(p: &Project, run_id: &str, rebaseline: bool) -> anyhow::Result<RunEnd> {
    let config = p.config();
    let opts = RunOptions {
        plan_path: config.resolve(&config.run.plan),
        config,
        budget: Duration::from_secs(600),
        worker: p.worker(),
        run_id: Some(run_id.into()),
        seed: Some(7),
        mode: Mode::Resume { rebaseline },
        allow_concurrent: false,
        fresh: false,
        placement: Default::default(),
    };
    engine::run(opts, optimizerd::daemon::shutdown::Shutdown::never()).await.map(|(_, end)| end)
}

/// The gate's post-compile check: a launch whose dynamic shared memory fits the opt-in limit by
/// the formula, but not with the function's static shared memory added, is refused for that
/// shape with both numbers (not launched and crashed), and the candidate goes on with the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_shared_memory_over_the_limit_gates_the_shape_after_the_compile() {
    let p = project();
    // BOX_ROWS 64 at D 128: 1024 + 64 * 128 * 2 = 17408 B of dynamic shared memory; a device
    // allowing 17458 B passes that, and 96 B of static mbarriers take it over.
    p.set_device(&optimizerd::spec::protocol::DeviceInfo { smem_optin: 17458, ..common::h100() });
    p.set_rules(json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0 } } },
        { "source_contains": ["template `test-tensor-map-probe`", "#define BOX_ROWS 64\n"], "behaviour": { "ok": { "us": 50.0 } }, "static_smem": 96 },
        { "source_contains": ["template `test-tensor-map-probe`", "#define BOX_ROWS 16\n"], "behaviour": { "ok": { "us": 60.0 } } }
    ]));
    assert_eq!(p.run("s", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("s").await.unwrap();
    let first = its.iter().find(|i| i.stage == "hopper" && i.params_json.contains("\"BOX_ROWS\":64")).expect("BOX_ROWS 64 ran");
    assert_eq!(first.verdict.as_str(), "accepted", "{}", first.reason);
    assert_eq!(first.static_smem, Some(96));
    let by_key = |k: &str| first.shapes.iter().find(|s| s.shape == k).unwrap_or_else(|| panic!("{k}: {:?}", first.shapes));
    let small = by_key("b1h1s128d64");
    assert_eq!((small.gated.as_deref(), small.won), (None, true));
    let big = by_key("b2h8s512d128-causal");
    let why = big.gated.as_deref().expect("refused after the compile");
    assert!(why.contains("17408 B of dynamic plus 96 B of static shared memory = 17504 B, device allows 17458 B"), "{why}");
    assert_eq!((big.median_us, big.won, big.check_passed), (None, false, None));
}

/// The shipped plan's `hopper-cluster-split` stage: on the workload's grids of fewer work tiles
/// than SMs only, it turns CLUSTER_SPLIT on in the kernel that serves those shapes (not the one
/// that serves most of the workload), one candidate, and a win there changes nothing elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_split_stage_tries_the_under_filled_shapes_own_kernel_split_across_a_cluster() {
    let shipped = std::fs::read_to_string(common::repo_root().join("strategies/default.toml")).unwrap();
    let stage = shipped.split("[[stage]]").find(|s| s.contains("name = \"hopper-cluster-split\"")).expect("the shipped plan has the stage");
    let pinned = "STAGES = [2], CONSUMERS = [2], PINGPONG = [1], OVERLAP = [1], PERSISTENT = [1], LAZY_RESCALE = [1], TAIL_SPLIT = [1], EPI_TMA = [0], PACK_GQA = [0], STREAM_K = [0], LPT_MIB = [8], DYNAMIC = [1], Q_STAGES = [1], PV_WAIT = [1], CLUSTER_SPLIT = [0]";
    let plan = format!(
        "[[stage]]\nname = \"baseline\"\ntemplate = \"baseline.cu\"\nsearch = \"exhaustive\"\nmax_candidates = 1\n\n\
         [[stage]]\nname = \"hopper\"\ntemplate = \"wgmma_tma.cu\"\nsearch = \"exhaustive\"\nspace = {{ BLOCK_N = [128, 64], {pinned} }}\n\n\
         [[stage]]{stage}\n[open_phase]\nenabled = false\n"
    );
    // (1,16,512,128) causal: 4 query tiles x 16 heads = 64 work tiles on 132 SMs; the other two
    // shapes have 512. BLOCK_N 128 wins those two, BLOCK_N 64 the small one.
    let small = "b1h16s512d128-causal";
    let wt = "template `wgmma-tma`";
    let rules = json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 500.0 } } },
        { "source_contains": [wt, "#define CLUSTER_SPLIT 1\n"], "behaviour": { "ok": { "us": 30.0 } } },
        { "source_contains": [wt, "#define BLOCK_N 128\n"], "behaviour": { "ok": { "us": 100.0, "per_shape": { small: 60.0 } } } },
        { "source_contains": [wt, "#define BLOCK_N 64\n"], "behaviour": { "ok": { "us": 120.0, "per_shape": { small: 50.0 } } } }
    ]);
    let p = Project::new(&plan, rules, json!({ "ok": { "us": 900.0 } }));
    p.append_config("\n[baseline]\nsdpa = false\n");
    p.set_workload("shapes = [ { b = 1, h = 16, s = 512, d = 128, causal = true }, { b = 2, h = 16, s = 2048, d = 128 }, { b = 4, h = 16, s = 1024, d = 128, causal = true } ]");
    assert_eq!(p.run("cs", Duration::from_secs(600)).await, RunEnd::Finished("plan exhausted".into()));
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let its = ledger.iterations("cs").await.unwrap();
    let split: Vec<_> = its.iter().filter(|i| i.stage == "hopper-cluster-split").collect();
    assert_eq!(split.len(), 1, "one candidate: {:?}", its.iter().map(|i| (&i.stage, &i.params_json)).collect::<Vec<_>>());
    let params: optimizerd::spec::template::Params = serde_json::from_str(&split[0].params_json).unwrap();
    assert_eq!((params["BLOCK_N"], params["CLUSTER_SPLIT"]), (64, 1), "the small shape's kernel, split: {}", split[0].params_json);
    assert_eq!(split[0].verdict.as_str(), "accepted", "{}", split[0].reason);
    let measured: Vec<&str> = split[0].shapes.iter().filter(|s| s.median_us.is_some()).map(|s| s.shape.as_str()).collect();
    assert_eq!(measured, [small], "only the under-filled shape");
    let dispatch: Value = serde_json::from_str(&std::fs::read_to_string(p.workspace("cs").join("kernels/dispatch.json")).unwrap()).unwrap();
    assert_eq!(dispatch[small]["params"]["CLUSTER_SPLIT"], 1);
    // Two CTAs per query tile along x (clusters of 2), the heads along y.
    assert_eq!(dispatch[small]["launches"][0]["grid"], json!([8, 16, 1]));
    for big in ["b2h16s2048d128", "b4h16s1024d128-causal"] {
        assert_eq!((dispatch[big]["params"]["BLOCK_N"].clone(), dispatch[big]["params"]["CLUSTER_SPLIT"].clone()), (json!(128), json!(0)), "{big}");
    }
}

/// The shipped plan on Hopper tries the wgmma-TMA template first, before the decode stages and the
/// generic prefill stages (a 2-minute run in the method's order spent its budget on kv-split,
/// memory and WMMA candidates of 1-GB prefill shapes and never reached it: docs/BENCHMARKS.md
/// (34); behind the decode stages, a 2-minute run of the LLM workload did not either: (36)); on an
/// L4 that stage is skipped (sm_90a): the decode shapes get decode-split first, and the prefill
/// shapes the generic stages, in the method's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_plan_tries_the_hopper_template_first_on_hopper_and_the_generic_stages_first_elsewhere() {
    let shipped = std::fs::read_to_string(common::repo_root().join("strategies/default.toml")).unwrap();
    for (gpu, device) in [("h100", common::h100()), ("l4", common::l4())] {
        let p = Project::new(&shipped, json!([]), json!({ "ok": { "us": 100.0 } }));
        let script_path = p.path().join("script.json");
        let mut script: Value = serde_json::from_str(&std::fs::read_to_string(&script_path).unwrap()).unwrap();
        script["device"] = serde_json::to_value(device).unwrap();
        std::fs::write(&script_path, script.to_string()).unwrap();
        p.append_config("\n[baseline]\nsdpa = false\n");
        // A prefill shape and a decode shape, as a model's workload has both.
        p.set_workload("shapes = [ { b = 2, h = 8, s = 512, d = 128, causal = true }, { b = 1, hq = 32, hkv = 8, sq = 1, sk = 1024, d = 128, causal = true } ]");
        p.run(gpu, Duration::from_secs(25)).await;
        let its = Ledger::open(&p.db()).await.unwrap().iterations(gpu).await.unwrap();
        let stages: Vec<&str> = its.iter().map(|i| i.stage.as_str()).collect();
        assert!(stages.len() >= 2 && stages[0] == "baseline", "{gpu}: {stages:?}");
        let first = |name: &str| stages.iter().position(|s| *s == name);
        let first_decode = stages.iter().position(|s| s.starts_with("decode")).unwrap_or_else(|| panic!("{gpu}: no decode stage ran: {stages:?}"));
        if gpu == "h100" {
            assert_eq!(stages[1], "tensor-cores-hopper", "{stages:?}");
            let last_hopper = stages.iter().rposition(|s| *s == "tensor-cores-hopper").unwrap();
            assert!(last_hopper < first_decode, "the Hopper stage runs out before the decode stages start: {stages:?}");
            assert_eq!(stages[first_decode], "decode", "{stages:?}");
        } else {
            assert_eq!(stages[1], "decode", "{stages:?}");
            assert!(!stages.iter().any(|s| s.starts_with("tensor-cores-hopper") || *s == "decode-cluster"), "{stages:?}");
            let generic = first("kv-split").or(first("memory")).unwrap_or_else(|| panic!("no generic prefill stage ran: {stages:?}"));
            assert!(stages[generic..].iter().all(|s| !s.starts_with("decode")), "decode-split's stage before the generic ones: {stages:?}");
        }
    }
}
