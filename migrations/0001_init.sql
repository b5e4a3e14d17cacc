-- The ledger: every run, every iteration, and the best kernel per workload shape.

CREATE TABLE runs (
    id            TEXT PRIMARY KEY,          -- e.g. 20261121-174501-3f2a
    state         TEXT NOT NULL,             -- running | finished | failed | stopped | interrupted
    started_at    TEXT NOT NULL,             -- RFC 3339, UTC
    finished_at   TEXT,
    budget_s      REAL NOT NULL,
    used_s        REAL NOT NULL DEFAULT 0,   -- budget consumed so far
    stage         TEXT,                      -- stage in progress
    run_dir       TEXT NOT NULL,
    config_source TEXT NOT NULL,
    plan_path     TEXT NOT NULL,
    config_json   TEXT NOT NULL,             -- the effective configuration
    workload_json TEXT NOT NULL,             -- the shapes, as run
    gpu_name      TEXT,
    device_json   TEXT,                      -- DeviceInfo: cc, SMs, smem, L2, driver, NVRTC
    pid           INTEGER,
    message       TEXT                       -- why the run ended
);

CREATE TABLE iterations (
    run_id        TEXT NOT NULL REFERENCES runs(id),
    seq           INTEGER NOT NULL,          -- 1, 2, ... within the run
    stage         TEXT NOT NULL,
    template      TEXT NOT NULL,
    params_json   TEXT NOT NULL,
    source_hash   TEXT,                      -- sha256 of the rendered source
    git_commit    TEXT,                      -- candidate commit in the run's workspace
    verdict       TEXT NOT NULL,             -- baseline | accepted | rejected | gated | compile_error | incorrect | cta_mismatch | crashed | timeout | error
    reason        TEXT NOT NULL,
    compile_ms    REAL,
    registers     INTEGER,                   -- of the first kernel (all kernels in resources_json)
    local_bytes   INTEGER,                   -- spills
    static_smem   INTEGER,
    resources_json TEXT,                     -- per kernel: registers, smem, local, max threads; occupancy
    score_us      REAL,                      -- geometric mean of per-shape median times
    error         TEXT,                      -- compiler log, CUDA error, or worker exit
    started_at    TEXT NOT NULL,
    finished_at   TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE iteration_shapes (
    run_id        TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    shape         TEXT NOT NULL,             -- Shape::key(), e.g. b2h8s128d64
    shape_json    TEXT NOT NULL,
    n_splits      INTEGER,
    ctas          INTEGER,                   -- planned CTAs, all launches
    waves         REAL,                      -- first launch's CTAs / (SMs * blocks per SM)
    check_passed  INTEGER,                   -- NULL: not checked
    max_abs       REAL,
    rel_l2        REAL,
    ctas_ran      INTEGER,                   -- counted by the check build
    median_us     REAL,
    p10_us        REAL,
    p90_us        REAL,
    samples       INTEGER,
    incumbent_us  REAL,                      -- incumbent median in the same interleaved timing
    speedup_vs_incumbent REAL,
    speedup_vs_baseline  REAL,
    threshold     REAL,                      -- gain needed to win (noise or floor)
    tflops        REAL,
    won           INTEGER NOT NULL DEFAULT 0,  -- became the best kernel for this shape
    PRIMARY KEY (run_id, seq, shape),
    FOREIGN KEY (run_id, seq) REFERENCES iterations(run_id, seq)
);

CREATE TABLE best (
    run_id        TEXT NOT NULL REFERENCES runs(id),
    shape         TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    median_us     REAL NOT NULL,
    baseline_us   REAL,
    source_path   TEXT NOT NULL,             -- inside the run's workspace
    git_commit    TEXT,
    PRIMARY KEY (run_id, shape)
);

CREATE TABLE events (
    run_id        TEXT NOT NULL REFERENCES runs(id),
    at            TEXT NOT NULL,
    kind          TEXT NOT NULL,             -- stage_start | stage_skipped | worker_restart | ...
    message       TEXT NOT NULL
);

CREATE INDEX iterations_by_run ON iterations(run_id, seq);
