//! The agent's part of the ledger: each chat request (prompt hash, model, tokens,
//! latency, cost, the reply) and each proposal an iteration evaluated, in the tables
//! of `migrations/0007_agent.sql`.

use serde::Serialize;
use sqlx::Row;

use crate::storage::ledger::{now, Ledger, LedgerError};

type Result<T> = std::result::Result<T, LedgerError>;

fn q(what: &'static str) -> impl FnOnce(sqlx::Error) -> LedgerError {
    move |source| LedgerError::Query { what, source }
}

/// One request as stored.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRow {
    pub id: i64,
    pub stage: String,
    pub ordinal: i64,
    pub status: String,
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
#[derive(Debug, Clone, Serialize)]
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
        let row = sqlx::query("SELECT config_json FROM runs WHERE id = ?")
            .bind(run_id)
            .fetch_optional(self.pool())
            .await
            .map_err(q("read run config"))?;
        Ok(row
            .and_then(|r| r.get::<Option<String>, _>("config_json"))
            .and_then(|j| serde_json::from_str::<serde_json::Value>(&j).ok())
            .and_then(|v| v.get("agent").cloned()))
    }

    /// A request about to be sent (`pending` until its reply or failure is stored).
    pub async fn agent_request_begin(&self, run_id: &str, stage: &str, ordinal: i64, endpoint: &str, model: &str, hash: &str, prompt_json: &str) -> Result<i64> {
        let r = sqlx::query(
            "INSERT INTO agent_requests (run_id, stage, ordinal, status, started_at, endpoint, model, prompt_hash, prompt_json)
             VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?)",
        )
        .bind(run_id)
        .bind(stage)
        .bind(ordinal)
        .bind(now())
        .bind(endpoint)
        .bind(model)
        .bind(hash)
        .bind(prompt_json)
        .execute(self.pool())
        .await
        .map_err(q("record agent request"))?;
        Ok(r.last_insert_rowid())
    }

    pub async fn agent_request_replied(&self, id: i64, cost: &ReplyCost, reply: &str) -> Result<()> {
        sqlx::query(
            "UPDATE agent_requests SET status = 'replied', finished_at = ?, prompt_tokens = ?, completion_tokens = ?, tokens_estimated = ?,
             latency_ms = ?, attempts = ?, cost_usd = ?, reply_text = ? WHERE id = ?",
        )
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
        .map_err(q("record agent reply"))?;
        Ok(())
    }

    pub async fn agent_request_failed(&self, id: i64, error: &str, latency_ms: f64) -> Result<()> {
        sqlx::query("UPDATE agent_requests SET status = 'failed', finished_at = ?, error = ?, latency_ms = ? WHERE id = ?")
            .bind(now())
            .bind(error)
            .bind(latency_ms)
            .bind(id)
            .execute(self.pool())
            .await
            .map_err(q("record agent failure"))?;
        Ok(())
    }

    /// Requests left `pending` by a daemon that died mid-request: their reply never
    /// reached the ledger, so they are marked `interrupted` (and asked again).
    pub async fn agent_mark_interrupted(&self, run_id: &str) -> Result<u64> {
        let r = sqlx::query("UPDATE agent_requests SET status = 'interrupted', finished_at = ? WHERE run_id = ? AND status = 'pending'")
            .bind(now())
            .bind(run_id)
            .execute(self.pool())
            .await
            .map_err(q("mark agent requests interrupted"))?;
        Ok(r.rows_affected())
    }

    pub async fn agent_requests(&self, run_id: &str) -> Result<Vec<RequestRow>> {
        let rows = sqlx::query("SELECT * FROM agent_requests WHERE run_id = ? ORDER BY id")
            .bind(run_id)
            .fetch_all(self.pool())
            .await
            .map_err(q("list agent requests"))?;
        Ok(rows
            .iter()
            .map(|r| RequestRow {
                id: r.get("id"),
                stage: r.get("stage"),
                ordinal: r.get("ordinal"),
                status: r.get("status"),
                model: r.get("model"),
                prompt_hash: r.get("prompt_hash"),
                prompt_tokens: r.get("prompt_tokens"),
                completion_tokens: r.get("completion_tokens"),
                latency_ms: r.get("latency_ms"),
                attempts: r.get("attempts"),
                cost_usd: r.get("cost_usd"),
                reply_text: r.get("reply_text"),
                error: r.get("error"),
            })
            .collect())
    }

    /// Requests, tokens and cost of every request of the run that got a reply.
    pub async fn agent_usage(&self, run_id: &str) -> Result<crate::agent::limits::Usage> {
        let r = sqlx::query(
            "SELECT COUNT(*) AS n, COALESCE(SUM(prompt_tokens), 0) AS p, COALESCE(SUM(completion_tokens), 0) AS c, COALESCE(SUM(cost_usd), 0.0) AS cost
             FROM agent_requests WHERE run_id = ? AND status IN ('replied', 'failed')",
        )
        .bind(run_id)
        .fetch_one(self.pool())
        .await
        .map_err(q("sum agent usage"))?;
        Ok(crate::agent::limits::Usage {
            requests: r.get::<i64, _>("n") as u64,
            prompt_tokens: r.get::<i64, _>("p") as u64,
            completion_tokens: r.get::<i64, _>("c") as u64,
            cost_usd: r.get("cost"),
        })
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
        .map_err(q("record agent proposal"))?;
        Ok(())
    }

    pub async fn agent_proposals(&self, run_id: &str) -> Result<Vec<ProposalRow>> {
        let rows = sqlx::query("SELECT * FROM agent_proposals WHERE run_id = ? ORDER BY seq")
            .bind(run_id)
            .fetch_all(self.pool())
            .await
            .map_err(q("list agent proposals"))?;
        Ok(rows
            .iter()
            .map(|r| ProposalRow {
                seq: r.get("seq"),
                request_id: r.get("request_id"),
                choice: r.get("choice"),
                summary: r.get("summary"),
                diff: r.get("diff"),
                template_text: r.get("template_text"),
            })
            .collect())
    }
}
