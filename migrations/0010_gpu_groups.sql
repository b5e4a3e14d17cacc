-- Several GPUs (`start --gpus`) and several machines (`--ledger postgres://...`): a group's
-- coordinator splits the workload into work items, one per shape class, and keeps one
-- daemon per GPU busy: each takes the next item and optimizes its shapes as an ordinary run
-- (its own budget share, workspace, SDPA baseline and closing comparison on its GPU). The
-- queue is the group's plan position: a resumed group starts the items still queued and
-- resumes the runs of the items that were cut off.
--
-- This file is the one source of truth for these tables in both backends: the SQLite
-- ledger applies it as migration 10, and a fleet's PostgreSQL database applies the same
-- text (src/fleet/pg.rs embeds it). So it is written in the SQL both accept: TEXT, BIGINT,
-- DOUBLE PRECISION; times as RFC 3339 UTC text with milliseconds (ordered as text).

CREATE TABLE run_groups (
    id            TEXT PRIMARY KEY,
    state         TEXT NOT NULL,              -- running | finished | failed | stopped | interrupted (RunState)
    started_at    TEXT NOT NULL,
    finished_at   TEXT,
    budget_s      DOUBLE PRECISION NOT NULL,  -- wall-clock budget of the whole group
    used_s        DOUBLE PRECISION NOT NULL DEFAULT 0,
    gpus_json     TEXT NOT NULL,              -- [{ "index": N, "device": DeviceInfo }] of the machine that created it
    config_source TEXT NOT NULL,
    plan_path     TEXT NOT NULL,
    options_json  TEXT NOT NULL,              -- what each run is started with (fresh, seed)
    pid           BIGINT,
    message       TEXT
);

CREATE TABLE work_items (
    group_id      TEXT NOT NULL REFERENCES run_groups(id),
    seq           BIGINT NOT NULL,            -- 1, 2, ... in the order items are taken
    class         TEXT NOT NULL,              -- the shape class (strategy::open::classify)
    shapes_json   TEXT NOT NULL,              -- the class's shape keys
    state         TEXT NOT NULL,              -- queued | running | done | stopped | failed (ItemState)
    gpu           BIGINT,                     -- the GPU that took it last
    run_id        TEXT,                       -- its run (kept when the item is taken again on the same machine: resumed)
    budget_s      DOUBLE PRECISION,           -- the budget share its run was given
    attempts      BIGINT NOT NULL DEFAULT 0,  -- times taken
    claimed_at    TEXT,
    finished_at   TEXT,
    message       TEXT,
    holder        TEXT,                       -- who runs it: machine (host name) and coordinator pid
    lease_until   TEXT,                       -- a running item whose lease passed is taken again by any coordinator
    PRIMARY KEY (group_id, seq)
);

-- Memory across machines: what a fleet's finished runs measured (the rows
-- storage::memory reads from a ledger's iterations), published by the coordinator that ran
-- them, read by every coordinator before it starts an item. Keyed like local memory by
-- the device description (model, cc, SMs, driver, NVRTC): an H100's results never
-- warm-start an L4.
CREATE TABLE fleet_memory (
    run_id        TEXT NOT NULL,
    seq           BIGINT NOT NULL,
    shape         TEXT NOT NULL,
    template      TEXT NOT NULL,
    params_json   TEXT NOT NULL,
    source_hash   TEXT NOT NULL,
    shape_json    TEXT NOT NULL,
    median_us     DOUBLE PRECISION NOT NULL,
    device_json   TEXT NOT NULL,
    started_at    TEXT NOT NULL,              -- its run's start: memory is of runs that started earlier
    machine       TEXT NOT NULL,
    PRIMARY KEY (run_id, seq, shape)
);
