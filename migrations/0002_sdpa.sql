-- PyTorch SDPA timings: cached per device, driver, torch, cuDNN and shape, and recorded per run.

CREATE TABLE sdpa_cache (
    key          TEXT PRIMARY KEY,     -- device|cc|driver|torch|cudnn|shape
    measured_at  TEXT NOT NULL,
    result_json  TEXT NOT NULL         -- one shape's entry from scripts/sdpa_baseline.py
);

CREATE TABLE sdpa (
    run_id       TEXT NOT NULL REFERENCES runs(id),
    shape        TEXT NOT NULL,
    default_graph_us REAL,             -- SDPA's default backend, CUDA-graph GPU time per call
    default_eager_us REAL,
    picked       TEXT,                 -- the backend the default dispatched to
    result_json  TEXT NOT NULL,        -- every backend's timings
    versions_json TEXT NOT NULL,       -- torch, CUDA, cuDNN, device
    cached       INTEGER NOT NULL,     -- 1 when it came from sdpa_cache
    PRIMARY KEY (run_id, shape)
);
