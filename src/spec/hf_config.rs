//! A Hugging Face transformers `config.json`, read for what attention's shape depends
//! on: query heads, key/value heads, head dim and dtype.
//!
//! Keys as transformers writes them for Llama-style models (Llama, Mistral, Qwen2,
//! Gemma, ...): `num_attention_heads`, `num_key_value_heads` (absent or null: as many as
//! the query heads), `head_dim` (absent or null: `hidden_size / num_attention_heads`),
//! `torch_dtype` or, since transformers 5, `dtype`. A multimodal config keeps the language
//! model's keys under `text_config`. Every error names the file, the key and the fix.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::spec::config::HEAD_DIMS;
use crate::spec::protocol::DType;

#[derive(Debug, thiserror::Error)]
pub enum HfConfigError {
    #[error("cannot read {}; give --from-hf the config.json of a transformers model (e.g. from its Hugging Face repository)", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not JSON ({source}); give --from-hf a transformers config.json", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: `{key}` {message}", path.display())]
    Key { path: PathBuf, key: String, message: String },
}

/// What a model's attention looks like, as its config says.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelAttention {
    pub path: PathBuf,
    /// `model_type` (e.g. `llama`), when given.
    pub model_type: Option<String>,
    /// `text_config.` when the keys came from a multimodal config's language model, else empty.
    pub prefix: String,
    pub heads_q: u32,
    pub heads_kv: u32,
    pub head_dim: u32,
    /// How the head dim was found, e.g. `head_dim` or `hidden_size / num_attention_heads (4096 / 32)`.
    pub head_dim_from: String,
    /// The dtype the config names (`torch_dtype` or `dtype`) when it is one the templates
    /// tune; None when absent.
    pub dtype: Option<DType>,
    /// The dtype key and its value as written, e.g. `torch_dtype = "bfloat16"`.
    pub dtype_from: Option<String>,
    /// The sliding window of the layers that have one (`sliding_window`, unless
    /// `use_sliding_window` is false), and which layers those are.
    pub window: Option<SlidingWindow>,
    /// What the config has that these kernels do not compute (logit soft-capping), for the
    /// output's header.
    pub caveats: Vec<String>,
}

/// A model's sliding-window attention: its window and which of its layers use it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// Keys each query row sees, its own position included (`sliding_window`).
    pub keys: u32,
    /// Whether some layers attend to every key too (Gemma 2/3, gpt-oss: local and global
    /// layers), so the workload needs both kinds of shape; false: every layer is windowed
    /// (Mistral 7B v0.1).
    pub mixed: bool,
    /// Where `mixed` came from, in words, e.g. `layer_types: 40 of 48 sliding_attention`.
    pub layers_from: String,
}

impl ModelAttention {
    /// Read `path`. `dtype` (from `--dtype`) overrides the config's, and lets a config of
    /// float32 or no dtype through.
    pub fn load(path: &Path, dtype: Option<DType>) -> Result<Self, HfConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| HfConfigError::Read { path: path.into(), source })?;
        Self::parse(&text, path, dtype)
    }

    pub fn parse(text: &str, path: &Path, dtype_override: Option<DType>) -> Result<Self, HfConfigError> {
        let root: Value = serde_json::from_str(text).map_err(|source| HfConfigError::Json { path: path.into(), source })?;
        let err = |key: &str, message: String| HfConfigError::Key { path: path.into(), key: key.to_string(), message };
        let Some(root) = root.as_object() else {
            return Err(err("(top level)", "is not a JSON object; give --from-hf a transformers config.json".into()));
        };
        // A multimodal config (Llava, Gemma 3, Mistral 3, ...) keeps the language model
        // under text_config; a text model has the keys at the top.
        let (section, prefix) = match (root.get("num_attention_heads"), root.get("text_config").and_then(Value::as_object)) {
            (None, Some(text_config)) => (text_config, "text_config."),
            _ => (root, ""),
        };
        let key = |k: &str| format!("{prefix}{k}");
        let heads_q = whole(section, "num_attention_heads")
            .map_err(|m| err(&key("num_attention_heads"), m))?
            .ok_or_else(|| {
                err(
                    &key("num_attention_heads"),
                    "is missing; this reader takes Llama-style configs (num_attention_heads, num_key_value_heads, head_dim or hidden_size, \
                     torch_dtype), with a multimodal model's language model under text_config; write the [workload] by hand otherwise \
                     (agent.toml describes its shapes)"
                        .into(),
                )
            })?;
        let heads_kv = whole(section, "num_key_value_heads").map_err(|m| err(&key("num_key_value_heads"), m))?.unwrap_or(heads_q);
        if !heads_q.is_multiple_of(heads_kv) {
            return Err(err(
                &key("num_key_value_heads"),
                format!(
                    "is {heads_kv}, which does not divide num_attention_heads = {heads_q}; grouped-query attention gives every key/value head \
                     the same number of query heads: check the config"
                ),
            ));
        }
        let (head_dim, head_dim_from) = match whole(section, "head_dim").map_err(|m| err(&key("head_dim"), m))? {
            Some(d) => (d, key("head_dim")),
            None => {
                let hidden = whole(section, "hidden_size").map_err(|m| err(&key("hidden_size"), m))?.ok_or_else(|| {
                    err(&key("head_dim"), "is missing, and so is hidden_size to derive it from (hidden_size / num_attention_heads); add head_dim".into())
                })?;
                if !hidden.is_multiple_of(heads_q) {
                    return Err(err(
                        &key("head_dim"),
                        format!("is missing, and hidden_size = {hidden} is not a multiple of num_attention_heads = {heads_q} to derive it; add head_dim"),
                    ));
                }
                (hidden / heads_q, format!("{} / {} ({hidden} / {heads_q})", key("hidden_size"), key("num_attention_heads")))
            }
        };
        if !HEAD_DIMS.contains(&head_dim) {
            return Err(err(
                &key("head_dim"),
                format!(
                    "is {head_dim} (from {head_dim_from}); the kernel templates are written for head dims {HEAD_DIMS:?} only, so optimizerd cannot \
                     tune this model's attention"
                ),
            ));
        }
        // The language model's dtype, else the whole model's (text_config often has none).
        let written = ["torch_dtype", "dtype"]
            .iter()
            .flat_map(|k| [(section, key(k)), (root, k.to_string())])
            .find_map(|(obj, full)| {
                let bare = full.rsplit('.').next().unwrap_or(&full).to_string();
                obj.get(&bare).filter(|v| !v.is_null()).map(|v| (full, v.clone()))
            });
        let (dtype, dtype_from) = match (written, dtype_override) {
            (_, Some(d)) => (Some(d), None),
            (None, None) => {
                return Err(err(
                    &key("torch_dtype"),
                    "is missing (and so is dtype): pass --dtype bf16 or --dtype fp16, the precision you run the model in".into(),
                ))
            }
            (Some((k, v)), None) => {
                let name = v.as_str().ok_or_else(|| err(&k, format!("is {v}; expected a dtype name such as \"bfloat16\"")))?;
                let d = match name.trim_start_matches("torch.") {
                    "bfloat16" => DType::Bf16,
                    "float16" | "half" => DType::Fp16,
                    "float32" | "float" | "float64" | "double" => {
                        return Err(err(
                            &k,
                            format!(
                                "is {name:?}; the kernel templates tune bf16 and fp16 attention (what models run in on the GPU): pass --dtype bf16 \
                                 (or --dtype fp16) for the precision you will run the model in"
                            ),
                        ))
                    }
                    other => return Err(err(&k, format!("is {other:?}, not a dtype the kernel templates tune (bfloat16, float16); pass --dtype bf16 or fp16"))),
                };
                (Some(d), Some(format!("{k} = {name:?}")))
            }
        };
        let mut caveats = Vec::new();
        let window =
            match whole(section, "sliding_window").map_err(|m| err(&key("sliding_window"), m))? {
                Some(keys) if section.get("use_sliding_window") != Some(&Value::Bool(false)) => {
                    Some(window_layers(section, keys, &key))
                }
                _ => None,
            };
        if let Some(c) = section
            .get("attn_logit_softcapping")
            .filter(|v| !v.is_null())
        {
            caveats.push(format!(
                "{} = {c}: the kernels do not soft-cap logits",
                key("attn_logit_softcapping")
            ));
        }
        Ok(ModelAttention {
            path: path.into(),
            model_type: section.get("model_type").or_else(|| root.get("model_type")).and_then(Value::as_str).map(str::to_string),
            prefix: prefix.to_string(),
            heads_q,
            heads_kv,
            head_dim,
            head_dim_from,
            dtype,
            dtype_from,
            window,
            caveats,
        })
    }
}

/// Which layers of a model with `sliding_window = keys` use it: `layer_types` when the
/// config lists them (transformers >= 4.53 writes it), else Gemma 3's
/// `sliding_window_pattern` (one global layer every N), else Gemma 2's alternation, else all.
fn window_layers(
    section: &Map<String, Value>,
    keys: u32,
    key: &dyn Fn(&str) -> String,
) -> SlidingWindow {
    if let Some(types) = section.get("layer_types").and_then(Value::as_array) {
        let sliding = types
            .iter()
            .filter(|t| t.as_str() == Some("sliding_attention"))
            .count();
        return SlidingWindow {
            keys,
            mixed: sliding < types.len(),
            layers_from: format!(
                "{}: {sliding} of {} sliding_attention",
                key("layer_types"),
                types.len()
            ),
        };
    }
    if let Some(n) = section
        .get("sliding_window_pattern")
        .and_then(Value::as_u64)
        .filter(|&n| n > 1)
    {
        return SlidingWindow {
            keys,
            mixed: true,
            layers_from: format!(
                "{} = {n}: {} of every {n} layers",
                key("sliding_window_pattern"),
                n - 1
            ),
        };
    }
    if section.get("model_type").and_then(Value::as_str) == Some("gemma2") {
        return SlidingWindow {
            keys,
            mixed: true,
            layers_from: "model_type gemma2: every other layer".into(),
        };
    }
    SlidingWindow {
        keys,
        mixed: false,
        layers_from: "every layer (no layer_types in the config)".into(),
    }
}

/// `obj[key]` as a whole number >= 1; None when absent or null. Err: what is wrong with it.
fn whole(obj: &Map<String, Value>, key: &str) -> Result<Option<u32>, String> {
    let v = match obj.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v,
    };
    let n = match v {
        Value::Number(n) => n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64)),
        _ => None,
    };
    match n {
        Some(0) => Err("is 0; it must be at least 1".into()),
        Some(n) if n <= u32::MAX as u64 => Ok(Some(n as u32)),
        _ => Err(format!("is {v}; expected a whole number (e.g. 32)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str, dtype: Option<DType>) -> Result<ModelAttention, HfConfigError> {
        ModelAttention::parse(json, Path::new("config.json"), dtype)
    }

    #[test]
    fn head_dim_comes_from_hidden_size_when_absent_or_null() {
        let m = parse(r#"{"num_attention_heads": 32, "num_key_value_heads": null, "hidden_size": 4096, "head_dim": null, "torch_dtype": "float16"}"#, None).unwrap();
        assert_eq!((m.heads_q, m.heads_kv, m.head_dim, m.dtype), (32, 32, 128, Some(DType::Fp16)));
        assert!(m.head_dim_from.contains("4096 / 32"), "{}", m.head_dim_from);
    }

    #[test]
    fn numbers_are_whole_and_positive() {
        for (v, says) in [("\"32\"", "whole number"), ("32.5", "whole number"), ("-4", "whole number"), ("0", "at least 1")] {
            let e = parse(&format!(r#"{{"num_attention_heads": {v}, "head_dim": 128, "dtype": "bfloat16"}}"#), None).unwrap_err().to_string();
            assert!(e.contains("config.json: `num_attention_heads`") && e.contains(says), "{v}: {e}");
        }
        assert_eq!(parse(r#"{"num_attention_heads": 32.0, "head_dim": 128, "dtype": "bfloat16"}"#, None).unwrap().heads_q, 32);
    }

    #[test]
    fn the_sliding_window_and_its_layers() {
        let base = r#""num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "dtype": "bfloat16""#;
        let w = |extra: &str| parse(&format!("{{{base}{extra}}}"), None).unwrap().window;
        assert_eq!(w(""), None);
        assert_eq!(w(r#", "sliding_window": null"#), None);
        assert_eq!(
            w(r#", "sliding_window": 4096, "use_sliding_window": false"#),
            None,
            "Qwen2 turns it off"
        );
        let mistral = w(r#", "sliding_window": 4096"#).unwrap();
        assert_eq!((mistral.keys, mistral.mixed), (4096, false));
        let gemma3 = w(r#", "sliding_window": 1024, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]"#).unwrap();
        assert_eq!((gemma3.keys, gemma3.mixed), (1024, true));
        assert!(
            gemma3.layers_from.contains("2 of 3"),
            "{}",
            gemma3.layers_from
        );
        let all = w(
            r#", "sliding_window": 128, "layer_types": ["sliding_attention", "sliding_attention"]"#,
        )
        .unwrap();
        assert!(!all.mixed);
        assert!(
            w(r#", "sliding_window": 1024, "sliding_window_pattern": 6"#)
                .unwrap()
                .mixed
        );
        assert!(
            w(r#", "sliding_window": 4096, "model_type": "gemma2""#)
                .unwrap()
                .mixed
        );
        let e = parse(&format!(r#"{{{base}, "sliding_window": 0}}"#), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`sliding_window` is 0"), "{e}");
    }
}
