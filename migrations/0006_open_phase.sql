-- Per-shape gating: why the gate refused a candidate for this shape (shared memory, the
-- CTA floor, a tensor map) while it went on with the shapes it fits. NULL: not refused.
ALTER TABLE iteration_shapes ADD COLUMN gated TEXT;
-- Where an iteration's time went, next to compile_ms: the correctness check and the
-- interleaved timing (milliseconds of wall time; NULL: the stage was not reached).
ALTER TABLE iterations ADD COLUMN check_ms REAL;
ALTER TABLE iterations ADD COLUMN time_ms REAL;
