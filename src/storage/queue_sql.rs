//! The SQL of a group's queue, written once for both backends: the SQLite ledger binds `?`
//! as written, a fleet's PostgreSQL database gets the same text numbered (`$1`, `$2`, ...,
//! [`numbered`]). Both bind the same values in the same order; what only one backend can
//! say (row locks, `GREATEST`) stays with that backend.

/// A new group; a second insert of the same id does nothing (a fleet's machine joining).
pub const INSERT_GROUP: &str = "INSERT INTO run_groups (id, state, started_at, budget_s, gpus_json, config_source, plan_path, options_json, pid)
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING";

pub const INSERT_ITEM: &str = "INSERT INTO work_items (group_id, seq, class, shapes_json, state, run_id) VALUES (?, ?, ?, ?, ?, ?)";

/// Take the oldest item that is queued, or running under a lease that has passed.
/// Binds: running, gpu, budget_s, now, holder, lease_until, group, group, queued, running, now.
/// `lock` goes after the inner query's LIMIT (PostgreSQL: `FOR UPDATE SKIP LOCKED`).
pub fn claim(columns: &str, lock: &str) -> String {
    format!(
        "UPDATE work_items SET state = ?, gpu = ?, budget_s = ?, attempts = attempts + 1, claimed_at = ?, finished_at = NULL, message = NULL,
                holder = ?, lease_until = ?
         WHERE group_id = ? AND seq = (
             SELECT seq FROM work_items WHERE group_id = ? AND (state = ? OR (state = ? AND lease_until < ?))
             ORDER BY seq LIMIT 1 {lock})
         RETURNING {columns}"
    )
}

/// Binds: lease_until, group, holder, running.
pub const RENEW_LEASES: &str = "UPDATE work_items SET lease_until = ? WHERE group_id = ? AND holder = ? AND state = ?";

/// An item's end (or return to the queue): its lease ends, its holder stays (where it ran).
/// Binds: state, message, finished_at, group, seq.
pub const SET_ITEM_STATE: &str = "UPDATE work_items SET state = ?, message = ?, finished_at = ?, lease_until = NULL WHERE group_id = ? AND seq = ?";

pub fn select_items(columns: &str) -> String {
    format!("SELECT {columns} FROM work_items WHERE group_id = ? ORDER BY seq")
}

/// `?` placeholders numbered for PostgreSQL: `$1`, `$2`, ... (no `?` appears in our SQL's strings).
pub fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_in_order() {
        assert_eq!(numbered("UPDATE t SET a = ?, b = ? WHERE c = ?"), "UPDATE t SET a = $1, b = $2 WHERE c = $3");
        assert_eq!(numbered(RENEW_LEASES).matches('$').count(), 4);
        assert_eq!(numbered(&claim("seq", "")).matches('$').count(), 11);
    }
}
