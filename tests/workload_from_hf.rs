//! `optimizerd workload --from-hf`: a model's transformers config.json becomes the
//! `[workload]` the configuration loader reads back (Llama-3-8B, Qwen2.5-7B, an MQA
//! model, a multimodal config with its language model under text_config), and every
//! config it cannot serve is refused naming the file, the key and the fix.

mod common;

use std::path::Path;

use common::cli::run_in;
use optimizerd::cli::exit;
use optimizerd::ops::workload::{workload_toml, Lengths};
use optimizerd::spec::config::Config;
use optimizerd::spec::hf_config::ModelAttention;
use optimizerd::spec::protocol::{DType, Layout, Shape};
use serde_json::json;

/// Shapes as (b, hq, hkv, sq, sk, d, causal).
type Row = (u32, u32, u32, u32, u32, u32, bool);

fn rows(shapes: &[Shape]) -> Vec<Row> {
    shapes.iter().map(|s| (s.b, s.hq, s.hkv, s.sq, s.sk, s.d, s.causal)).collect()
}

/// Write `config` as config.json in a temporary folder, generate, and load it back.
fn round_trip(config: &serde_json::Value, l: &Lengths, dtype: Option<DType>, layout: Layout) -> (String, Config) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, serde_json::to_string_pretty(config).unwrap()).unwrap();
    let model = ModelAttention::load(&path, dtype).unwrap_or_else(|e| panic!("{e}"));
    let text = workload_toml(&model, l, layout, "optimizerd workload --from-hf config.json").unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("workload.toml");
    std::fs::write(&file, &text).unwrap();
    let loaded = Config::load_file(&file).unwrap_or_else(|e| panic!("{e}\n{text}"));
    (text, loaded)
}

fn lengths(prefill: &[u32], decode: &[u32], chunk: Option<u32>, batch: &[u32]) -> Lengths {
    Lengths { prefill: prefill.to_vec(), decode_context: decode.to_vec(), chunk, draft: Vec::new(), batch: batch.to_vec() }
}

fn llama3_8b() -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rope_theta": 500000.0,
        "torch_dtype": "bfloat16", "vocab_size": 128256
    })
}

#[test]
fn llama_3_8b_gives_prefill_chunked_and_decode_shapes_per_batch() {
    let (text, c) = round_trip(&llama3_8b(), &lengths(&[4096, 1024], &[4096], Some(512), &[1, 8]), None, Layout::Bhsd);
    assert_eq!(c.workload.dtype, DType::Bf16);
    assert_eq!(c.workload.layout, Layout::Bhsd);
    assert_eq!(
        rows(&c.shapes()),
        vec![
            (1, 32, 8, 4096, 4096, 128, true),
            (1, 32, 8, 1024, 1024, 128, true),
            (8, 32, 8, 4096, 4096, 128, true),
            (8, 32, 8, 1024, 1024, 128, true),
            // The last 512 rows of each longer prompt: causal, bottom-right.
            (1, 32, 8, 512, 4096, 128, true),
            (1, 32, 8, 512, 1024, 128, true),
            (8, 32, 8, 512, 4096, 128, true),
            (8, 32, 8, 512, 1024, 128, true),
            // One query row against the cache sees all of it: not causal.
            (1, 32, 8, 1, 4096, 128, false),
            (8, 32, 8, 1, 4096, 128, false),
        ]
    );
    // The header says where it came from; every comment line is a TOML comment.
    assert!(text.starts_with("# Written by `optimizerd workload --from-hf config.json`"), "{text}");
    assert!(text.contains("config.json (llama): 32 query heads over 8 KV heads (grouped-query, 4 per KV head), head dim 128"), "{text}");
    assert!(text.contains("hidden_size / num_attention_heads (4096 / 32)") && text.contains("torch_dtype = \"bfloat16\""), "{text}");
    for kind in ["# prefill", "# chunked prefill", "# decode"] {
        assert_eq!(text.matches(kind).count(), 1, "{kind} once: {text}");
    }
}

#[test]
fn qwen_grouped_heads_bshd_and_repeated_lengths() {
    // Qwen2.5-7B: 28 query heads over 4 KV heads, head_dim from 3584 / 28, a sliding window
    // it does not use.
    let qwen = json!({
        "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
        "sliding_window": 131072, "use_sliding_window": false, "torch_dtype": "bfloat16"
    });
    let (text, c) = round_trip(&qwen, &lengths(&[2048, 2048], &[8192], None, &[4]), None, Layout::Bshd);
    assert_eq!(c.workload.layout, Layout::Bshd);
    assert_eq!(
        rows(&c.shapes()),
        vec![
            (4, 28, 4, 2048, 2048, 128, true),
            (4, 28, 4, 1, 8192, 128, false)
        ],
        "a length given twice is one shape"
    );
    assert!(
        !text.contains("sliding"),
        "an unused window is not a caveat: {text}"
    );
    // Mistral 7B v0.1: every layer has a 4096-key window. A cache within the window is the
    // plain shape; a longer one is written with the window (and only with it).
    let mistral = json!({"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                         "sliding_window": 4096, "dtype": "float16"});
    let (text, c) = round_trip(
        &mistral,
        &lengths(&[], &[1024, 8192], None, &[1]),
        None,
        Layout::Bhsd,
    );
    assert_eq!(
        c.workload.dtype,
        DType::Fp16,
        "transformers 5 writes `dtype`"
    );
    assert!(
        text.contains("# Sliding window: 4096 keys (sliding_window), on every layer"),
        "{text}"
    );
    let keyed: Vec<String> = c.shapes().iter().map(Shape::key).collect();
    assert_eq!(
        keyed,
        [
            "b1hq32hkv8sq1sk1024d128",
            "b1hq32hkv8sq1sk8192d128-causal-w4096"
        ],
        "{text}"
    );
}

#[test]
fn gemma_3_local_and_global_layers_give_both_shapes() {
    // Gemma-3-style language model: 5 of every 6 layers look back 1024 keys, the rest see all.
    let gemma = json!({
        "model_type": "gemma3", "torch_dtype": "bfloat16",
        "text_config": {"model_type": "gemma3_text", "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                        "sliding_window": 1024, "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                        "sliding_attention", "sliding_attention", "full_attention"]}
    });
    let (text, c) = round_trip(
        &gemma,
        &lengths(&[4096, 512], &[8192], Some(256), &[1]),
        None,
        Layout::Bhsd,
    );
    let keyed: Vec<String> = c.shapes().iter().map(Shape::key).collect();
    assert_eq!(
        keyed,
        [
            "b1hq8hkv4s4096d256-causal-bf16",
            "b1hq8hkv4s4096d256-causal-w1024-bf16",
            // Within the window: the window masks nothing, one shape serves both kinds of layer.
            "b1hq8hkv4s512d256-causal-bf16",
            "b1hq8hkv4sq256sk4096d256-causal-bf16",
            "b1hq8hkv4sq256sk4096d256-causal-w1024-bf16",
            "b1hq8hkv4sq256sk512d256-causal-bf16",
            "b1hq8hkv4sq1sk8192d256-bf16",
            "b1hq8hkv4sq1sk8192d256-causal-w1024-bf16",
        ],
        "{text}"
    );
    assert!(
        text.contains("text_config.layer_types: 5 of 6 sliding_attention"),
        "{text}"
    );
}

#[test]
fn multi_query_and_a_multimodal_text_config() {
    // MQA (Falcon-style through Llama keys): one KV head; --dtype overrides the config's.
    let mqa = json!({"num_attention_heads": 16, "num_key_value_heads": 1, "head_dim": 64, "torch_dtype": "bfloat16"});
    let (text, c) = round_trip(&mqa, &lengths(&[512], &[2048], None, &[2]), Some(DType::Fp16), Layout::Bhsd);
    assert_eq!(c.workload.dtype, DType::Fp16);
    assert_eq!(rows(&c.shapes()), vec![(2, 16, 1, 512, 512, 64, true), (2, 16, 1, 1, 2048, 64, false)]);
    assert!(text.contains("over 1 KV head (multi-query)") && text.contains("fp16 (--dtype)"), "{text}");
    // Llava-style: the language model under text_config, the dtype at the top.
    let llava = json!({
        "model_type": "llava", "torch_dtype": "bfloat16",
        "vision_config": {"num_attention_heads": 16, "hidden_size": 1024},
        "text_config": {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8}
    });
    let (text, c) = round_trip(&llava, &lengths(&[4096], &[], None, &[1]), None, Layout::Bhsd);
    assert_eq!(rows(&c.shapes()), vec![(1, 32, 8, 4096, 4096, 128, true)]);
    assert_eq!(c.workload.dtype, DType::Bf16);
    assert!(text.contains("keys under `text_config`") && text.contains("text_config.hidden_size"), "{text}");
}

/// `config` refused by the reader: the message names the file, the key and what to do.
fn refused(config: &str, dtype: Option<DType>) -> String {
    let e = ModelAttention::parse(config, Path::new("models/m/config.json"), dtype).unwrap_err().to_string();
    assert!(e.starts_with("models/m/config.json"), "{e}");
    e
}

#[test]
fn configs_it_cannot_serve_are_refused_with_the_key_and_the_fix() {
    let base = |extra: &str| format!(r#"{{"hidden_size": 4096, "torch_dtype": "bfloat16", {extra}}}"#);
    let e = refused(&base(r#""num_key_value_heads": 8"#), None);
    assert!(e.contains("`num_attention_heads` is missing") && e.contains("text_config"), "{e}");
    let e = refused(&base(r#""num_attention_heads": "32""#), None);
    assert!(e.contains("`num_attention_heads` is \"32\"; expected a whole number"), "{e}");
    let e = refused(&base(r#""num_attention_heads": 32, "num_key_value_heads": 5"#), None);
    assert!(e.contains("`num_key_value_heads` is 5, which does not divide num_attention_heads = 32"), "{e}");
    // Phi-2's head dim 80 (2560 / 32): not one the templates are written for.
    let e = refused(&base(r#""num_attention_heads": 16, "head_dim": 80"#), None);
    assert!(e.contains("`head_dim` is 80") && e.contains("[64, 96, 128, 256]"), "{e}");
    let e = refused(r#"{"num_attention_heads": 32, "torch_dtype": "bfloat16"}"#, None);
    assert!(e.contains("`head_dim` is missing, and so is hidden_size") && e.contains("add head_dim"), "{e}");
    let e = refused(r#"{"num_attention_heads": 12, "hidden_size": 1000, "torch_dtype": "bfloat16"}"#, None);
    assert!(e.contains("not a multiple of num_attention_heads = 12"), "{e}");
    // fp32: the templates tune bf16 and fp16; --dtype says which.
    let fp32 = r#"{"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "torch_dtype": "float32"}"#;
    let e = refused(fp32, None);
    assert!(e.contains("`torch_dtype` is \"float32\"") && e.contains("--dtype bf16"), "{e}");
    assert_eq!(ModelAttention::parse(fp32, Path::new("c.json"), Some(DType::Bf16)).unwrap().dtype, Some(DType::Bf16));
    let e = refused(r#"{"num_attention_heads": 32, "head_dim": 128}"#, None);
    assert!(e.contains("`torch_dtype` is missing") && e.contains("--dtype bf16 or --dtype fp16"), "{e}");
    let e = refused(r#"{"text_config": {"num_attention_heads": 32, "num_key_value_heads": 3, "head_dim": 128}, "dtype": "bfloat16"}"#, None);
    assert!(e.contains("`text_config.num_key_value_heads` is 3"), "{e}");
    let e = refused("{not json", None);
    assert!(e.contains("not JSON"), "{e}");
}

/// Speculative decoding: each draft size against each cache, causal (the draft's rows are the
/// cache's last), per batch size, in their own group, beside plain decode; the shapes a
/// `spec-decode` workload tunes (decode-wgmma's regime where G x SQ > 16).
#[test]
fn a_draft_gives_speculative_decodings_verification_shapes() {
    let l = Lengths { draft: vec![8, 16], ..lengths(&[], &[4096], None, &[1, 8]) };
    let (text, c) = round_trip(&llama3_8b(), &l, None, Layout::Bhsd);
    assert_eq!(
        rows(&c.shapes()),
        vec![
            (1, 32, 8, 8, 4096, 128, true),
            (1, 32, 8, 16, 4096, 128, true),
            (8, 32, 8, 8, 4096, 128, true),
            (8, 32, 8, 16, 4096, 128, true),
            (1, 32, 8, 1, 4096, 128, false),
            (8, 32, 8, 1, 4096, 128, false),
        ]
    );
    assert!(c.shapes().iter().all(|s| s.is_decode()), "SQ <= 16: the decode templates' regime");
    assert_eq!(c.shapes()[3].key(), "b8hq32hkv8sq16sk4096d128-causal-bf16");
    assert_eq!(text.matches("# speculative decoding (a draft's rows verified against the cache)").count(), 1, "{text}");
    let model = ModelAttention::parse(&llama3_8b().to_string(), Path::new("config.json"), None).unwrap();
    let refuse = |l: &Lengths| workload_toml(&model, l, Layout::Bhsd, "optimizerd workload").unwrap_err().to_string();
    let e = refuse(&Lengths { draft: vec![8], ..lengths(&[4096], &[], None, &[1]) });
    assert!(e.contains("--draft 8 verifies a draft against a KV cache; give --decode-context too"), "{e}");
    let e = refuse(&Lengths { draft: vec![1], ..lengths(&[], &[4096], None, &[1]) });
    assert!(e.contains("--draft 1: a draft of one token is plain decode"), "{e}");
    let e = refuse(&Lengths { draft: vec![64], ..lengths(&[], &[32], None, &[1]) });
    assert!(e.contains("--draft 64 is longer than the --decode-context 32"), "{e}");
}

#[test]
fn lengths_that_make_no_shape_are_refused() {
    let model = ModelAttention::parse(&llama3_8b().to_string(), Path::new("config.json"), None).unwrap();
    let cmd = "optimizerd workload";
    let e = workload_toml(&model, &lengths(&[1024], &[], Some(1024), &[1]), Layout::Bhsd, cmd).unwrap_err().to_string();
    assert!(e.contains("--chunk 1024 is not shorter than any --prefill length (1024)"), "{e}");
    let e = workload_toml(&model, &lengths(&[], &[4096], Some(512), &[1]), Layout::Bhsd, cmd).unwrap_err().to_string();
    assert!(e.contains("give --prefill too"), "{e}");
    // Too large for the kernels' i32 indices: the config loader's own refusal, named.
    let e = workload_toml(&model, &lengths(&[1 << 20], &[], None, &[64]), Layout::Bhsd, cmd).unwrap_err().to_string();
    assert!(e.contains("does not load") && e.contains("i32"), "{e}");
}

#[test]
fn the_command_prints_or_writes_what_the_loader_reads() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), llama3_8b().to_string()).unwrap();
    let r = run_in(dir.path(), &["workload", "--from-hf", "config.json", "--prefill", "4096", "--decode-context", "4096", "--batch", "1,8"]);
    assert_eq!(r.code, Some(exit::SUCCESS as i32), "{}", r.text());
    assert!(r.stdout.starts_with("# Written by `optimizerd workload --from-hf config.json --prefill 4096"), "{}", r.stdout);
    let c = Config::parse(&r.stdout, Path::new("stdout"), dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.shapes().len(), 4);
    // --out: the file is a whole configuration `--config` takes.
    let r = run_in(dir.path(), &["workload", "--from-hf", "config.json", "--decode-context", "1024,4096", "--out", "llama.toml"]);
    assert_eq!(r.code, Some(exit::SUCCESS as i32), "{}", r.text());
    assert!(r.stdout.contains("(2 shapes) to llama.toml") && r.stdout.contains("optimizerd --config llama.toml start"), "{}", r.stdout);
    assert_eq!(Config::load_file(&dir.path().join("llama.toml")).unwrap().shapes().len(), 2);
    // A refusal: exit status CONFIG, the file and key on stderr; nothing written.
    std::fs::write(dir.path().join("phi2.json"), r#"{"num_attention_heads": 32, "head_dim": 80, "torch_dtype": "float16"}"#).unwrap();
    let r = run_in(dir.path(), &["workload", "--from-hf", "phi2.json", "--prefill", "4096", "--out", "p.toml"]);
    assert_eq!(r.code, Some(exit::CONFIG as i32), "{}", r.text());
    assert!(r.stderr.contains("phi2.json: `head_dim` is 80"), "{}", r.stderr);
    assert!(!dir.path().join("p.toml").exists());
    // Gemma 2 9B's attention (16 query heads sharing 8 KV heads of 256 dims) is a workload.
    std::fs::write(dir.path().join("gemma.json"), r#"{"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "torch_dtype": "bfloat16"}"#).unwrap();
    let r = run_in(dir.path(), &["workload", "--from-hf", "gemma.json", "--prefill", "4096", "--decode-context", "4096", "--out", "g.toml"]);
    assert_eq!(r.code, Some(exit::SUCCESS as i32), "{}", r.text());
    let shapes = Config::load_file(&dir.path().join("g.toml")).unwrap().shapes();
    assert!(!shapes.is_empty() && shapes.iter().all(|s| (s.hq, s.hkv, s.d) == (16, 8, 256)), "{shapes:?}");
    // Usage: no lengths, a bad dtype, a missing file.
    let r = run_in(dir.path(), &["workload", "--from-hf", "config.json"]);
    assert_eq!(r.code, Some(exit::USAGE as i32), "{}", r.text());
    assert!(r.stderr.contains("--prefill <LEN>|--decode-context <LEN>"), "{}", r.stderr);
    let r = run_in(dir.path(), &["workload", "--from-hf", "config.json", "--prefill", "4096", "--dtype", "fp32"]);
    assert!(r.code == Some(exit::USAGE as i32) && r.stderr.contains("--dtype bf16"), "{}", r.text());
    let r = run_in(dir.path(), &["workload", "--from-hf", "nope.json", "--prefill", "0"]);
    assert!(r.code == Some(exit::USAGE as i32) && r.stderr.contains("at least 1"), "{}", r.text());
    let r = run_in(dir.path(), &["workload", "--from-hf", "nope.json", "--prefill", "4096"]);
    assert!(r.code == Some(exit::CONFIG as i32) && r.stderr.contains("cannot read nope.json"), "{}", r.text());
}

/// scripts/models/llama-3-8b-config.json, the config scripts/model_e2e.sh and
/// scripts/device-e2e-call.sh run by default, is the same attention as the inline Llama-3-8B
/// above, and model_e2e.sh's lengths make its 9 shapes (6 prefill, 3 decode).
#[test]
fn the_e2e_scripts_llama_config_is_llama_3_8b() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/models/llama-3-8b-config.json");
    let file = ModelAttention::load(&path, None).unwrap_or_else(|e| panic!("{e}"));
    let inline = ModelAttention::parse(&llama3_8b().to_string(), Path::new("config.json"), None).unwrap();
    let l = lengths(&[1024, 4096], &[4096], None, &[1, 4, 8]);
    let shapes = |m: &ModelAttention| {
        let text = workload_toml(m, &l, Layout::Bhsd, "test").unwrap_or_else(|e| panic!("{e}"));
        rows(&Config::parse(&text, Path::new("w.toml"), Path::new(".")).unwrap_or_else(|e| panic!("{e}")).shapes())
    };
    let (a, b) = (shapes(&file), shapes(&inline));
    assert_eq!(a, b);
    assert_eq!(a.len(), 9, "{a:?}");
    assert!(a.iter().all(|&(_, hq, hkv, _, _, d, _)| (hq, hkv, d) == (32, 8, 128)), "{a:?}");
    assert_eq!(a.iter().filter(|r| r.3 == 1).count(), 3, "decode shapes: {a:?}");
}
