//! `workload --from-hf`: the `[workload]` a model's attention needs, from its
//! transformers config ([`crate::spec::hf_config`]) and the lengths it will run at.
//!
//! Per batch size: prefill (SQ = SK = P, causal), chunked prefill (a chunk of queries,
//! the last rows of a longer causal prefill: SQ = chunk, SK = P), decode (one query
//! row against a KV cache of SK keys) and speculative decoding's verification (a draft of
//! N rows against the cache: SQ = N, SK = the cache with them, causal). Decode is written
//! `causal = false`: the single row is the newest position and sees the whole cache, which
//! is how transformers calls attention during generation (no mask, `is_causal` only when
//! SQ > 1). The text is checked with the config loader before it is returned, so what is
//! written loads.

use std::path::Path;

use crate::spec::config::{Config, ConfigError};
use crate::spec::hf_config::ModelAttention;
use crate::spec::protocol::Layout;

/// The lengths and batch sizes to write shapes for.
#[derive(Debug, Clone, PartialEq)]
pub struct Lengths {
    pub prefill: Vec<u32>,
    pub decode_context: Vec<u32>,
    pub chunk: Option<u32>,
    /// Draft sizes of speculative decoding: SQ = N rows against each decode context.
    pub draft: Vec<u32>,
    pub batch: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("{0}")]
    Lengths(String),
    #[error("the workload written from {} does not load: {source}", model.display())]
    DoesNotLoad {
        model: std::path::PathBuf,
        #[source]
        source: ConfigError,
    },
}

/// One shape line, and the kind it belongs to (for the comments between groups).
struct Entry {
    kind: &'static str,
    line: String,
}

fn entries(m: &ModelAttention, l: &Lengths) -> Vec<Entry> {
    let (hq, hkv, d) = (m.heads_q, m.heads_kv, m.head_dim);
    let mut out: Vec<Entry> = Vec::new();
    // Each shape as the model's layers run it: with the sliding window where it masks
    // something (it looks back fewer than `sk` keys), and without it where some layers
    // attend to every key or the window covers the whole length.
    let mut push = |kind, fields: String, sk: u32, full: &str| {
        let mut lines = Vec::new();
        match &m.window {
            Some(w) if w.keys < sk => {
                if w.mixed {
                    lines.push(format!("{{ {fields}, {full} }}"));
                }
                lines.push(format!(
                    "{{ {fields}, causal = true, window = {} }}",
                    w.keys
                ));
            }
            _ => lines.push(format!("{{ {fields}, {full} }}")),
        }
        for line in lines {
            // The config loader refuses a shape listed twice (`--prefill 4096,4096`).
            if !out.iter().any(|e| e.line == line) {
                out.push(Entry { kind, line });
            }
        }
    };
    // Grouped by kind, so that each group has one comment above it.
    for &b in &l.batch {
        for &p in &l.prefill {
            push(
                "prefill",
                format!("b = {b}, hq = {hq}, hkv = {hkv}, s = {p}, d = {d}"),
                p,
                "causal = true",
            );
        }
    }
    for (&b, c) in l.batch.iter().flat_map(|b| l.chunk.map(|c| (b, c))) {
        for &p in l.prefill.iter().filter(|&&p| p > c) {
            push(
                "chunk",
                format!("b = {b}, hq = {hq}, hkv = {hkv}, sq = {c}, sk = {p}, d = {d}"),
                p,
                "causal = true",
            );
        }
    }
    for &b in &l.batch {
        for (&n, &ctx) in l.draft.iter().flat_map(|n| l.decode_context.iter().map(move |c| (n, c))) {
            push(
                "draft",
                format!("b = {b}, hq = {hq}, hkv = {hkv}, sq = {n}, sk = {ctx}, d = {d}"),
                ctx,
                "causal = true",
            );
        }
    }
    for &b in &l.batch {
        for &ctx in &l.decode_context {
            push(
                "decode",
                format!("b = {b}, hq = {hq}, hkv = {hkv}, sq = 1, sk = {ctx}, d = {d}"),
                ctx,
                "causal = false",
            );
        }
    }
    out
}

/// The `[workload]` TOML for model `m` at lengths `l`; `command` is the command line, for
/// the header. Err: lengths that make no shape, or a shape the config loader refuses.
pub fn workload_toml(m: &ModelAttention, l: &Lengths, layout: Layout, command: &str) -> Result<String, WorkloadError> {
    if l.prefill.is_empty() && l.decode_context.is_empty() {
        return Err(WorkloadError::Lengths("no lengths: give --prefill (prompt lengths) and/or --decode-context (KV cache lengths), e.g. --prefill 4096 --decode-context 4096".into()));
    }
    if let Some(c) = l.chunk {
        if l.prefill.is_empty() {
            return Err(WorkloadError::Lengths(format!("--chunk {c} splits prefill lengths into chunks; give --prefill too (e.g. --prefill 4096 --chunk {c})")));
        }
        if !l.prefill.iter().any(|&p| p > c) {
            return Err(WorkloadError::Lengths(format!(
                "--chunk {c} is not shorter than any --prefill length ({}): no prompt is chunked; give a smaller chunk (e.g. 512)",
                l.prefill.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            )));
        }
    }
    if !l.draft.is_empty() {
        if l.decode_context.is_empty() {
            return Err(WorkloadError::Lengths(format!(
                "--draft {} verifies a draft against a KV cache; give --decode-context too (e.g. --decode-context 4096 --draft {})",
                join(&l.draft),
                join(&l.draft)
            )));
        }
        if let Some(n) = l.draft.iter().find(|&&n| n < 2) {
            return Err(WorkloadError::Lengths(format!("--draft {n}: a draft of one token is plain decode, which --decode-context writes already; give 2 or more (e.g. --draft 8)")));
        }
        if let Some((n, ctx)) = l.draft.iter().flat_map(|&n| l.decode_context.iter().map(move |&c| (n, c))).find(|&(n, c)| n > c) {
            return Err(WorkloadError::Lengths(format!("--draft {n} is longer than the --decode-context {ctx} it is verified against (its rows are the cache's last {n}); give a longer context or a shorter draft")));
        }
    }
    // ModelAttention::load demands a dtype unless --dtype gave one.
    let dtype = m.dtype.map_or("bf16", |d| d.as_str());
    let group = m.heads_q / m.heads_kv;
    let heads = match (m.heads_kv, group) {
        (1, _) => format!("{} query heads over 1 KV head (multi-query)", m.heads_q),
        (_, 1) => format!("{} heads (multi-head)", m.heads_q),
        (kv, g) => format!("{} query heads over {kv} KV heads (grouped-query, {g} per KV head)", m.heads_q),
    };
    let mut t = String::new();
    t.push_str(&format!("# Written by `{command}`\n"));
    t.push_str(&format!(
        "# from {}{}: {heads}, head dim {} ({}), {}.\n",
        m.path.display(),
        m.model_type.as_deref().map(|k| format!(" ({k})")).unwrap_or_default(),
        m.head_dim,
        m.head_dim_from,
        m.dtype_from.as_deref().map_or_else(|| format!("{dtype} (--dtype)"), |f| format!("{dtype} ({f})")),
    ));
    if !m.prefix.is_empty() {
        t.push_str(&format!("# The language model's attention: keys under `{}`.\n", m.prefix.trim_end_matches('.')));
    }
    if let Some(w) = &m.window {
        t.push_str(&format!(
            "# Sliding window: {} keys ({}), on {}; shapes the window masks are listed with `window = {}`{}.\n",
            w.keys,
            format_args!("{}sliding_window", m.prefix),
            w.layers_from,
            w.keys,
            if w.mixed { ", beside the same shape without it for the layers that attend to every key" } else { "" }
        ));
    }
    for c in &m.caveats {
        t.push_str(&format!("# Note: {c}.\n"));
    }
    t.push_str(
            "# Prefill: sq = sk = prompt length, causal. Chunked prefill: a chunk of queries, the last rows of a longer\n\
         # causal prompt. Decode: one query row against the KV cache, not causal (the newest row sees every key).\n\
         # Draft (speculative decoding): a draft's rows, the cache's last, verified in one call, causal.\n\
         # Paste it over the [workload] of agent.toml, or use this file as the whole config (every other key takes\n\
         # its default): optimizerd --config THIS_FILE start --budget 20m\n",
    );
    t.push_str(&format!("[workload]\ndtype = \"{dtype}\"\nlayout = \"{}\"\nshapes = [\n", layout.as_str()));
    let mut last = "";
    for e in entries(m, l) {
        if e.kind != last {
            let title = match e.kind {
                "prefill" => "prefill",
                "chunk" => "chunked prefill",
                "draft" => "speculative decoding (a draft's rows verified against the cache)",
                _ => "decode",
            };
            t.push_str(&format!("  # {title}\n"));
            last = e.kind;
        }
        t.push_str(&format!("  {},\n", e.line));
    }
    t.push_str("]\n");
    // What is written must load: the same loader `optimizerd start` uses.
    Config::parse(&t, Path::new("<workload from --from-hf>"), Path::new("."))
        .map_err(|source| WorkloadError::DoesNotLoad { model: m.path.clone(), source })?;
    Ok(t)
}

fn join(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}
