//! An OpenAI-compatible chat-completions client: one POST to `{base_url}/chat/completions`
//! with a timeout, retries with doubling backoff after 429 (honouring `Retry-After`), 5xx,
//! timeouts and refused connections, and a cap on the reply's size. The API key is read
//! from the configured environment variable and never logged or stored.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::spec::agent::AgentSection;

/// Longest wait a `Retry-After` may impose.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Message { role: role.into(), content: content.into() }
    }
}

/// What came back: the choices' texts and what they cost.
#[derive(Debug, Clone)]
pub struct ChatReply {
    pub choices: Vec<String>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// True when the endpoint reported no `usage` and tokens were estimated (chars / 4).
    pub tokens_estimated: bool,
    pub latency: Duration,
    pub attempts: u32,
    /// The reply body as received.
    pub body: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("agent.api_key_env names {0}, which is not set in the environment; export it, or empty api_key_env for a local server")]
    NoKey(String),
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("{url}: HTTP {status} after {attempts} attempt(s): {body}")]
    Status { url: String, status: u16, attempts: u32, body: String },
    #[error("{url}: no reply within {timeout:?} ({attempts} attempt(s)); raise agent.request_timeout or check the server")]
    Timeout { url: String, timeout: Duration, attempts: u32 },
    #[error("{url}: unreachable after {attempts} attempt(s): {message}")]
    Unreachable { url: String, attempts: u32, message: String },
    #[error("{url}: reply larger than agent.max_reply_bytes = {limit} bytes; refused")]
    TooLarge { url: String, limit: u64 },
    #[error("{url}: malformed reply ({message}); first bytes: {head:?}")]
    Malformed { url: String, message: String, head: String },
}

pub struct ChatClient {
    http: reqwest::Client,
    cfg: AgentSection,
    key: Option<String>,
    url: String,
}

#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: ChoiceMessage,
}

#[derive(Deserialize)]
struct ChoiceMessage {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// One attempt's failure: retry it or give up.
enum Attempt {
    Retry { wait: Option<Duration>, err: ChatError },
    Fatal(ChatError),
}

impl ChatClient {
    pub fn new(cfg: &AgentSection) -> Result<Self, ChatError> {
        let key = if cfg.api_key_env.is_empty() {
            None
        } else {
            Some(std::env::var(&cfg.api_key_env).map_err(|_| ChatError::NoKey(cfg.api_key_env.clone()))?)
        };
        let http = reqwest::Client::builder()
            .timeout(cfg.request_timeout)
            .connect_timeout(cfg.request_timeout.min(Duration::from_secs(30)))
            .build()
            .map_err(|e| ChatError::Client(e.to_string()))?;
        let url = format!("{}/chat/completions", cfg.base_url.trim().trim_end_matches('/'));
        Ok(ChatClient { http, cfg: cfg.clone(), key, url })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The request body for `messages` (also what the prompt hash covers).
    pub fn body(cfg: &AgentSection, messages: &[Message]) -> serde_json::Value {
        serde_json::json!({
            "model": cfg.model,
            "messages": messages,
            "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens,
            "n": cfg.proposals_per_request,
        })
    }

    /// Send `body`, retrying transient failures.
    pub async fn complete(&self, body: &serde_json::Value) -> Result<ChatReply, ChatError> {
        let started = Instant::now();
        let mut wait = self.cfg.backoff;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.attempt(body, attempts).await {
                Ok(mut reply) => {
                    reply.latency = started.elapsed();
                    reply.attempts = attempts;
                    return Ok(reply);
                }
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry { wait: after, err }) => {
                    if attempts > self.cfg.retries {
                        return Err(err);
                    }
                    let pause = after.unwrap_or(wait).min(MAX_RETRY_AFTER);
                    tracing::warn!(kind = "agent_retry", attempt = attempts, "agent request failed ({err}); retrying in {pause:?}");
                    tokio::time::sleep(pause).await;
                    wait = (wait * 2).min(MAX_RETRY_AFTER);
                }
            }
        }
    }

    async fn attempt(&self, body: &serde_json::Value, attempts: u32) -> Result<ChatReply, Attempt> {
        let url = self.url.clone();
        let mut req = self.http.post(&self.url).json(body);
        if let Some(k) = &self.key {
            req = req.bearer_auth(k);
        }
        let mut resp = match req.send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() => {
                return Err(Attempt::Retry { wait: None, err: ChatError::Timeout { url, timeout: self.cfg.request_timeout, attempts } })
            }
            Err(e) => return Err(Attempt::Retry { wait: None, err: ChatError::Unreachable { url, attempts, message: error_chain(&e) } }),
        };
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64);
        if let Some(len) = resp.content_length() {
            if len > self.cfg.max_reply_bytes {
                return Err(Attempt::Fatal(ChatError::TooLarge { url, limit: self.cfg.max_reply_bytes }));
            }
        }
        // Read chunk by chunk so an enormous reply is refused before it is all in memory.
        let mut bytes: Vec<u8> = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    bytes.extend_from_slice(&c);
                    if bytes.len() as u64 > self.cfg.max_reply_bytes {
                        return Err(Attempt::Fatal(ChatError::TooLarge { url, limit: self.cfg.max_reply_bytes }));
                    }
                }
                Ok(None) => break,
                Err(e) if e.is_timeout() => {
                    return Err(Attempt::Retry { wait: None, err: ChatError::Timeout { url, timeout: self.cfg.request_timeout, attempts } })
                }
                Err(e) => return Err(Attempt::Retry { wait: None, err: ChatError::Unreachable { url, attempts, message: error_chain(&e) } }),
            }
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if !status.is_success() {
            let err = ChatError::Status { url, status: status.as_u16(), attempts, body: head(&text, 300) };
            return if status.as_u16() == 429 || status.is_server_error() {
                Err(Attempt::Retry { wait: retry_after, err })
            } else {
                Err(Attempt::Fatal(err))
            };
        }
        let (choices, usage) = parse_reply(&text).map_err(|message| Attempt::Fatal(ChatError::Malformed { url: url.clone(), message, head: head(&text, 200) }))?;
        let (prompt_tokens, completion_tokens, estimated) = match usage {
            Some((p, c)) => (p, c, false),
            None => {
                let prompt_chars = body.to_string().len() as u64;
                let reply_chars: u64 = choices.iter().map(|c| c.len() as u64).sum();
                (prompt_chars / 4, reply_chars / 4, true)
            }
        };
        Ok(ChatReply {
            choices,
            prompt_tokens,
            completion_tokens,
            tokens_estimated: estimated,
            latency: Duration::ZERO,
            attempts,
            body: text,
        })
    }
}

/// The choices' texts and (prompt, completion) tokens of a chat-completions reply body.
pub fn parse_reply(text: &str) -> Result<(Vec<String>, Option<(u64, u64)>), String> {
    let parsed: Completion = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let choices: Vec<String> = parsed.choices.into_iter().filter_map(|c| c.message.content).collect();
    if choices.is_empty() {
        return Err("no choice has message.content".into());
    }
    Ok((choices, parsed.usage.map(|u| (u.prompt_tokens, u.completion_tokens))))
}

fn head(text: &str, n: usize) -> String {
    text.chars().take(n).collect()
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}
