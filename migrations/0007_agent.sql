-- The agent: every chat request and its reply, and which proposal of which reply each
-- agent iteration evaluated. A reply is stored before any of its proposals is
-- evaluated, so a resumed run never pays for it twice.
CREATE TABLE agent_requests (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id            TEXT NOT NULL REFERENCES runs(id),
    stage             TEXT NOT NULL,
    ordinal           INTEGER NOT NULL,      -- 1, 2, ... within the stage of the run
    status            TEXT NOT NULL,         -- pending | replied | failed | interrupted
    started_at        TEXT NOT NULL,
    finished_at       TEXT,
    endpoint          TEXT NOT NULL,
    model             TEXT NOT NULL,
    prompt_hash       TEXT NOT NULL,         -- sha256 of the request body
    prompt_json       TEXT NOT NULL,         -- the messages sent (no key: it is a header)
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    tokens_estimated  INTEGER NOT NULL DEFAULT 0,
    latency_ms        REAL,
    attempts          INTEGER,
    cost_usd          REAL,
    reply_text        TEXT,                  -- the reply body as received
    error             TEXT
);
CREATE INDEX agent_requests_run ON agent_requests(run_id, stage, ordinal);

CREATE TABLE agent_proposals (
    run_id        TEXT NOT NULL REFERENCES runs(id),
    seq           INTEGER NOT NULL,          -- the iteration that evaluated it
    request_id    INTEGER NOT NULL REFERENCES agent_requests(id),
    choice        INTEGER NOT NULL,          -- index of the reply's choice
    summary       TEXT NOT NULL,
    diff          TEXT,                      -- unified diff against the template it edited
    template_text TEXT,                      -- the edited template (NULL when it did not apply)
    PRIMARY KEY (run_id, seq)
);
