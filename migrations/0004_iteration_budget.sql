-- Budget used when each iteration was recorded: time-to-target per shape comes from it.
ALTER TABLE iterations ADD COLUMN used_s REAL;
