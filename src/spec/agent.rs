//! `[agent]` in agent.toml: which OpenAI-compatible chat endpoint proposes kernel edits,
//! how requests are sent (timeout, retries, reply cap), and the per-run limits on
//! requests, tokens and estimated cost. Parsed strictly like the rest of the config;
//! the agent is opt-in: with no `base_url`, agent stages are skipped.

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSection {
    /// e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8000/v1`; empty: the agent is off.
    pub base_url: String,
    pub model: String,
    /// Name of the environment variable holding the API key; empty: no Authorization header.
    pub api_key_env: String,
    pub temperature: f64,
    /// Completion tokens asked for per request.
    pub max_tokens: u32,
    /// Choices per request (`n`): several proposals from one prompt (best-of-N).
    pub proposals_per_request: u32,
    #[serde(deserialize_with = "crate::spec::config::duration")]
    pub request_timeout: Duration,
    /// Retries after a 429, a 5xx, a timeout or a refused connection.
    pub retries: u32,
    /// First wait between retries; doubles each time; a 429's Retry-After overrides it.
    #[serde(deserialize_with = "crate::spec::config::duration")]
    pub backoff: Duration,
    /// Longest reply body accepted, in bytes.
    pub max_reply_bytes: u64,
    /// Per-run limits.
    pub max_requests: u32,
    pub max_total_tokens: u64,
    pub max_cost_usd: f64,
    /// Prices per million tokens, for the cost estimate.
    pub usd_per_mtok_prompt: f64,
    pub usd_per_mtok_completion: f64,
    /// Ledger iterations shown to the model as history (most recent).
    pub history_lines: u32,
    /// Headers an agent template may include (local `common/...` and system `<...>`).
    pub allowed_headers: Vec<String>,
    /// A candidate this many times faster than the incumbent on a shape is flagged,
    /// re-verified and not accepted.
    pub suspicious_speedup: f64,
    /// Likewise for a candidate above this multiple of the TFLOPS SDPA demonstrated.
    pub suspicious_peak_factor: f64,
}

impl Default for AgentSection {
    fn default() -> Self {
        Self {
            base_url: String::new(),
            model: String::new(),
            api_key_env: String::new(),
            temperature: 0.2,
            max_tokens: 4096,
            proposals_per_request: 1,
            request_timeout: Duration::from_secs(180),
            retries: 3,
            backoff: Duration::from_secs(2),
            max_reply_bytes: 1 << 20,
            max_requests: 20,
            max_total_tokens: 500_000,
            max_cost_usd: 5.0,
            usd_per_mtok_prompt: 0.0,
            usd_per_mtok_completion: 0.0,
            history_lines: 30,
            allowed_headers: [
                "common/optd.cuh",
                "common/async_copy.cuh",
                "common/split_combine.cuh",
                "common/quad_softmax.cuh",
                "common/online_softmax.cuh",
                "common/mask.cuh",
                "common/tile_scheduler.cuh",
                "common/hopper.cuh",
                "common/wgmma_ops.cuh",
                "cuda_fp16.h",
                "cuda_bf16.h",
                "mma.h",
                "cuda/barrier",
                "cuda/pipeline",
            ]
            .map(String::from)
            .to_vec(),
            suspicious_speedup: 20.0,
            suspicious_peak_factor: 1.5,
        }
    }
}

impl AgentSection {
    pub fn enabled(&self) -> bool {
        !self.base_url.trim().is_empty()
    }

    /// Estimated cost in USD of one request.
    pub fn cost(&self, prompt_tokens: u64, completion_tokens: u64) -> f64 {
        (prompt_tokens as f64 * self.usd_per_mtok_prompt + completion_tokens as f64 * self.usd_per_mtok_completion) / 1e6
    }

    /// Check values; Err((key, message)) names the `agent.` key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, m: String| Err((format!("agent.{k}"), m));
        if self.enabled() {
            let u = self.base_url.trim();
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return bad("base_url", format!("is {u:?}; write the endpoint's base, e.g. \"https://api.openai.com/v1\" or \"http://127.0.0.1:8000/v1\""));
            }
            if self.model.trim().is_empty() {
                return bad("model", "is empty; name the model the endpoint serves (e.g. \"gpt-4.1\", \"qwen2.5-coder:32b\")".into());
            }
        }
        if !self.api_key_env.is_empty() && !self.api_key_env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return bad("api_key_env", format!("is {:?}; it names an environment variable (e.g. \"OPENAI_API_KEY\"), never the key itself", self.api_key_env));
        }
        if !(0.0..=2.0).contains(&self.temperature) {
            return bad("temperature", format!("is {}; allowed: 0 ..= 2", self.temperature));
        }
        for (k, v) in [("max_tokens", self.max_tokens), ("proposals_per_request", self.proposals_per_request)] {
            if v == 0 {
                return bad(k, "must be at least 1".into());
            }
        }
        if self.proposals_per_request > 8 {
            return bad("proposals_per_request", format!("is {}; allowed: 1 ..= 8", self.proposals_per_request));
        }
        if self.request_timeout.is_zero() {
            return bad("request_timeout", "must be > 0 (e.g. \"180s\")".into());
        }
        if self.max_reply_bytes < 1024 {
            return bad("max_reply_bytes", format!("is {}; allow at least 1024", self.max_reply_bytes));
        }
        for (k, v) in [
            ("max_cost_usd", self.max_cost_usd),
            ("usd_per_mtok_prompt", self.usd_per_mtok_prompt),
            ("usd_per_mtok_completion", self.usd_per_mtok_completion),
        ] {
            if v.is_nan() || v < 0.0 {
                return bad(k, format!("is {v}; must be >= 0"));
            }
        }
        if self.suspicious_speedup.is_nan() || self.suspicious_speedup <= 1.0 {
            return bad("suspicious_speedup", format!("is {}; must be > 1 (e.g. 20)", self.suspicious_speedup));
        }
        if self.suspicious_peak_factor.is_nan() || self.suspicious_peak_factor <= 1.0 {
            return bad("suspicious_peak_factor", format!("is {}; must be > 1 (e.g. 1.5)", self.suspicious_peak_factor));
        }
        if let Some(h) = self.allowed_headers.iter().find(|h| h.contains("..") || h.starts_with('/') || h.is_empty()) {
            return bad("allowed_headers", format!("contains {h:?}; list header names like \"common/optd.cuh\" or \"cuda_fp16.h\" (no absolute paths, no ..)"));
        }
        Ok(())
    }

    /// The section for the ledger: everything but secrets (the key itself is never read here).
    pub fn effective(&self) -> serde_json::Value {
        let d = |d: Duration| humantime::format_duration(d).to_string();
        serde_json::json!({
            "base_url": self.base_url, "model": self.model, "api_key_env": self.api_key_env,
            "temperature": self.temperature, "max_tokens": self.max_tokens,
            "proposals_per_request": self.proposals_per_request, "request_timeout": d(self.request_timeout),
            "retries": self.retries, "backoff": d(self.backoff), "max_reply_bytes": self.max_reply_bytes,
            "max_requests": self.max_requests, "max_total_tokens": self.max_total_tokens, "max_cost_usd": self.max_cost_usd,
            "usd_per_mtok_prompt": self.usd_per_mtok_prompt, "usd_per_mtok_completion": self.usd_per_mtok_completion,
            "history_lines": self.history_lines, "allowed_headers": self.allowed_headers,
            "suspicious_speedup": self.suspicious_speedup, "suspicious_peak_factor": self.suspicious_peak_factor,
        })
    }
}

/// The 1-based line of `key = ` inside the `[agent]` table of `text` (0 when not found).
pub fn key_line(text: &str, key: &str) -> usize {
    let mut in_agent = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.starts_with('[') {
            in_agent = t == "[agent]";
            continue;
        }
        if in_agent {
            if let Some(rest) = t.strip_prefix(key) {
                if rest.trim_start().starts_with('=') {
                    return i + 1;
                }
            }
        }
    }
    0
}

/// What the agent used so far in a run (summed from the ledger; judged in `agent::limits`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Usage {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
}
