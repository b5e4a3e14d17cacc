//! The `events` table: what happened to a run besides its iterations, for people (each
//! row's message) and, where a resumed run must read it back, for the daemon (a typed
//! [`Event`] stored as JSON in `data_json`, never parsed out of the message).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{now, Ledger, LedgerError, Result};
use crate::spec::template::Params;

/// What kind of event a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum EventKind {
    /// A plan stage began (typed: [`Event::StageStart`]).
    StageStart,
    /// A stage could not run here (its target on this GPU, the agent off, nothing to tune).
    StageSkipped,
    /// The diagnosis found no symptom the stage treats (typed: [`Event::StageNotNeeded`]).
    StageNotNeeded,
    /// The diagnosis behind a `when` stage's decision, as JSON.
    Diagnosis,
    OpenPhase,
    ClassConverged,
    /// Whether the run uses the memory of earlier runs (typed when off: [`Event::MemoryOff`]).
    Memory,
    MemoryStale,
    WorkerRestart,
    WaitedForGpu,
    Resumed,
    /// `best` moved back to the ledger's last recorded acceptance on resume.
    WorkspaceAligned,
    IncumbentsRevalidated,
    Sdpa,
    SdpaUnavailable,
    Closing,
    ClosingFailed,
    /// The closing's sustained re-rank finished (what it kept or changed): a resumed run
    /// does not re-rank again.
    Rerank,
    /// How long the closing comparison took (typed: [`Event::ClosingTime`]); later runs on
    /// the same GPU reserve that much of their budget for theirs.
    ClosingTime,
    /// The part of the budget this run keeps for its closing (typed: [`Event::ClosingReserve`]).
    ClosingReserve,
    /// The closing was cut to fit the time left of the budget (shorter sustained windows, no
    /// re-rank, or burst timing only: engine/reserve.rs).
    ClosingCut,
    AgentResumed,
    AgentStageEnd,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::StageStart => "stage_start",
            EventKind::StageSkipped => "stage_skipped",
            EventKind::StageNotNeeded => "stage_not_needed",
            EventKind::Diagnosis => "diagnosis",
            EventKind::OpenPhase => "open_phase",
            EventKind::ClassConverged => "class_converged",
            EventKind::Memory => "memory",
            EventKind::MemoryStale => "memory_stale",
            EventKind::WorkerRestart => "worker_restart",
            EventKind::WaitedForGpu => "waited_for_gpu",
            EventKind::Resumed => "resumed",
            EventKind::WorkspaceAligned => "workspace_aligned",
            EventKind::IncumbentsRevalidated => "incumbents_revalidated",
            EventKind::Sdpa => "sdpa",
            EventKind::SdpaUnavailable => "sdpa_unavailable",
            EventKind::Closing => "closing",
            EventKind::ClosingFailed => "closing_failed",
            EventKind::Rerank => "rerank",
            EventKind::ClosingTime => "closing_time",
            EventKind::ClosingReserve => "closing_reserve",
            EventKind::ClosingCut => "closing_cut",
            EventKind::AgentResumed => "agent_resumed",
            EventKind::AgentStageEnd => "agent_stage_end",
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The events a resumed run reads back, with what it needs of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A stage began its search at `start` (a resumed run replays from the same point).
    StageStart { stage: String, start: Params },
    /// The diagnosis skipped `stage`; it stays skipped after a restart.
    StageNotNeeded { stage: String },
    /// The run was started `--fresh`: a resumed run ignores the memory of earlier runs too.
    MemoryOff,
    /// The closing comparison (re-rank included) of `shapes` shapes took `seconds`, with
    /// sustained windows of `sustained_ms` (0: burst timing only), `window_s_per_shape` GPU
    /// seconds of them per shape (None: recorded before the windows were counted).
    ClosingTime {
        seconds: f64,
        shapes: u32,
        sustained_ms: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window_s_per_shape: Option<f64>,
        /// The re-rank's modelled time per shape besides its windows (engine/reserve.rs; 0:
        /// none; None: recorded before it was modelled).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rerank_s_per_shape: Option<f64>,
        /// The re-rank as it ran, where it did (None: no re-rank, or recorded before it was
        /// measured): later runs learn its cost per contender from it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rerank: Option<RerankTime>,
    },
    /// The run ends its search `seconds` before its budget, for its closing; a resumed run
    /// keeps the figure it was started with.
    ClosingReserve { seconds: f64 },
}

/// How long a closing's sustained re-rank took, beside what of it was sustained windows.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RerankTime {
    /// Wall seconds of the whole re-rank (every shape).
    pub seconds: f64,
    /// Of which sustained windows per shape, as modelled (counted windows x their length,
    /// stretched: engine/reserve.rs).
    pub window_s_per_shape: f64,
    /// Contenders per shape besides the incumbent (`timing.rerank_top` - 1).
    pub contenders: u32,
}

impl Event {
    pub fn kind(&self) -> EventKind {
        match self {
            Event::StageStart { .. } => EventKind::StageStart,
            Event::StageNotNeeded { .. } => EventKind::StageNotNeeded,
            Event::MemoryOff => EventKind::Memory,
            Event::ClosingTime { .. } => EventKind::ClosingTime,
            Event::ClosingReserve { .. } => EventKind::ClosingReserve,
        }
    }
}

/// One row of the `events` table.
#[derive(Debug, Clone)]
pub struct EventRow {
    pub at: String,
    pub kind: EventKind,
    pub message: String,
    /// The typed event, for the kinds a resume reads (None for the others).
    pub data: Option<Event>,
}

#[derive(sqlx::FromRow)]
struct RawEvent {
    at: String,
    kind: EventKind,
    message: String,
    data_json: Option<String>,
}

/// What a resumed run needs from its events about the plan's stages.
#[derive(Debug, Clone, Default)]
pub struct StageHistory {
    starts: BTreeMap<String, Params>,
    not_needed: BTreeSet<String>,
}

impl StageHistory {
    pub fn of(events: &[EventRow]) -> StageHistory {
        let mut h = StageHistory::default();
        for e in events {
            match &e.data {
                Some(Event::StageStart { stage, start }) => {
                    h.starts.entry(stage.clone()).or_insert_with(|| start.clone());
                }
                Some(Event::StageNotNeeded { stage }) => {
                    h.not_needed.insert(stage.clone());
                }
                _ => {}
            }
        }
        h
    }

    /// Where `stage`'s search started, if it began before.
    pub fn start(&self, stage: &str) -> Option<&Params> {
        self.starts.get(stage)
    }

    pub fn not_needed(&self, stage: &str) -> bool {
        self.not_needed.contains(stage)
    }
}

impl Ledger {
    /// Record an event for people: a kind and a message.
    pub async fn event(&self, run_id: &str, kind: EventKind, message: &str) -> Result<()> {
        self.insert_event(run_id, kind, message, None).await
    }

    /// Record an event a resumed run reads back, with a message for people.
    pub async fn record_event(&self, run_id: &str, event: &Event, message: &str) -> Result<()> {
        let data = serde_json::to_string(event).map_err(LedgerError::Encode)?;
        self.insert_event(run_id, event.kind(), message, Some(data)).await
    }

    /// Record an event unless the run already has one with this kind and message (a resumed
    /// run re-derives the same decisions).
    pub async fn event_once(&self, run_id: &str, kind: EventKind, message: &str) -> Result<bool> {
        let seen: Option<i64> = sqlx::query_scalar("SELECT 1 FROM events WHERE run_id = ? AND kind = ? AND message = ? LIMIT 1")
            .bind(run_id)
            .bind(kind)
            .bind(message)
            .fetch_optional(&self.pool)
            .await
            .map_err(self.q("read events"))?;
        if seen.is_none() {
            self.event(run_id, kind, message).await?;
        }
        Ok(seen.is_none())
    }

    async fn insert_event(&self, run_id: &str, kind: EventKind, message: &str, data: Option<String>) -> Result<()> {
        sqlx::query("INSERT INTO events (run_id, at, kind, message, data_json) VALUES (?, ?, ?, ?, ?)")
            .bind(run_id)
            .bind(now())
            .bind(kind)
            .bind(message)
            .bind(data)
            .execute(&self.pool)
            .await
            .map_err(self.q("record event"))?;
        Ok(())
    }

    /// The closing times recorded by runs on GPUs named `gpu_name`, newest first (at most
    /// `limit`): what a new run on that GPU expects its own closing to take.
    pub async fn closing_times(&self, gpu_name: &str, limit: u32) -> Result<Vec<Event>> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT e.data_json FROM events e JOIN runs r ON r.id = e.run_id \
             WHERE e.kind = ? AND r.gpu_name = ? AND e.data_json IS NOT NULL ORDER BY e.at DESC, e.rowid DESC LIMIT ?",
        )
        .bind(EventKind::ClosingTime)
        .bind(gpu_name)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(self.q("read closing times"))?;
        Ok(rows.into_iter().filter_map(|(j,)| serde_json::from_str(&j).ok()).collect())
    }

    /// The part of its budget run `run_id` keeps for its closing (`Event::ClosingReserve`);
    /// None for a run recorded before the reserve existed.
    pub async fn closing_reserve(&self, run_id: &str) -> Result<Option<f64>> {
        Ok(self.events(run_id).await?.into_iter().find_map(|e| match e.data {
            Some(Event::ClosingReserve { seconds }) => Some(seconds),
            _ => None,
        }))
    }

    pub async fn events(&self, run_id: &str) -> Result<Vec<EventRow>> {
        let rows: Vec<RawEvent> = sqlx::query_as("SELECT at, kind, message, data_json FROM events WHERE run_id = ? ORDER BY rowid")
            .bind(run_id)
            .fetch_all(&self.pool)
            .await
            .map_err(self.q("list events"))?;
        Ok(rows
            .into_iter()
            .map(|r| EventRow {
                // Data this release cannot read (a newer one wrote it) is left out, not fatal.
                data: r.data_json.and_then(|j| serde_json::from_str(&j).ok()),
                at: r.at,
                kind: r.kind,
                message: r.message,
            })
            .collect())
    }
}
