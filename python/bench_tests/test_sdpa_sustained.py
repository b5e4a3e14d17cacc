"""sdpa_baseline.py's sustained windows, on the CPU: every shape's short replays are timed before
any shape's sustained windows (a window leaves the GPU at its power cap, and the next shape's
short replays would run at those clocks), and each window's figures land on its shape's entries.
The timing functions are replaced by recorders; the order and the merge are the script's own.
"""
from __future__ import annotations

import sys
import unittest
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import sdpa_baseline as sb  # noqa: E402


class _Cuda:
    def synchronize(self):
        pass

    def empty_cache(self):
        pass


class _Torch:
    cuda = _Cuda()


class _Inputs:
    def __init__(self, torch, s, l2_bytes):
        self.s, self.n = s, 3


SHAPES = [{"b": 1, "h": 8, "s": 128, "d": 64, "causal": True, "dtype": "bf16"},
          {"b": 2, "hq": 32, "hkv": 8, "sq": 1, "sk": 4096, "d": 128, "causal": True, "dtype": "bf16"}]


class SustainedPassTest(unittest.TestCase):
    def run_shapes(self, sustained_ms, fa4_func=None, sustained_error=None):
        calls = []

        def entry(kind, inputs, name, sus):
            calls.append((kind, inputs.s["sk"], name, sus))
            out = {"graph_us": 10.0 + inputs.s["sk"] / 1000.0, "ran": "cudnn" if name == "default" else name}
            if sus > 0:
                if sustained_error:
                    return {"error": sustained_error}
                out.update({"sustained_us": 12.0 + inputs.s["sk"] / 1000.0, "sustained_ms": sus, "sustained_replays": 7})
            return out

        def fake_sdpa(torch, inputs, name, calls_, replays, target_us, sustained_ms=0.0):
            return entry("sdpa", inputs, name, sustained_ms)

        def fake_fa4(torch, inputs, fa4_func, calls_, replays, target_us, sustained_ms=0.0):
            return entry("fa4", inputs, sb.FA4, sustained_ms)

        with mock.patch.object(sb, "time_sdpa", fake_sdpa), mock.patch.object(sb, "time_fa4", fake_fa4), \
                mock.patch.object(sb, "Inputs", _Inputs):
            results = sb.time_shapes(_Torch(), SHAPES, 20, 10, 50 << 20, 0.0, fa4_func, sustained_ms)
        return calls, results

    def test_every_shapes_short_replays_come_before_any_sustained_window(self):
        calls, results = self.run_shapes(200.0, fa4_func=object())
        sustained_at = [i for i, c in enumerate(calls) if c[3] > 0]
        burst_at = [i for i, c in enumerate(calls) if c[3] == 0]
        self.assertEqual(len(burst_at), 2 * (len(sb.SDPA_BACKENDS) + 1), calls)
        self.assertEqual(len(sustained_at), 2 * 2, "the default backend and FA4, per shape")
        self.assertLess(max(burst_at), min(sustained_at), calls)
        # Windows for the default backend and FA4 only, shape after shape.
        self.assertEqual([(c[1], c[2]) for c in calls if c[3] > 0],
                         [(128, "default"), (128, sb.FA4), (4096, "default"), (4096, sb.FA4)])
        for r in results:
            sk = r["shape"].get("sk", r["shape"].get("s"))
            self.assertEqual(r["default"]["sustained_us"], 12.0 + sk / 1000.0)
            self.assertEqual(r["default"]["graph_us"], 10.0 + sk / 1000.0, "the burst figure stays the burst pass's")
            self.assertEqual(r[sb.FA4]["sustained_replays"], 7)
            self.assertNotIn("sustained_us", r["flash"])
            self.assertNotIn("sustained_ran", r["default"])

    def test_without_a_window_nothing_is_timed_twice(self):
        calls, results = self.run_shapes(0.0)
        self.assertEqual(len(calls), 2 * len(sb.SDPA_BACKENDS))
        self.assertTrue(all(c[3] == 0 for c in calls))
        self.assertNotIn("sustained_us", results[0]["default"])

    def test_a_window_that_fails_says_why_and_keeps_the_burst_figure(self):
        _, results = self.run_shapes(200.0, sustained_error="RuntimeError: out of memory")
        self.assertEqual(results[0]["default"]["sustained_error"], "RuntimeError: out of memory")
        self.assertEqual(results[0]["default"]["graph_us"], 10.128)
        self.assertNotIn("sustained_us", results[0]["default"])

    def test_a_window_on_another_kernel_says_which(self):
        burst = {"graph_us": 10.0, "ran": "cudnn"}
        sb.merge_sustained(burst, {"graph_us": 11.0, "ran": "flash", "sustained_us": 12.0, "sustained_ms": 200.0,
                                   "sustained_replays": 3})
        self.assertEqual((burst["sustained_us"], burst["sustained_ran"], burst["graph_us"]), (12.0, "flash", 10.0))


if __name__ == "__main__":
    unittest.main()
