//! scripts/sdpa_baseline.py on CPU against a fake torch (tests/fixtures/fake_torch: shapes,
//! strides and a simulated clock; it logs every attention call) and a fake FlashAttention-4
//! (tests/fixtures/fake_fa4): the shapes as optimizerd writes them (version 2 and version 1),
//! how SDPA is called (enable_gqa, the bottom-right causal mask, bshd views), the fallbacks a
//! backend's refusals lead to, and FA4 present or absent.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

#[derive(Debug)]
struct Ran {
    out: Value,
    /// Every attention call the fakes saw.
    calls: Vec<Value>,
    stderr: String,
}

fn run_script(dir: &Path, shapes: &Value, with_fa4: bool, args: &[&str]) -> Result<Ran, String> {
    run_script_env(dir, shapes, with_fa4, args, &[])
}

fn run_script_env(dir: &Path, shapes: &Value, with_fa4: bool, args: &[&str], env: &[(&str, &str)]) -> Result<Ran, String> {
    let fixtures = common::repo_root().join("tests/fixtures");
    let mut path = fixtures.join("fake_torch").display().to_string();
    if with_fa4 {
        path = format!("{path}:{}", fixtures.join("fake_fa4").display());
    }
    let shapes_file = dir.join("shapes.json");
    std::fs::write(&shapes_file, shapes.to_string()).unwrap();
    let log = dir.join("calls.jsonl");
    let _ = std::fs::remove_file(&log);
    let o = Command::new("python3")
        .arg(common::repo_root().join("scripts/sdpa_baseline.py"))
        .args(args)
        .arg("--shapes")
        .arg(&shapes_file)
        .env("PYTHONPATH", path)
        .env("FAKE_TORCH_LOG", &log)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    if !o.status.success() {
        return Err(format!("exit {:?}: {}", o.status.code(), String::from_utf8_lossy(&o.stderr)));
    }
    let out: Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&o.stdout)))?;
    let calls = std::fs::read_to_string(&log).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    Ok(Ran { out, calls, stderr: String::from_utf8_lossy(&o.stderr).into_owned() })
}

/// Llama-3-8B decode (GQA 32/8, one row against 4096 keys), chunked prefill in [B,S,H,D]
/// (bottom-right causal), and a version-1 shape with a head dim FA4 refuses.
fn shapes() -> Value {
    json!([
        {"b": 8, "hq": 32, "hkv": 8, "sq": 1, "sk": 4096, "d": 128, "causal": true, "dtype": "bf16", "layout": "bhsd"},
        {"b": 1, "hq": 32, "hkv": 8, "sq": 512, "sk": 4096, "d": 128, "causal": true, "dtype": "bf16", "layout": "bshd"},
        {"b": 1, "h": 2, "s": 128, "d": 96, "causal": true, "dtype": "fp16"}
    ])
}

#[test]
fn sdpa_is_called_as_a_model_calls_it_and_fa4_is_timed_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let r = run_script(dir.path(), &shapes(), true, &["--target-us", "2000"]).unwrap();
    assert_eq!(r.out["versions"]["fa4"], json!("4.0.0b36+fake"));
    assert!(r.out["versions"].get("fa4_error").is_none());
    // The CuTe DSL's warning about FA4's own aux_data argument (the fake warns on every call) is
    // not in the log; other warnings would be.
    assert!(!r.stderr.contains("aux_data"), "{}", r.stderr);
    let res = r.out["results"].as_array().unwrap();
    assert_eq!(res.len(), 3);

    // Decode: enable_gqa on the 8 KV heads, no mask (one row, the last, sees every key);
    // default dispatches to cuDNN (50 us in the fake), timed by graphs of ~2000 us.
    let dec = &res[0];
    assert_eq!(dec["default"]["picked"], "cudnn");
    assert_eq!((dec["default"]["kv"].as_str(), dec["default"]["mask"].as_str()), (Some("gqa"), Some("none")));
    assert_eq!(dec["default"]["graph_us"], json!(50.0));
    assert_eq!(dec["default"]["calls"], json!(40));
    let first = r.calls.iter().find(|c| c["call"] == "sdpa").unwrap();
    assert_eq!((first["q"].clone(), first["k"].clone(), first["enable_gqa"].clone()), (json!([8, 32, 1, 128]), json!([8, 8, 4096, 128]), json!(true)));
    // efficient refuses enable_gqa: K/V repeated to 32 heads, and the entry says so.
    assert_eq!(dec["efficient"]["kv"], "repeated");
    assert!(dec["efficient"]["fallback"].as_str().unwrap().contains("enable_gqa with mask none: RuntimeError: No available kernel"));
    assert!(r.calls.iter().any(|c| c["forced"] == "efficient" && c["k"] == json!([8, 32, 4096, 128]) && c["enable_gqa"] == false));
    // FA4: [B,S,H,D] copies of the bhsd tensors, GQA natively, 45 us.
    assert_eq!((dec["fa4"]["graph_us"].clone(), dec["fa4"]["ran"].clone(), dec["fa4"]["layout"].clone()), (json!(45.0), json!("fa4"), json!("bshd copy")));
    assert!(r.calls.iter().any(|c| c["call"] == "fa4" && c["q"] == json!([8, 1, 32, 128]) && c["k"] == json!([8, 4096, 8, 128]) && c["contiguous"] == true));

    // Chunked prefill in bshd: SDPA gets transposed views of [B,S,H,D] tensors (head stride D,
    // row stride H*D) and the lower-right mask; the default runs flash under it.
    let chunk = &res[1];
    let sdpa_chunk: Vec<&Value> = r.calls.iter().filter(|c| c["call"] == "sdpa" && c["q"] == json!([1, 32, 512, 128])).collect();
    assert!(!sdpa_chunk.is_empty());
    for c in &sdpa_chunk {
        assert_eq!(c["q_stride"], json!([512 * 32 * 128, 128, 32 * 128, 1]), "Q must be a view of a [B,S,H,D] tensor: {c}");
        if c["enable_gqa"] == true {
            assert_eq!(c["k_stride"], json!([4096 * 8 * 128, 128, 8 * 128, 1]), "{c}");
        } else {
            assert_eq!(c["k"], json!([1, 32, 4096, 128]), "without enable_gqa K/V are repeated copies: {c}");
        }
    }
    assert_eq!((chunk["default"]["mask"].as_str(), chunk["default"]["picked"].as_str()), (Some("lower_right"), Some("flash")));
    // cuDNN forced: under the lower-right mask flash's kernels run (both K/V forms), so it is
    // measured with an explicit boolean mask instead, and says why.
    assert_eq!((chunk["cudnn"]["ran"].as_str(), chunk["cudnn"]["mask"].as_str(), chunk["cudnn"]["graph_us"].as_f64()), (Some("cudnn"), Some("explicit"), Some(50.0)));
    let why = chunk["cudnn"]["fallback"].as_str().unwrap();
    assert!(why.contains("enable_gqa with mask lower_right: ran flash's kernels instead") && why.contains("repeated K/V with mask lower_right"), "{why}");
    // FA4 on the bshd tensors themselves, bottom-right causal.
    assert!(r.calls.iter().any(|c| c["call"] == "fa4" && c["q"] == json!([1, 512, 32, 128]) && c["causal"] == true && c["contiguous"] == true));
    assert_eq!(chunk["fa4"]["layout"], "bshd");

    // A version-1 shape: h = 2 for both, s = 128 for both, is_causal; FA4 refuses D 96 and the
    // error is recorded for that shape only.
    let v1 = &res[2];
    assert_eq!((v1["default"]["kv"].as_str(), v1["default"]["mask"].as_str()), (Some("mha"), Some("is_causal")));
    assert!(r.calls.iter().any(|c| c["q"] == json!([1, 2, 128, 96]) && c["k"] == json!([1, 2, 128, 96]) && c["mask"] == "is_causal"));
    assert!(v1["fa4"]["error"].as_str().unwrap().contains("head dim 96"), "{}", v1["fa4"]);
    assert!(v1["fa4"].get("graph_us").is_none());
    assert_eq!(v1["shape"], shapes()[2], "each result echoes its shape as given");
}

#[test]
fn without_fa4_everything_else_is_measured_and_the_answer_says_why_fa4_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let r = run_script(dir.path(), &shapes(), false, &[]).unwrap();
    assert_eq!(r.out["versions"]["fa4"], Value::Null);
    let why = r.out["versions"]["fa4_error"].as_str().unwrap();
    assert!(why.contains("flash_attn.cute does not import") && why.contains("flash_attn"), "{why}");
    assert!(r.out["method"]["fa4"].as_str().unwrap().starts_with("not measured"));
    for res in r.out["results"].as_array().unwrap() {
        assert!(res.get("fa4").is_none(), "no fa4 entry without FA4: {res}");
        assert!(res["default"]["graph_us"].is_number());
    }
    assert!(r.calls.iter().all(|c| c["call"] == "sdpa"));
    // Without --target-us: --calls per graph, as before.
    assert_eq!(r.out["results"][0]["default"]["calls"], json!(20));

    // --versions alone says the same.
    let o = Command::new("python3")
        .arg(common::repo_root().join("scripts/sdpa_baseline.py"))
        .arg("--versions")
        .env("PYTHONPATH", common::repo_root().join("tests/fixtures/fake_torch"))
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["torch"].as_str(), v["cudnn"].as_i64(), v["fa4"].clone()), (Some("2.11.0+fake"), Some(91900), Value::Null));
}

#[test]
fn a_shape_the_script_cannot_read_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    for (bad, says) in [
        (json!({"b": 1, "hq": 6, "hkv": 4, "sq": 1, "sk": 64, "d": 64, "dtype": "fp16"}), "not a multiple of hkv"),
        (json!({"b": 1, "hq": 4, "hkv": 4, "sq": 65, "sk": 64, "d": 64, "dtype": "fp16"}), "sq 65 > sk 64"),
        (json!({"b": 1, "hq": 4, "hkv": 4, "sq": 1, "sk": 64, "d": 64, "dtype": "fp16", "layout": "sbhd"}), "neither bhsd nor bshd"),
        (json!({"b": 1, "sq": 1, "sk": 64, "d": 64, "dtype": "fp16"}), "has no hq or h"),
    ] {
        let err = run_script(dir.path(), &json!([shapes()[0], bad]), false, &[]).unwrap_err();
        assert!(err.starts_with("exit Some(2)") && err.contains(says), "{bad}: {err}");
        assert!(!dir.path().join("calls.jsonl").exists(), "nothing measured before the shapes are read");
    }
}

/// --sustained-ms: the default backend's graph and FA4's replayed back to back for at least
/// that long (the named backends' are not: nothing compares them sustained); the fake GPU slows down 1.2x after 20 ms of back-to-back replays, so the sustained
/// figure is slower than the burst one, as on a real GPU.
#[test]
fn sustained_timing_replays_each_graph_for_the_asked_time_with_and_without_fa4() {
    let dir = tempfile::tempdir().unwrap();
    let throttle = [("FAKE_TORCH_THROTTLE", "1.2")];
    let r = run_script_env(dir.path(), &shapes(), true, &["--target-us", "2000", "--sustained-ms", "200"], &throttle).unwrap();
    assert_eq!(r.out["method"]["sustained_ms"], json!(200.0));
    let dec = &r.out["results"][0];
    for name in ["default", "fa4"] {
        let e = &dec[name];
        let (burst, sus) = (e["graph_us"].as_f64().unwrap(), e["sustained_us"].as_f64().unwrap());
        assert!(e["sustained_ms"].as_f64().unwrap() >= 200.0, "{name}: the window lasts at least 200 ms: {e}");
        // 2 ms replays: ~100 of them; the first 20 ms at boost, the rest 1.2x slower.
        assert!(e["sustained_replays"].as_u64().unwrap() >= 100, "{e}");
        assert!(sus > 1.15 * burst && sus < 1.2 * burst, "{name}: burst {burst} sustained {sus}");
    }
    assert_eq!(dec["default"]["graph_us"], json!(50.0), "the burst figure is unchanged by the sustained windows");
    let named: Vec<&str> = ["flash", "cudnn", "efficient"].into_iter().filter(|n| dec[*n]["graph_us"].is_number()).collect();
    assert!(!named.is_empty(), "{dec}");
    for name in named {
        assert!(dec[name].get("sustained_us").is_none(), "{name}: burst timing only: {}", dec[name]);
    }
    // FA4 refusing a shape: an error, no sustained figure.
    let v1 = &r.out["results"][2];
    assert!(v1["fa4"]["error"].is_string() && v1["fa4"].get("sustained_us").is_none());
    assert!(v1["default"]["sustained_us"].is_number());

    // Without FA4: the default backend is timed sustained; no fa4 entry.
    let r = run_script_env(dir.path(), &shapes(), false, &["--target-us", "2000", "--sustained-ms", "200"], &throttle).unwrap();
    assert!(r.out["versions"]["fa4_error"].as_str().unwrap().contains("does not import"));
    for res in r.out["results"].as_array().unwrap() {
        assert!(res.get("fa4").is_none());
        assert!(res["default"]["sustained_us"].as_f64().unwrap() > res["default"]["graph_us"].as_f64().unwrap());
    }

    // A CPU slower to dispatch a call (100 us) than the GPU to run it (50): eager calls show
    // the dispatch, but the graph is still sized by GPU time, 2000 us / 50 us = 40 calls (sized
    // by the eager time it was 20, the replay's fixed cost over half as many calls).
    let slow_cpu = [("FAKE_TORCH_DISPATCH_US", "100")];
    let r = run_script_env(dir.path(), &shapes(), false, &["--target-us", "2000"], &slow_cpu).unwrap();
    let dec = &r.out["results"][0]["default"];
    assert_eq!((dec["calls"].clone(), dec["graph_us"].clone(), dec["eager_us"].clone()), (json!(40), json!(50.0), json!(100.0)), "{dec}");

    // Without --sustained-ms: no sustained fields, as before.
    let r = run_script_env(dir.path(), &shapes(), true, &["--target-us", "2000"], &throttle).unwrap();
    assert!(r.out["results"][0]["default"].get("sustained_us").is_none());
    assert!(r.out["results"][0]["fa4"].get("sustained_us").is_none());
    assert_eq!(r.out["results"][0]["default"]["graph_us"], json!(50.0), "short replays never throttle");
}
