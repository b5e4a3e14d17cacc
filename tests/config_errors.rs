//! Config errors name the file, the line, the key and what is allowed.

use std::path::Path;

use optimizerd::spec::config::{Config, DEFAULT_CONFIG};

fn parse(text: &str) -> Result<Config, String> {
    Config::parse(text, Path::new("/etc/agent.toml"), Path::new("/etc")).map_err(|e| e.to_string())
}

#[test]
fn the_embedded_file_equals_the_built_in_defaults() {
    let from_file = parse(DEFAULT_CONFIG).unwrap();
    let from_nothing = parse("").unwrap();
    assert_eq!(from_file.workload, from_nothing.workload);
    assert_eq!(from_file.timing, from_nothing.timing);
    assert_eq!(from_file.check, from_nothing.check);
    assert_eq!(from_file.worker, from_nothing.worker);
    assert_eq!(from_file.run, from_nothing.run);
    assert_eq!(from_file.baseline, from_nothing.baseline);
    assert_eq!(from_file.agent, from_nothing.agent);
    assert!(!from_file.agent.enabled(), "the agent is opt-in");
    assert_eq!(from_file.shapes().len(), 8);
}

#[test]
fn an_unknown_key_names_file_line_key_and_the_allowed_keys() {
    let err = parse("[timing]\nwarmup = 3\nwarmpu = 5\n").unwrap_err();
    assert!(err.starts_with("/etc/agent.toml:3:"), "{err}");
    assert!(err.contains("warmpu"), "{err}");
    assert!(err.contains("samples_per_round"), "allowed keys missing: {err}");
}

#[test]
fn an_unknown_section_is_an_error() {
    let err = parse("[timming]\nwarmup = 3\n").unwrap_err();
    assert!(err.contains("timming") && err.contains("workload"), "{err}");
}

#[test]
fn a_bad_enum_value_lists_the_allowed_values() {
    let err = parse("[workload]\ndtype = \"fp8\"\n").unwrap_err();
    assert!(err.starts_with("/etc/agent.toml:2:"), "{err}");
    assert!(err.contains("fp8") && err.contains("fp16") && err.contains("bf16"), "{err}");
}

#[test]
fn a_bad_head_dim_names_the_shape_and_allowed_values() {
    let err = parse("[workload]\nshapes = [ { b = 1, h = 1, s = 8, d = 80 } ]\n").unwrap_err();
    assert!(err.contains("workload.shapes[0].d") && err.contains("[64, 96, 128, 256]"), "{err}");
    // Phi-3-mini's 96 and Gemma's 256 load.
    for d in [96, 256] {
        parse(&format!("[workload]\nshapes = [ {{ b = 1, hq = 16, hkv = 8, sq = 1, sk = 4096, d = {d} }} ]\n")).unwrap_or_else(|e| panic!("d {d}: {e}"));
    }
}

#[test]
fn a_bad_duration_says_how_to_write_one() {
    let err = parse("[worker]\ncheck_timeout = \"two minutes\"\n").unwrap_err();
    assert!(err.contains("/etc/agent.toml:2:") && err.contains("\"5m\""), "{err}");
}

#[test]
fn a_zero_or_out_of_range_value_is_rejected_with_its_key() {
    let err = parse("[timing]\nrounds = 0\n").unwrap_err();
    assert!(err.contains("timing.rounds") && err.contains("at least 1"), "{err}");
    let err = parse("[timing]\nmin_gain = 1.5\n").unwrap_err();
    assert!(err.contains("timing.min_gain") && err.contains("0 <= min_gain < 1"), "{err}");
    let err = parse("[timing]\nsustained_ms = -1\n").unwrap_err();
    assert!(err.contains("timing.sustained_ms") && err.contains("0 (off)"), "{err}");
    let err = parse("[timing]\nrerank_top = 0\n").unwrap_err();
    assert!(err.contains("timing.rerank_top") && err.contains("1 (no re-rank)"), "{err}");
    let err = parse("[timing]\nrerank_min_gain = -0.01\n").unwrap_err();
    assert!(err.contains("timing.rerank_min_gain") && err.contains("0 <= rerank_min_gain < 1"), "{err}");
    let err = parse("[worker]\nlookahead_depth = 0\n").unwrap_err();
    assert!(err.contains("worker.lookahead_depth") && err.contains("1 to 8") && err.contains("lookahead = false"), "{err}");
    let err = parse("[worker]\nlookahead_depth = 9\n").unwrap_err();
    assert!(err.contains("worker.lookahead_depth") && err.contains("is 9"), "{err}");
    assert_eq!(parse("[worker]\nlookahead_depth = 8\n").unwrap().worker.lookahead_depth, 8);
    let err = parse("[worker]\ncompile_threads = 65\n").unwrap_err();
    assert!(err.contains("worker.compile_threads") && err.contains("is 65") && err.contains("0 (a quarter"), "{err}");
    assert_eq!(parse("[worker]\ncompile_threads = 3\n").unwrap().worker.compile_threads, 3);
}

#[test]
fn sustained_timing_is_on_for_the_closing_only() {
    let c = parse("").unwrap();
    assert_eq!((c.timing.sustained_ms, c.timing.rerank_top, c.timing.rerank_min_gain), (200.0, 3, 0.01));
    assert_eq!(c.timing_spec().sustained_ms, 0.0, "candidates are timed in bursts");
    assert_eq!(c.sustained_spec().sustained_ms, 200.0);
    assert_eq!(parse("[timing]\nsustained_ms = 0\n").unwrap().sustained_spec().sustained_ms, 0.0);
}

#[test]
fn a_missing_file_names_the_path() {
    let err = Config::load_file(Path::new("/nonexistent/agent.toml")).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/agent.toml"), "{err}");
}

#[test]
fn a_partial_file_keeps_defaults_for_the_rest() {
    let c = parse("[timing]\nrounds = 9\n").unwrap();
    assert_eq!(c.timing.rounds, 9);
    assert_eq!(c.timing.samples_per_round, 10);
    assert_eq!(c.workload.shapes.len(), 8);
}

#[test]
fn agent_keys_are_checked_with_file_line_and_key() {
    let err = parse("[agent]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\ntemperature = 3.0\n").unwrap_err();
    assert!(err.starts_with("/etc/agent.toml:4:") && err.contains("agent.temperature") && err.contains("0 ..= 2"), "{err}");
    let err = parse("[agent]\nbase_url = \"127.0.0.1:9\"\nmodel = \"m\"\n").unwrap_err();
    assert!(err.contains(":2:") && err.contains("agent.base_url"), "{err}");
    let err = parse("[agent]\nbase_url = \"http://x/v1\"\n").unwrap_err();
    assert!(err.contains("agent.model"), "{err}");
    let err = parse("[agent]\napi_key_env = \"sk-123 secret\"\n").unwrap_err();
    assert!(err.contains("agent.api_key_env") && err.contains("environment variable"), "{err}");
    let err = parse("[agent]\nbase_url = \"http://x/v1\"\nmodell = \"m\"\n").unwrap_err();
    assert!(err.starts_with("/etc/agent.toml:3:") && err.contains("modell"), "{err}");
    let ok = parse("[agent]\nbase_url = \"http://127.0.0.1:8000/v1\"\nmodel = \"qwen\"\nusd_per_mtok_prompt = 2.0\nusd_per_mtok_completion = 8.0\n").unwrap();
    assert!(ok.agent.enabled());
    assert!((ok.agent.cost(1_000_000, 500_000) - 6.0).abs() < 1e-9);
}

// ---------------------------------------------------------------------------------------
// The workload grammar: GQA heads, SQ/SK, layout (issue 17)

use optimizerd::spec::protocol::{DType, Layout, Shape};

fn shapes_of(text: &str) -> Vec<Shape> {
    parse(text).unwrap_or_else(|e| panic!("{e}")).shapes()
}

#[test]
fn grouped_query_decode_and_chunked_prefill_shapes_parse_with_readable_keys() {
    let shapes = shapes_of(
        r#"
[workload]
dtype = "bf16"
layout = "bshd"
shapes = [
  { b = 8, hq = 32, hkv = 8, sq = 1, sk = 4096, d = 128, causal = true },
  { b = 1, hq = 32, hkv = 1, sq = 512, sk = 4096, d = 128, causal = true },
  { b = 2, h = 16, s = 1024, d = 64 },
]
"#,
    );
    let keys: Vec<String> = shapes.iter().map(|s| s.key()).collect();
    assert_eq!(
        keys,
        ["b8hq32hkv8sq1sk4096d128-causal-bf16-bshd", "b1hq32hkv1sq512sk4096d128-causal-bf16-bshd", "b2h16s1024d64-bf16-bshd"]
    );
    let decode = shapes[0];
    assert_eq!((decode.hq, decode.hkv, decode.sq, decode.sk, decode.group()), (32, 8, 1, 4096, 4));
    assert!(decode.is_decode() && !shapes[1].is_decode());
    assert_eq!(decode.layout, Layout::Bshd);
    assert_eq!(decode.kv_bytes(), 2 * 8 * 8 * 4096 * 128 * 2);
    // Causal with SQ < SK is bottom-right: each of the 512 rows sees 3584 + its index + 1 keys.
    let chunk = shapes[1];
    assert_eq!(chunk.flops(), 4.0 * 32.0 * 128.0 * (512.0 * 3584.0 + 512.0 * 513.0 / 2.0));
}

/// A sliding window (Gemma's local layers, Mistral): a causal shape's `window`, in its key,
/// and the same shape without it is another shape.
#[test]
fn a_sliding_window_is_a_key_of_a_causal_shape() {
    let shapes = shapes_of(
        r#"
[workload]
dtype = "bf16"
shapes = [
  { b = 1, hq = 16, hkv = 8, s = 4096, d = 256, causal = true, window = 1024 },
  { b = 1, hq = 16, hkv = 8, s = 4096, d = 256, causal = true },
  { b = 8, hq = 16, hkv = 8, sq = 1, sk = 8192, d = 256, causal = true, window = 1024 },
]
"#,
    );
    let keys: Vec<String> = shapes.iter().map(|s| s.key()).collect();
    assert_eq!(
        keys,
        [
            "b1hq16hkv8s4096d256-causal-w1024-bf16",
            "b1hq16hkv8s4096d256-causal-bf16",
            "b8hq16hkv8sq1sk8192d256-causal-w1024-bf16"
        ]
    );
    assert_eq!(shapes[0].window, Some(1024));
    // The window's FLOPs: the first 1023 rows see 1..=1023 keys, the other 3073 rows 1024 each.
    assert_eq!(
        shapes[0].flops(),
        4.0 * 16.0 * 256.0 * (1023.0 * 1024.0 / 2.0 + 3073.0 * 1024.0)
    );
    assert_eq!(
        shapes[2].visible_range(0),
        8192 - 1024..8192,
        "decode reads the last 1024 keys"
    );
}

/// Version-1 configs, keys and stored shapes keep working: `h`/`s` mean HQ = HKV and SQ = SK
/// in [B,H,S,D], with the same keys as before.
#[test]
fn version_one_shapes_keep_their_keys_and_json() {
    let shapes = shapes_of("[workload]\nshapes = [ { b = 4, h = 16, s = 1024, d = 64, causal = true } ]\n");
    assert_eq!(shapes, vec![Shape::mha(4, 16, 1024, 64, true, DType::Fp16)]);
    assert_eq!(shapes[0].key(), "b4h16s1024d64-causal");
    let v1: Shape = serde_json::from_str(r#"{"b":4,"h":16,"s":1024,"d":64,"causal":true,"dtype":"fp16"}"#).unwrap();
    assert_eq!(v1, shapes[0]);
    let round: Shape = serde_json::from_str(&serde_json::to_string(&shapes[0]).unwrap()).unwrap();
    assert_eq!(round, shapes[0]);
    let v2 = serde_json::to_value(shapes[0]).unwrap();
    assert_eq!((v2["hq"].as_u64(), v2["sk"].as_u64(), v2["layout"].as_str()), (Some(16), Some(1024), Some("bhsd")));
}

#[test]
fn each_bad_combination_names_its_key_and_the_fix() {
    let cases = [
        (
            "{ b = 1, hq = 32, hkv = 5, sq = 1, sk = 64, d = 128 }",
            "workload.shapes[0].hq",
            "not a multiple of hkv = 5",
        ),
        (
            "{ b = 1, hq = 8, hkv = 8, sq = 65, sk = 64, d = 128 }",
            "workload.shapes[0].sq",
            "sq <= sk",
        ),
        (
            "{ b = 1, hq = 8, sq = 1, sk = 64, d = 128 }",
            "workload.shapes[0].hkv",
            "give hkv too",
        ),
        (
            "{ b = 1, hkv = 8, sq = 1, sk = 64, d = 128 }",
            "workload.shapes[0].hq",
            "give hq too",
        ),
        (
            "{ b = 1, h = 8, hq = 8, hkv = 2, s = 64, d = 128 }",
            "workload.shapes[0].h",
            "use h alone",
        ),
        (
            "{ b = 1, h = 8, sq = 1, d = 128 }",
            "workload.shapes[0].sk",
            "give sk too",
        ),
        (
            "{ b = 1, h = 8, sk = 64, d = 128 }",
            "workload.shapes[0].sq",
            "give sq too",
        ),
        (
            "{ b = 1, h = 8, s = 64, sq = 1, sk = 64, d = 128 }",
            "workload.shapes[0].s",
            "use s alone",
        ),
        (
            "{ b = 1, h = 8, d = 128 }",
            "workload.shapes[0].s",
            "is missing",
        ),
        (
            "{ b = 1, s = 8, d = 128 }",
            "workload.shapes[0].h",
            "is missing",
        ),
        (
            "{ b = 1, hq = 8, hkv = 0, sq = 1, sk = 64, d = 128 }",
            "workload.shapes[0].hkv",
            "at least 1",
        ),
        (
            "{ b = 1, hq = 8, hkv = 8, sq = 1, sk = 64, d = 80 }",
            "workload.shapes[0].d",
            "[64, 96, 128, 256]",
        ),
        (
            "{ b = 1, h = 8, s = 64, d = 128, window = 16 }",
            "workload.shapes[0].window",
            "set causal = true",
        ),
        (
            "{ b = 1, h = 8, s = 64, d = 128, causal = true, window = 0 }",
            "workload.shapes[0].window",
            "remove `window` for none",
        ),
    ];
    for (shape, key, fix) in cases {
        let err = parse(&format!("[workload]\nshapes = [ {shape} ]\n")).unwrap_err();
        assert!(err.contains("/etc/agent.toml") && err.contains(key) && err.contains(fix), "{shape}: {err}");
    }
    let err = parse("[workload]\nshapes = [ { b = 1, h = 8, s = 64, d = 64 }, { b = 1, hq = 8, hkv = 8, sq = 64, sk = 64, d = 64 } ]\n").unwrap_err();
    assert!(err.contains("workload.shapes[1]") && err.contains("same shape as workload.shapes[0]"), "{err}");
    let err = parse("[workload]\nlayout = \"bsdh\"\n").unwrap_err();
    assert!(err.contains("bsdh") && err.contains("bhsd") && err.contains("bshd"), "{err}");
}
