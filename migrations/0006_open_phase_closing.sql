-- Per-shape gating: why the gate refused a candidate for this shape (shared memory, the
-- CTA floor, a tensor map) while it went on with the shapes it fits. NULL: not refused.
ALTER TABLE iteration_shapes ADD COLUMN gated TEXT;
-- Where an iteration's time went, next to compile_ms: the correctness check and the
-- interleaved timing (milliseconds of wall time; NULL: the stage was not reached).
ALTER TABLE iterations ADD COLUMN check_ms REAL;
ALTER TABLE iterations ADD COLUMN time_ms REAL;
-- The closing comparison: when a run finishes, each shape's best kernel is re-timed just
-- before and just after a fresh SDPA measurement, so the two are compared at the same
-- clocks (SDPA's figure in `sdpa` was taken at the start, before any sustained load).
CREATE TABLE closing (
    run_id TEXT NOT NULL REFERENCES runs(id),
    shape TEXT NOT NULL,
    seq INTEGER NOT NULL,            -- the best kernel's iteration
    ours_before_us REAL NOT NULL,    -- median, timed before SDPA
    ours_after_us REAL NOT NULL,     -- median, timed after SDPA
    sdpa_default_us REAL,            -- SDPA default backend, CUDA-graph time per call
    sdpa_picked TEXT,
    sdpa_json TEXT NOT NULL,         -- every backend, as scripts/sdpa_baseline.py gives it
    measured_at TEXT NOT NULL,
    PRIMARY KEY (run_id, shape)
);
