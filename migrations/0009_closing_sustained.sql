-- The closing comparison under sustained load (timing.sustained_ms): each best kernel and the
-- baselines replayed back to back for at least `sustained_ms` (a model step's length, at the
-- clocks sustained power draw allows) beside the short-sample ("burst") figures above. NULL:
-- not measured (sustained_ms = 0, or a row written before this migration). FA4's sustained
-- figure is in sdpa_json (`fa4.sustained_us`), as every backend's is.
ALTER TABLE closing ADD COLUMN ours_sustained_before_us REAL;
ALTER TABLE closing ADD COLUMN ours_sustained_after_us REAL;
ALTER TABLE closing ADD COLUMN sdpa_default_sustained_us REAL;
ALTER TABLE closing ADD COLUMN sustained_ms REAL;
