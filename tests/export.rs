//! Export: standalone kernels plus a manifest a CUDA host can launch them from.

mod common;

use std::time::Duration;

use common::Project;
use optimizerd::storage::ledger::Ledger;
use serde_json::json;

const PLAN: &str = r#"
[[stage]]
name = "baseline"
template = "baseline.cu"
search = "exhaustive"
max_candidates = 1

[[stage]]
name = "kv-split"
template = "kv_split.cu"
search = "exhaustive"
space = { BLOCK_M = [32], NUM_WARPS = [4], MAX_SPLITS = [8] }

# These tests are about the plan: the run ends when its stages are done.
[open_phase]
enabled = false
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_writes_each_best_kernel_and_a_launch_manifest() {
    let rules = json!([
        { "source_contains": ["template `baseline`"], "behaviour": { "ok": { "us": 100.0, "per_shape": { "b2h8s512d128-causal": 10.0 } } } },
        { "source_contains": ["template `kv-split`"], "behaviour": { "ok": { "us": 20.0 } } }
    ]);
    let p = Project::new(PLAN, rules, json!({ "ok": { "us": 1.0 } }));
    p.append_config("\n[baseline]\nsdpa = false\n");
    p.run("exp", Duration::from_secs(60)).await;
    let ledger = Ledger::open(&p.db()).await.unwrap();
    let out = p.path().join("exported");
    let manifest_path = optimizerd::ops::export::export(&ledger, "exp", &out).await.unwrap();
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&manifest_path).unwrap()).unwrap();
    // kv-split won the small shape, the baseline kernel kept the large one: two kernels.
    let kernels = m["kernels"].as_array().unwrap();
    assert_eq!(kernels.len(), 2, "{m:#}");
    let kv = kernels.iter().find(|k| k["template"] == "kv-split").unwrap();
    assert_eq!(kv["shapes"][0]["key"], "b1h1s128d64");
    assert_eq!(kv["params"]["MAX_SPLITS"], 8);
    assert_eq!(kv["dtype"], "fp16");
    assert_eq!(kv["launches"][0]["kernel"], "optd_fwd_d{D}");
    assert!(kv["launches"][0]["grid"][0].as_str().unwrap().contains("m_blocks"));
    assert_eq!(kv["launches"][1]["when"], "splits > 1");
    assert!(kv["derived"].as_array().unwrap().iter().any(|d| d[0] == "splits"));
    let resolved = &kv["shapes"][0]["launches"];
    assert_eq!(resolved[0]["kernel"], "optd_fwd_d64");
    assert!(kv["shapes"][0]["median_us"].as_f64().unwrap() > 0.0);
    let base = kernels.iter().find(|k| k["template"] == "baseline").unwrap();
    assert_eq!(base["shapes"][0]["key"], "b2h8s512d128-causal");
    assert_eq!(base["shapes"][0]["shape"]["causal"], true);
    // The files are the exact sources that were timed, standalone (no local includes).
    let src = std::fs::read_to_string(out.join(kv["file"].as_str().unwrap())).unwrap();
    assert!(src.contains("#define MAX_SPLITS 8") && src.contains("optd_fwd_d64"));
    assert!(src.starts_with("// Built without the sliding window's code") && src.contains("\n#define OPTD_BUILD_WINDOW 0\n"));
    assert!(!src.lines().any(|l| l.trim_start().starts_with("#include \"")));
    assert_eq!(m["format"], 3, "kernel ABI v3");
    assert_eq!(m["abi"]["args"][12][0], "softmax_scale");
    assert_eq!(m["abi"]["args"][14][0], "window", "the sliding window right after causal");
    assert_eq!(m["abi"]["args"][15][0], "strides");
    assert_eq!(m["abi"]["args"].as_array().unwrap().len(), 17);
    // A run without a windowed shape timed its kernels without the window's code: the file
    // and the manifest say so.
    assert_eq!(kv["windows"], false, "built without the window's code");
    // lse_partial carries the split semaphores after the LSEs, and the zero-on-exit rule.
    assert_eq!(m["abi"]["args"][5][0], "lse_partial");
    let lse = m["abi"]["args"][5][2].as_str().unwrap();
    assert!(lse.contains("(n_splits + 1)*B*HQ*SQ"), "{lse}");
    assert!(lse.contains("split semaphores") && lse.contains("leaves zero"), "{lse}");
    assert_eq!((base["shapes"][0]["shape"]["hq"].as_u64(), base["shapes"][0]["shape"]["layout"].as_str()), (Some(8), Some("bhsd")));
    assert!(m["abi"]["causal"].as_str().unwrap().contains("SK - SQ"), "{}", m["abi"]["causal"]);
    // And they compile as they are.
    let tc = optimizerd::nvrtc::locate().expect("NVRTC (scripts/setup.sh)");
    optimizerd::nvrtc::compile(&tc, &src, "exported.cu", "sm_90", &[]).expect("exported kernel compiles");
}
