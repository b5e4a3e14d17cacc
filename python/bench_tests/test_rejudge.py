"""scripts/rejudge.py on the CPU: decisions re-made from stored samples as src/pipeline/decide.rs
makes them (paired where the samples pair, medians otherwise), read from a real SQLite ledger
with the columns the daemon writes, and the flips another min_gain makes.
"""
from __future__ import annotations

import contextlib
import io
import json
import sqlite3
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import rejudge as RJ  # noqa: E402


class DecideTest(unittest.TestCase):
    def test_paired_where_the_samples_pair(self):
        # Both kernels drift by 10%; the candidate is 1.5% faster in every pair.
        inc = [100.0 + i for i in range(10)]
        cand = [x / 1.015 for x in inc]
        speedup, noise, paired = RJ.decide(cand, inc, 0.02)
        self.assertTrue(paired)
        self.assertAlmostEqual(speedup, 1.015, places=9)
        self.assertAlmostEqual(noise, 0.0, places=9)

    def test_medians_where_they_do_not(self):
        # Unequal counts (decide.rs: not sampled in step) and too few valid pairs.
        speedup, noise, paired = RJ.decide([1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0], 0.02)
        self.assertEqual((speedup, noise, paired), (2.0, 0.0, False))
        _, _, paired = RJ.decide([1.0, float("nan"), 1.0, 1.0], [2.0, 2.0, 2.0, 2.0], 0.02)
        self.assertFalse(paired, "three valid pairs are fewer than MIN_PAIRS")
        self.assertIsNone(RJ.decide([float("nan")], [1.0], 0.02))


def ledger(path, rows):
    """A ledger with the columns rejudge.py reads, one run, `rows` of (seq, stage, shape, cand, inc)."""
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE runs (id TEXT PRIMARY KEY, started_at TEXT);"
        "CREATE TABLE iterations (run_id TEXT, seq INTEGER, stage TEXT);"
        "CREATE TABLE iteration_shapes (run_id TEXT, seq INTEGER, shape TEXT, speedup_vs_incumbent REAL,"
        " threshold REAL, timing_samples TEXT);"
        "INSERT INTO runs VALUES ('r1', '2026-11-29T05:16:13Z');"
    )
    for seq, stage, shape, cand, inc in rows:
        speedup, noise, _ = RJ.decide(cand, inc, 0.02)
        db.execute("INSERT INTO iterations VALUES ('r1', ?, ?)", (seq, stage))
        db.execute("INSERT INTO iteration_shapes VALUES ('r1', ?, ?, ?, ?, ?)",
                   (seq, shape, speedup, max(0.02, noise), json.dumps({"candidate": cand, "incumbent": inc})))
    db.commit()
    db.close()


class MainTest(unittest.TestCase):
    def test_a_lower_floor_lists_the_gains_it_would_see(self):
        inc = [100.0 + (i % 3) for i in range(20)]
        with tempfile.TemporaryDirectory() as d:
            path = str(Path(d) / "optimizer.db")
            ledger(path, [
                (5, "open/compute-d64", "b4h16s4096d64", [x / 1.015 for x in inc], inc),  # 1.5%: flips at 0.01
                (6, "open/compute-d64", "b4h16s4096d64", [x / 1.05 for x in inc], inc),   # 5%: accepted either way
                (7, "open/compute-d64", "b1h1s32d64", [x * 1.2 for x in inc], inc),       # slower: never
            ])
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(RJ.main([path, "--min-gain", "0.01", "0.016"]), 0)
            text = out.getvalue()
        self.assertIn("run r1: 3 decisions re-judged (3 paired)", text)
        self.assertIn("largest difference from the recorded speedup or threshold 0.00e+00", text)
        self.assertIn("min_gain 0.01: 2 accepted shape decisions against 1 at 0.02; 1 flip", text)
        self.assertRegex(text, r"it5 +open/compute-d64 +b4h16s4096d64 +1\.0150x +noise 0\.00% +-> accepted")
        self.assertIn("min_gain 0.016: 1 accepted shape decisions against 1 at 0.02; 0 flip", text)

    def test_a_ledger_without_samples_says_so(self):
        with tempfile.TemporaryDirectory() as d:
            path = str(Path(d) / "optimizer.db")
            ledger(path, [])
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(RJ.main([path]), 1)
        self.assertIn("no decision with stored samples", out.getvalue())


if __name__ == "__main__":
    unittest.main()
