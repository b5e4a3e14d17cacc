-- Which GPU of its host a run used, and which group started it (`start --gpus`).
ALTER TABLE runs ADD COLUMN gpu INTEGER;      -- host GPU index (among the visible devices); NULL: the default device
ALTER TABLE runs ADD COLUMN group_id TEXT;    -- the group that started the run; NULL: a run of its own
