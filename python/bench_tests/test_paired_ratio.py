"""check_templates_gpu.paired_ratio: the A/B statistic of `--time-best --time-against` (and
sustained_samples, the replay count of `--sustain-ms`).

Rounds of a long-loop timing drift with the clocks by 5-20% on the H100 (docs/HOPPER.md, the row
max in four chains). The ratio of the two medians over rounds may take them from different
rounds, at different clocks; each round's ratio compares new and old run back to back, at the
same clocks, and their median is what a 1-2% change is judged by.
"""
from __future__ import annotations

import statistics
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import check_templates_gpu as ctg  # noqa: E402


class PairedRatioTest(unittest.TestCase):
    def test_one_disturbed_round_moves_the_ratio_of_medians_but_not_the_paired_median(self):
        # new is 2% faster at every clock; the clocks step up over the rounds (1.0, 1.1, 1.2:
        # the spread the H100's long loops show); in the last round new alone is disturbed
        # (9% under its clock). The ratio of medians then takes new's median from round 3
        # and old's from round 2: it reports 0.971. The rounds' own ratios stay 0.98 in two
        # rounds of three, and their median is exact.
        clocks = [1.0, 1.1, 1.2]
        new = [98.0 * c for c in clocks]
        new[2] *= 1.09 / 1.2
        old = [100.0 * c for c in clocks]
        self.assertAlmostEqual(statistics.median(new) / statistics.median(old), 0.971, places=3)
        p = ctg.paired_ratio(new, old)
        self.assertAlmostEqual(p.median, 0.98, places=9)
        self.assertLessEqual(p.p25, p.median)
        self.assertLessEqual(p.median, p.p75)
        self.assertEqual((p.won, p.rounds), (3, 3))

    def test_quartiles_and_wins_of_a_mixed_result(self):
        new = [10.0, 10.0, 10.0, 10.0]
        old = [9.0, 10.5, 11.0, 12.5]
        p = ctg.paired_ratio(new, old)
        ratios = sorted(n / o for n, o in zip(new, old))
        self.assertAlmostEqual(p.median, statistics.median(ratios))
        self.assertAlmostEqual(p.p25, statistics.quantiles(ratios, n=4, method="inclusive")[0])
        self.assertEqual(p.won, 3)

    def test_one_round_and_mismatched_rounds(self):
        p = ctg.paired_ratio([2.0], [4.0])
        self.assertEqual((p.median, p.p25, p.p75, p.won, p.rounds), (0.5, 0.5, 0.5, 1, 1))
        with self.assertRaises(ValueError):
            ctg.paired_ratio([1.0, 2.0], [1.0])
        with self.assertRaises(ValueError):
            ctg.paired_ratio([], [])


if __name__ == "__main__":
    unittest.main()


class SustainedSamplesTest(unittest.TestCase):
    """--sustain-ms: how many back-to-back replays a sustained measurement takes."""

    def test_enough_replays_to_last_the_time_asked(self):
        # 2 ms replays for 200 ms: 100 of them; a 3 ms replay needs 67 (66 would end short).
        self.assertEqual(ctg.sustained_samples(200.0, 2000.0, 20), 100)
        self.assertEqual(ctg.sustained_samples(200.0, 3000.0, 20), 67)
        self.assertGreaterEqual(67 * 3000.0, 200_000.0)
        self.assertLess(66 * 3000.0, 200_000.0)

    def test_never_fewer_than_the_minimum_and_off_at_zero(self):
        self.assertEqual(ctg.sustained_samples(200.0, 50_000.0, 20), 20)  # 50 ms replays: the minimum rules
        self.assertEqual(ctg.sustained_samples(0.0, 2000.0, 20), 20)      # off: the burst path's count

    def test_a_zero_length_sample_does_not_divide_by_zero(self):
        self.assertGreater(ctg.sustained_samples(1.0, 0.0, 1), 1)
