"""scripts/compare_exported.py's bookkeeping on the CPU: the order in which the kernels take their
back-to-back turns and windows, a rotating call's order over its input sets, and how many sets a
shape gets. The figures it prints on the device are only as fair as these: in (18) the turns
alternated 0 1 2, 2 1 0, so the first and last kernels ran two pieces in a row at every reversal and
the middle one never did (docs/BENCHMARKS.md 2026-11-28 (19)).
"""
from __future__ import annotations

import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import compare_exported as CE  # noqa: E402


class TurnOrderTest(unittest.TestCase):
    def test_every_turn_is_each_kernel_once_and_none_runs_twice_in_a_row(self):
        for n in (2, 3, 4, 5):
            turns = [CE.cyclic(n, r) for r in range(CE.CHUNKS)]
            for t in turns:
                self.assertEqual(sorted(t), list(range(n)))
            sequence = [i for t in turns for i in t]
            self.assertTrue(all(a != b for a, b in zip(sequence, sequence[1:])), (n, sequence))

    def test_with_three_or_more_each_kernel_leads_a_turn(self):
        for n in (3, 4):
            firsts = {CE.cyclic(n, r)[0] for r in range(n)}
            self.assertEqual(firsts, set(range(n)))


class RotationTest(unittest.TestCase):
    def test_a_rotating_call_takes_the_sets_in_turn(self):
        seen = []
        go = CE.rotating([lambda j=j: seen.append(j) for j in range(3)])
        for _ in range(7):
            go()
        self.assertEqual(seen, [0, 1, 2, 0, 1, 2, 0])

    def test_one_set_is_the_call_itself(self):
        call = lambda: None  # noqa: E731
        self.assertIs(CE.rotating([call]), call)

    def test_input_sets_follow_the_daemons_rule(self):
        l2 = 50 << 20
        # Chunked prefill (1, 32/8, 512 of 4096, 128) bf16: Q and O 4 MiB each, K and V 8 MiB each.
        chunked = 2 * (4 << 20) + 2 * (8 << 20)
        self.assertEqual(CE.input_sets(chunked, l2, warm=False), 6)
        self.assertEqual(CE.input_sets(chunked, l2, warm=True), 1)
        self.assertEqual(CE.input_sets(1 << 20, l2, warm=False), 16)  # small shapes: at most 16
        self.assertEqual(CE.input_sets(1 << 30, l2, warm=False), 1)  # B 64 decode: larger than L2


if __name__ == "__main__":
    unittest.main()
