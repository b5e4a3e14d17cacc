//! The agent's part of the ledger: each chat request (prompt hash, model, tokens,
//! latency, cost, the reply) and each proposal an iteration evaluated, in the tables
//! of `migrations/0007_agent.sql`.

use serde::Serialize;

use crate::storage::ledger::{now, Ledger, LedgerError};

type Result<T> = std::result::Result<T, LedgerError>;

/// Where a chat request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum RequestStatus {
    /// Recorded before sending; no reply stored yet.
    Pending,
    /// The reply is stored: its proposals can be evaluated without asking again.
    Replied,
    Failed,
    /// The daemon died while it was pending: a resumed run asks again.
    Interrupted,
}

impl RequestStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestStatus::Pending => "pending",
            RequestStatus::Replied => "replied",
            RequestStatus::Failed => "failed",
            RequestStatus::Interrupted => "interrupted",
        }
    }
}

/// One request as stored.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct RequestRow {
    pub id: i64,
    pub stage: String,
    pub ordinal: i64,
    pub status: RequestStatus,
    pub model: String,
    pub prompt_hash: String,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub latency_ms: Option<f64>,
    pub attempts: Option<i64>,
    pub cost_usd: Option<f64>,
    pub reply_text: Option<String>,
    pub error: Option<String>,
}

/// A stored reply's measured cost.
#[derive(Debug, Clone)]
pub struct ReplyCost {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub tokens_estimated: bool,
    pub latency_ms: f64,
    pub attempts: u32,
    pub cost_usd: f64,
}

/// One evaluated proposal as stored.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ProposalRow {
    pub seq: i64,
    pub request_id: i64,
    pub choice: i64,
    pub summary: String,
    pub diff: Option<String>,
    pub template_text: Option<String>,
}

impl Ledger {
    /// The `[agent]` section of the configuration the run started with (from its
    /// recorded effective config), if it has one.
    pub async fn run_agent_config(&self, run_id: &str) -> Result<Option<serde_json::Value>> {
        let json: Option<Option<String>> = sqlx::query_scalar("SELECT config_json FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(self.pool())
            .await
            .map_err(self.q("read run config"))?;
        Ok(json
            .flatten()
            .and_then(|j| serde_json::from_str::<serde_json::Value>(&j).ok())
            .and_then(|v| v.get("agent").cloned()))
    }

    /// A request about to be sent (`pending` until its reply or failure is stored).
    pub async fn agent_request_begin(&self, run_id: &str, stage: &str, ordinal: i64, endpoint: &str, model: &str, hash: &str, prompt_json: &str) -> Result<i64> {
        let r = sqlx::query(
            "INSERT INTO agent_requests (run_id, stage, ordinal, status, started_at, endpoint, model, prompt_hash, prompt_json)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(run_id)
        .bind(stage)
        .bind(ordinal)
        .bind(RequestStatus::Pending)
        .bind(now())
        .bind(endpoint)
        .bind(model)
        .bind(hash)
        .bind(prompt_json)
        .execute(self.pool())
        .await
        .map_err(self.q("record agent request"))?;
        Ok(r.last_insert_rowid())
    }

    pub async fn agent_request_replied(&self, id: i64, cost: &ReplyCost, reply: &str) -> Result<()> {
        sqlx::query(
            "UPDATE agent_requests SET status = ?, finished_at = ?, prompt_tokens = ?, completion_tokens = ?, tokens_estimated = ?,
             latency_ms = ?, attempts = ?, cost_usd = ?, reply_text = ? WHERE id = ?",
        )
        .bind(RequestStatus::Replied)
        .bind(now())
        .bind(cost.prompt_tokens as i64)
        .bind(cost.completion_tokens as i64)
        .bind(cost.tokens_estimated as i64)
        .bind(cost.latency_ms)
        .bind(cost.attempts as i64)
        .bind(cost.cost_usd)
        .bind(reply)
        .bind(id)
        .execute(self.pool())
        .await
        .map_err(self.q("record agent reply"))?;
        Ok(())
    }

    pub async fn agent_request_failed(&self, id: i64, error: &str, latency_ms: f64) -> Result<()> {
        sqlx::query("UPDATE agent_requests SET status = ?, finished_at = ?, error = ?, latency_ms = ? WHERE id = ?")
            .bind(RequestStatus::Failed)
            .bind(now())
            .bind(error)
            .bind(latency_ms)
            .bind(id)
            .execute(self.pool())
            .await
            .map_err(self.q("record agent failure"))?;
        Ok(())
    }

    /// Requests left `pending` by a daemon that died mid-request: their reply never
    /// reached the ledger, so they are marked `interrupted` (and asked again).
    pub async fn agent_mark_interrupted(&self, run_id: &str) -> Result<u64> {
        let r = sqlx::query("UPDATE agent_requests SET status = ?, finished_at = ? WHERE run_id = ? AND status = ?")
            .bind(RequestStatus::Interrupted)
            .bind(now())
            .bind(run_id)
            .bind(RequestStatus::Pending)
            .execute(self.pool())
            .await
            .map_err(self.q("mark agent requests interrupted"))?;
        Ok(r.rows_affected())
    }

    pub async fn agent_requests(&self, run_id: &str) -> Result<Vec<RequestRow>> {
        sqlx::query_as("SELECT * FROM agent_requests WHERE run_id = ? ORDER BY id")
            .bind(run_id)
            .fetch_all(self.pool())
            .await
            .map_err(self.q("list agent requests"))
    }

    /// Requests, tokens and cost of every request of the run that got a reply.
    pub async fn agent_usage(&self, run_id: &str) -> Result<crate::spec::agent::Usage> {
        let (n, p, c, cost): (i64, i64, i64, f64) = sqlx::query_as(
            "SELECT COUNT(*), COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cost_usd), 0.0)
             FROM agent_requests WHERE run_id = ? AND status IN (?, ?)",
        )
        .bind(run_id)
        .bind(RequestStatus::Replied)
        .bind(RequestStatus::Failed)
        .fetch_one(self.pool())
        .await
        .map_err(self.q("sum agent usage"))?;
        Ok(crate::spec::agent::Usage { requests: n as u64, prompt_tokens: p as u64, completion_tokens: c as u64, cost_usd: cost })
    }

    pub async fn agent_proposal(&self, run_id: &str, p: &ProposalRow) -> Result<()> {
        sqlx::query(
            "INSERT OR REPLACE INTO agent_proposals (run_id, seq, request_id, choice, summary, diff, template_text) VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(run_id)
        .bind(p.seq)
        .bind(p.request_id)
        .bind(p.choice)
        .bind(&p.summary)
        .bind(&p.diff)
        .bind(&p.template_text)
        .execute(self.pool())
        .await
        .map_err(self.q("record agent proposal"))?;
        Ok(())
    }

    pub async fn agent_proposals(&self, run_id: &str) -> Result<Vec<ProposalRow>> {
        sqlx::query_as("SELECT * FROM agent_proposals WHERE run_id = ? ORDER BY seq")
            .bind(run_id)
            .fetch_all(self.pool())
            .await
            .map_err(self.q("list agent proposals"))
    }
}
