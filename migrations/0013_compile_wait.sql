-- How long an iteration's load waited for the compiler (ms): 0 when the look-ahead had its
-- build ready (or the worker had built it moments before), the rest of its build otherwise.
-- The status's `to best` line sums it ("waiting for the compiler"). NULL: not compiled, or
-- recorded before this migration.
ALTER TABLE iterations ADD COLUMN compile_wait_ms REAL;
