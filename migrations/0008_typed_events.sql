-- Typed events: what a resumed run reads back is stored as JSON (`data_json`, the serde form
-- of `storage::ledger::Event`), no longer parsed out of the human message. Older ledgers'
-- events of those kinds are converted here, with the same parsing the daemon used to do:
--   stage_start      "<stage> start <params JSON>"      -> {"event":"stage_start","stage":..,"start":{..}}
--   stage_not_needed "<stage>: not needed: ..."          -> {"event":"stage_not_needed","stage":..}
--   memory           the `--fresh` message               -> {"event":"memory_off"}
-- Verdicts and run states keep their snake_case names: they are read as enums now.

ALTER TABLE events ADD COLUMN data_json TEXT;

UPDATE events
SET data_json = json_object(
        'event', 'stage_start',
        'stage', substr(message, 1, instr(message, ' start ') - 1),
        'start', json(substr(message, instr(message, ' start ') + 7)))
WHERE kind = 'stage_start'
  AND instr(message, ' start ') > 0
  AND json_valid(substr(message, instr(message, ' start ') + 7));

UPDATE events
SET data_json = json_object('event', 'stage_not_needed', 'stage', substr(message, 1, instr(message, ':') - 1))
WHERE kind = 'stage_not_needed' AND instr(message, ':') > 0;

UPDATE events
SET data_json = json_object('event', 'memory_off')
WHERE kind = 'memory' AND message = 'fresh: the memory of earlier runs is ignored (--fresh)';
