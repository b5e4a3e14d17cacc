-- Several GPUs of one host (`start --gpus`). A group's coordinator splits the workload into
-- work items, one per shape class, and runs one daemon per GPU; each daemon takes the next
-- queued item, optimizes its shapes as an ordinary run (its own budget share, workspace,
-- SDPA baseline and closing comparison on its GPU), and records it here. The queue is the
-- group's plan position: a resumed group starts the items still queued and resumes the
-- runs of the items that were cut off.
ALTER TABLE runs ADD COLUMN gpu INTEGER;      -- host GPU index (among the visible devices) the run used; NULL: the default device
ALTER TABLE runs ADD COLUMN group_id TEXT;    -- the group that started the run; NULL: a run of its own

CREATE TABLE run_groups (
    id            TEXT PRIMARY KEY,
    state         TEXT NOT NULL,              -- running | finished | failed | stopped | interrupted (RunState)
    started_at    TEXT NOT NULL,
    finished_at   TEXT,
    budget_s      REAL NOT NULL,              -- wall-clock budget of the whole group
    used_s        REAL NOT NULL DEFAULT 0,    -- wall-clock budget used so far (every process of the group)
    gpus_json     TEXT NOT NULL,              -- [{ "index": N, "device": DeviceInfo }] as found at start
    config_source TEXT NOT NULL,
    plan_path     TEXT NOT NULL,
    options_json  TEXT NOT NULL,              -- what each run is started with (fresh, seed)
    pid           INTEGER,
    message       TEXT
);

CREATE TABLE work_items (
    group_id      TEXT NOT NULL REFERENCES run_groups(id),
    seq           INTEGER NOT NULL,           -- 1, 2, ... in the order items are taken
    class         TEXT NOT NULL,              -- the shape class (strategy::open::classify)
    shapes_json   TEXT NOT NULL,              -- the class's shape keys
    state         TEXT NOT NULL,              -- queued | running | done | stopped | failed (ItemState)
    gpu           INTEGER,                    -- the GPU that took it last
    run_id        TEXT,                       -- its run (kept when the item is taken again: the run is resumed)
    budget_s      REAL,                       -- the budget share its run was given
    attempts      INTEGER NOT NULL DEFAULT 0, -- times taken
    claimed_at    TEXT,
    finished_at   TEXT,
    message       TEXT,
    PRIMARY KEY (group_id, seq)
);
