"""scripts/decide_noise.py's statistics and sampling plan on the CPU: the two accept rules it
compares on the GPU (the daemon's before and after 2026-11-29, src/pipeline/decide.rs) and the
worker's launches-per-sample and rounds, which its trials must reproduce to measure what the
daemon sees.
"""
from __future__ import annotations

import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import decide_noise as DN  # noqa: E402


class RulesTest(unittest.TestCase):
    def test_common_drift_is_noise_unpaired_and_cancels_paired(self):
        # Both kernels 10% slower in the second half of the samples; the candidate 3% faster.
        inc = [100.0 if i < 10 else 110.0 for i in range(20)]
        cand = [x / 1.03 for x in inc]
        speedup, noise = DN.unpaired(cand, inc)
        self.assertAlmostEqual(speedup, 1.03, places=9)
        self.assertGreater(noise, 0.04)
        speedup, noise = DN.paired(cand, inc)
        self.assertAlmostEqual(speedup, 1.03, places=9)
        self.assertAlmostEqual(noise, 0.0, places=9)

    def test_band_is_the_p10_p90_spread_over_the_median(self):
        self.assertAlmostEqual(DN.band([1.0, 2.0, 3.0, 4.0, 5.0]), (4.6 - 1.4) / 3.0)


class PlanTest(unittest.TestCase):
    def test_the_worker_s_plan_for_the_benchmark_timing(self):
        # src/spec/protocol.rs launches_for / rounds_for with scripts/benchmark-agent.toml's timing.
        saved = DN.ROUNDS, DN.SAMPLES_PER_ROUND, DN.LAUNCHES_PER_SAMPLE
        try:
            DN.ROUNDS, DN.SAMPLES_PER_ROUND, DN.LAUNCHES_PER_SAMPLE = 4, 5, 5
            self.assertEqual(DN.plan(560.0), (4, 1, 20))    # (4,16,4096,64): 4 calls per 2-ms sample, one per round
            self.assertEqual(DN.plan(1600.0), (2, 1, 20))   # (2,16,8192,128)
            self.assertEqual(DN.plan(5.0), (5, 5, 4))       # 25-us samples: the configured rounds
            self.assertEqual(DN.plan(100.0), (5, 4, 5))     # 500-us samples: 4 per round, ceil(20 / 4) rounds
            self.assertEqual(DN.plan(40000.0), (1, 1, 7))   # 300 ms per kernel and shape
            self.assertEqual(DN.plan(1600.0, adapt=False), (2, 5, 4))   # the plan before 2026-11-29 (24)
            self.assertEqual(DN.plan(40000.0, adapt=False), (1, 5, 2))  # at least 2 rounds
        finally:
            DN.ROUNDS, DN.SAMPLES_PER_ROUND, DN.LAUNCHES_PER_SAMPLE = saved


if __name__ == "__main__":
    unittest.main()
