//! A short soak on the CPU: `scripts/soak.sh` drives `optimizerd start` (this build)
//! against the scripted worker for 2,000 iterations (accepts, rejections, compile errors,
//! wrong results, CTA mismatches, sticky errors, crashes and a hang: the worker is
//! restarted about 80 times) and samples the daemon every 100 recorded iterations.
//! After a 500-iteration warm-up the daemon's resident memory must not trend up by 10% and
//! its open descriptors (besides the SQLite pool's) and the worker's must not change.
//! docs/soak/ has the 10,000-iteration run of the same script.

use std::path::Path;
use std::process::Command;

const ITERATIONS: u64 = 2000;
const EVERY: u64 = 100;
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

/// The growth over the samples' span that their Theil-Sen slope implies, relative to their
/// median: (iteration, value) points, at least two at different iterations.
fn rss_trend(points: &[(f64, f64)]) -> f64 {
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
    };
    let mut slopes = Vec::new();
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            if b.0 != a.0 {
                slopes.push((b.1 - a.1) / (b.0 - a.0));
            }
        }
    }
    let span = points.iter().map(|p| p.0).fold(f64::MIN, f64::max) - points.iter().map(|p| p.0).fold(f64::MAX, f64::min);
    median(slopes) * span / median(points.iter().map(|p| p.1).collect())
}

#[test]
fn the_rss_trend_ignores_a_low_first_sample_and_sees_a_steady_leak() {
    // The 2026-12-02 CI flake's samples (MB at iterations 500 .. 2,000): first against last
    // +11.8%, the trend ~4%.
    let flake: Vec<(f64, f64)> =
        [26.8, 30.5, 30.7, 29.5, 29.7, 32.2, 30.0].iter().enumerate().map(|(i, &y)| (500.0 + 250.0 * i as f64, y)).collect();
    let g = rss_trend(&flake);
    assert!((0.0..0.06).contains(&g), "{g}");
    // 4 KB per iteration on 30 MB, alternately 2 MB above and below the line: +20%.
    let leak: Vec<(f64, f64)> = (0..16)
        .map(|i| {
            let x = 500.0 + 100.0 * i as f64;
            (x, 30.0 + 0.004 * (x - 500.0) + if i % 2 == 0 { 2.0 } else { -2.0 })
        })
        .collect();
    let g = rss_trend(&leak);
    assert!(g > 0.15, "{g}");
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
    // The trend, not two samples: the allocator moves a ~30 MB debug daemon's RSS by 2-3 MB
    // between samples, up and down (2026-12-02: 26.8 MB at iteration 500, 30.5, 30.7, 29.5,
    // 29.7, 32.2, 30.0 at 2,000, first against last +11.8%). The Theil-Sen slope (the median of
    // every pair of samples' slope) over the 16 samples after the warm-up, times their span,
    // against their median: with +-2 MB of such noise it passes a flat daemon but 3 in 1,000
    // times and fails one that keeps 4 KB per iteration (+20% over 1,500 iterations) 998 in
    // 1,000 (2 KB: half the time, as first-against-last did). Measured here: every loaded
    // candidate's module kept (docs/soak/README.md, fix 1) +126%; with that fixed, libgit2's
    // object cache (about 1 KB per iteration) +5%.
    let points: Vec<(f64, f64)> =
        after.iter().map(|r| (r.get("iteration") as f64, r.get("daemon_rss_kb") as f64)).collect();
    let growth = rss_trend(&points);
    assert!(growth < 0.10, "daemon RSS trends up {:.1}% after the warm-up ({points:?}):\n{text}", growth * 100.0);

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
