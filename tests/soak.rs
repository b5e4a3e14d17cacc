//! A short soak on the CPU: `scripts/soak.sh` drives `optimizerd start` (this build)
//! against the scripted worker for 2,000 iterations (accepts, rejections, compile errors,
//! wrong results, CTA mismatches, sticky errors, crashes and a hang: the worker is
//! restarted about 80 times) and samples the daemon every 250 recorded iterations.
//! After a 500-iteration warm-up the daemon's resident memory must stay within 10% and
//! its open descriptors (besides the SQLite pool's) and the worker's must not change.
//! docs/soak/ has the 10,000-iteration run of the same script.

use std::path::Path;
use std::process::Command;

const ITERATIONS: u64 = 2000;
const EVERY: u64 = 250;
const WARMUP: u64 = 500;

/// One CSV row, by column name.
struct Row(std::collections::HashMap<String, String>);

impl Row {
    fn int(&self, key: &str) -> Option<u64> {
        self.0.get(key).filter(|v| !v.is_empty()).map(|v| v.parse().unwrap_or_else(|e| panic!("{key} = {v:?}: {e}")))
    }
    fn get(&self, key: &str) -> u64 {
        self.int(key).unwrap_or_else(|| panic!("no {key} in this sample"))
    }
}

fn read_csv(path: &Path) -> Vec<Row> {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header: Vec<String> = r.headers().unwrap().iter().map(String::from).collect();
    r.records().map(|rec| Row(header.iter().cloned().zip(rec.unwrap().iter().map(String::from)).collect())).collect()
}

#[test]
fn daemon_memory_and_descriptors_stay_flat_over_2000_iterations() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(root.join("scripts/soak.sh"))
        .args(["--iterations", &ITERATIONS.to_string(), "--every", &EVERY.to_string(), "--warmup", &WARMUP.to_string()])
        .arg("--dir")
        .arg(dir.path())
        .arg("--bin")
        .arg(env!("CARGO_BIN_EXE_optimizerd"))
        .output()
        .expect("bash runs scripts/soak.sh");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "soak.sh failed:\n{text}");
    let rows = read_csv(&dir.path().join("soak.csv"));
    let last = rows.last().unwrap_or_else(|| panic!("no samples:\n{text}"));
    assert!(last.get("iteration") >= ITERATIONS, "the run ended early:\n{text}");
    // A sample at least every EVERY iterations (the sampler may land a few past a mark).
    assert!(rows.len() as u64 >= ITERATIONS / EVERY, "{} samples:\n{text}", rows.len());
    // The soak went through worker restarts: descriptors are compared across them.
    assert!(last.get("worker_restarts") >= 20, "too few worker restarts to mean anything:\n{text}");

    let after: Vec<&Row> = rows.iter().filter(|r| r.get("iteration") >= WARMUP).collect();
    assert!(after.len() >= 5, "too few samples after the warm-up:\n{text}");
    let (rss0, rss1) = (after[0].get("daemon_rss_kb") as f64, after[after.len() - 1].get("daemon_rss_kb") as f64);
    // Fails when about 2 KB is kept per iteration (1,500 iterations on a ~30 MB debug
    // daemon). Measured here: every loaded candidate's module kept (docs/soak/README.md,
    // fix 1) +126%; with that fixed, libgit2's object cache (about 1 KB per iteration) +5%.
    let growth = (rss1 - rss0) / rss0;
    assert!(growth < 0.10, "daemon RSS grew {:.1}% after the warm-up ({rss0} kB -> {rss1} kB):\n{text}", growth * 100.0);

    // Any descriptor kept per iteration or per worker restart changes these.
    for key in ["daemon_fds", "worker_fds"] {
        let seen: std::collections::BTreeSet<u64> = after.iter().filter_map(|r| r.int(key)).collect();
        assert_eq!(seen.len(), 1, "{key} changed after the warm-up: {seen:?}\n{text}");
    }
    // The ledger's own: two per pooled SQLite connection (at most 4) and one shm.
    let ledger_fds = rows.iter().filter_map(|r| r.int("daemon_ledger_fds")).max().unwrap();
    assert!(ledger_fds <= 9, "{ledger_fds} descriptors on the ledger:\n{text}");
    // Checkpoints keep the WAL bounded (SQLite's default: about 1,000 pages).
    let wal = rows.iter().map(|r| r.get("ledger_wal_bytes")).max().unwrap();
    assert!(wal < 8 << 20, "the WAL reached {wal} bytes:\n{text}");
}
