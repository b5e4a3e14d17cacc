//! Record: fold what each stage learned about a candidate into the ledger's
//! iteration row and per-shape rows, and the one human line the log shows for it.

use std::time::Duration;

use crate::pipeline::decide::{ShapeDecision, Stats};
use crate::storage::ledger::{IterationRecord, ShapeRecord};
use crate::pipeline::outcome::Verdict;
use crate::spec::protocol::{Checked, Loaded, Shape, ShapePlan};

/// One row per shape with what the gate planned.
pub fn planned_shapes(plans: &[ShapePlan]) -> Vec<ShapeRecord> {
    plans
        .iter()
        .map(|p| ShapeRecord {
            shape: p.shape.key(),
            shape_json: serde_json::to_string(&p.shape).unwrap_or_default(),
            n_splits: Some(p.n_splits as i64),
            ctas: Some(p.launches.iter().map(|l| l.ctas() as i64).sum()),
            ..Default::default()
        })
        .collect()
}

/// Rows for the shapes the gate refused, with its reason, in workload order.
pub fn refused(rows: &mut Vec<ShapeRecord>, shapes: &[Shape], refused: &[(String, String)]) {
    for (key, why) in refused {
        let shape = shapes.iter().find(|s| s.key() == *key);
        rows.push(ShapeRecord {
            shape: key.clone(),
            shape_json: shape.and_then(|s| serde_json::to_string(s).ok()).unwrap_or_default(),
            gated: Some(why.clone()),
            ..Default::default()
        });
    }
}

/// Shapes the gate refused only once the compile was done (static shared memory,
/// [`crate::pipeline::gate::check_loaded`]): their planned rows become gated ones.
pub fn gated_after_compile(rows: &mut [ShapeRecord], refused: &[(String, String)]) {
    for (key, why) in refused {
        if let Some(row) = rows.iter_mut().find(|r| r.shape == *key) {
            row.gated = Some(why.clone());
            row.ctas = None;
            row.n_splits = None;
        }
    }
}

pub fn resources(rec: &mut IterationRecord, loaded: &Loaded) {
    rec.compile_ms = Some(loaded.compile_ms);
    rec.compile_wait_ms = Some(loaded.waited_ms);
    if let Some(k) = loaded.kernels.first() {
        rec.registers = Some(k.registers as i64);
        rec.local_bytes = Some(loaded.kernels.iter().map(|k| k.local_bytes as i64).max().unwrap_or(0));
        rec.static_smem = Some(k.static_smem as i64);
    }
    rec.resources_json = serde_json::to_string(&serde_json::json!({
        "kernels": loaded.kernels, "occupancy": loaded.occupancy,
    }))
    .ok();
}

pub fn waves(shapes: &mut [ShapeRecord], plans: &[ShapePlan], loaded: &Loaded, sm_count: u32) {
    for (row, plan) in shapes.iter_mut().zip(plans) {
        row.waves = crate::pipeline::compile::waves(plan, loaded, sm_count);
    }
}

pub fn checked(shapes: &mut [ShapeRecord], checked: &Checked) {
    for c in &checked.shapes {
        if let Some(row) = shapes.iter_mut().find(|r| r.shape == c.shape.key()) {
            row.check_passed = Some(c.passed);
            row.max_abs = Some(c.max_abs);
            row.rel_l2 = Some(c.rel_l2);
            row.ctas_ran = Some(c.ctas_ran.iter().map(|&x| x as i64).sum());
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn timed(
    shapes: &mut [ShapeRecord],
    key: &str,
    cand: &Stats,
    incumbent: Option<&Stats>,
    decision: Option<&ShapeDecision>,
    baseline_us: Option<f64>,
    won: bool,
    input_sets: u32,
) {
    let Some(row) = shapes.iter_mut().find(|r| r.shape == key) else { return };
    let shape: Option<crate::spec::protocol::Shape> = serde_json::from_str(&row.shape_json).ok();
    row.median_us = Some(cand.median_us);
    row.p10_us = Some(cand.p10_us);
    row.p90_us = Some(cand.p90_us);
    row.samples = Some(cand.samples as i64);
    row.incumbent_us = incumbent.map(|i| i.median_us);
    row.speedup_vs_incumbent = decision.map(|d| d.speedup);
    row.threshold = decision.map(|d| d.threshold);
    row.speedup_vs_baseline = baseline_us.map(|b| b / cand.median_us);
    row.tflops = shape.map(|s| s.flops() / (cand.median_us * 1e-6) / 1e12);
    row.won = won;
    row.input_sets = Some(input_sets as i64);
}

/// Keep the samples behind a shape's decision (the ledger's `timing_samples`), candidate's and
/// incumbent's in the order taken, so that the accept rule can be re-judged on real runs.
pub fn samples(shapes: &mut [ShapeRecord], key: &str, candidate: &[f64], incumbent: Option<&[f64]>) {
    let Some(row) = shapes.iter_mut().find(|r| r.shape == key) else { return };
    let mut v = serde_json::json!({ "candidate": candidate });
    if let Some(inc) = incumbent {
        v["incumbent"] = serde_json::json!(inc);
    }
    row.timing_samples = Some(v.to_string());
}

/// Why the verdict, in one line: which shapes it won and by how much.
pub fn decision_reason(verdict: Verdict, shapes: &[ShapeRecord]) -> String {
    match verdict {
        Verdict::Baseline => "first correct kernel: the incumbent for every shape".into(),
        _ => {
            let wins: Vec<String> = shapes
                .iter()
                .filter(|s| s.won)
                .map(|s| match s.speedup_vs_incumbent {
                    Some(x) => format!("{} {x:.2}x", s.shape),
                    // No incumbent yet (an earlier candidate covered other shapes only).
                    None => format!("{} (its first correct kernel)", s.shape),
                })
                .collect();
            let best_loss = shapes
                .iter()
                .filter(|s| !s.won)
                .filter_map(|s| s.speedup_vs_incumbent.map(|x| (x, s.threshold.unwrap_or(0.0), &s.shape)))
                .fold(None::<(f64, f64, &String)>, |m, x| if m.is_none_or(|m| x.0 > m.0) { Some(x) } else { m });
            if wins.is_empty() {
                match best_loss {
                    Some((x, t, shape)) => format!("faster on no shape beyond noise (best {shape} {x:.2}x, needed > {:.2}x)", 1.0 + t),
                    None => "faster on no shape".into(),
                }
            } else {
                format!("won {}", wins.join(", "))
            }
        }
    }
}

/// `#12 kv-split  kv-split {"BLOCK_M":32,...}  accepted  3.1 us  best 2.41x  [1m20s/5m]  won ...`
pub fn human_line(rec: &IterationRecord, best_speedup: Option<f64>, used: Duration, budget: Duration) -> String {
    let time = rec.score_us.map(|t| format!("{t:.1} us")).unwrap_or_else(|| "-".into());
    let best = best_speedup.map(|s| format!("best {s:.2}x")).unwrap_or_else(|| "best -".into());
    format!(
        "#{:<3} {:<21} {:<13} {:<46} {:>9}  {:<13} [{} / {}]  {}",
        rec.seq,
        rec.stage,
        rec.verdict,
        rec.params_json,
        time,
        best,
        fmt_dur(used),
        fmt_dur(budget),
        rec.reason
    )
}

/// Seconds as read from the ledger or a log, as [`fmt_dur`] writes them; a value no
/// duration can hold (negative, not a number, beyond `Duration::MAX`) is written `?`.
pub fn fmt_secs(s: f64) -> String {
    Duration::try_from_secs_f64(s).map_or_else(|_| "?".to_string(), fmt_dur)
}

pub fn fmt_dur(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_win_without_an_incumbent_says_so_instead_of_a_ratio() {
        let won = |shape: &str, x: Option<f64>| ShapeRecord { shape: shape.into(), won: true, speedup_vs_incumbent: x, ..Default::default() };
        let reason = decision_reason(Verdict::Accepted, &[won("b8h16s2048d64-bf16", None), won("b1h1s32d64", Some(1.25))]);
        assert_eq!(reason, "won b8h16s2048d64-bf16 (its first correct kernel), b1h1s32d64 1.25x");
        assert!(!reason.contains("NaN"));
    }
}
