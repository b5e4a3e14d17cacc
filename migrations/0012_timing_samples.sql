-- The timing samples behind a shape's decision, in the order the worker took them:
-- {"candidate": [us, ...], "incumbent": [us, ...]} ("incumbent" absent without one). The
-- accept rule pairs them round by round (src/pipeline/decide.rs); kept so that a rule can be
-- re-judged against real runs. NULL: not timed, or recorded before this migration.
ALTER TABLE iteration_shapes ADD COLUMN timing_samples TEXT;
