"""scripts/power_probe.py's reading of nvidia-smi's samples, on the CPU."""
from __future__ import annotations

import datetime as dt
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import power_probe as pp  # noqa: E402


def stamp(seconds: float) -> str:
    t = dt.datetime(2026, 11, 27, 14, 0, 0) + dt.timedelta(seconds=seconds)
    return t.strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


class PowerProbeTest(unittest.TestCase):
    def test_samples_parse_and_torn_or_unavailable_lines_are_skipped(self):
        text = "\n".join([
            f"{stamp(0.0)}, 1980, 120.50, 0x0000000000000001",
            f"{stamp(0.05)}, 1755, [N/A], 0x0000000000000004",  # no power reading: skipped
            f"{stamp(0.10)}, 1755, 699.1",  # torn line: skipped
            f"{stamp(0.15)}, 1650, 700.20, 0x0000000000000004",
        ])
        got = pp.parse_samples(text)
        self.assertEqual([(s[1], s[2], s[3]) for s in got], [(1980.0, 120.5, 1), (1650.0, 700.2, 4)])
        self.assertAlmostEqual(got[1][0] - got[0][0], 0.15, places=3)

    def test_window_takes_medians_over_the_last_three_quarters_and_ors_the_reasons(self):
        base = dt.datetime(2026, 11, 27, 14, 0, 0).timestamp()
        # 0.0-0.9 s: the first quarter of a 0..1 s run is a burst at boost clocks.
        samples = [(base + 0.1 * i, 1980.0 if i < 2 else 1700.0 + i, 400.0 if i < 2 else 690.0 + i,
                    0x1 if i < 2 else (0x4 if i % 2 else 0x0)) for i in range(10)]
        mhz, w, reasons, n = pp.window(samples, base, base + 1.0)
        self.assertEqual(n, 7)  # samples at 0.3 .. 0.9 s
        self.assertEqual((mhz, w), (1706.0, 696.0))
        self.assertEqual(reasons, 0x4, "the burst's idle bit is outside the window")

    def test_a_run_without_samples_says_so(self):
        mhz, w, reasons, n = pp.window([], 0.0, 1.0)
        self.assertEqual(n, 0)
        self.assertNotEqual(mhz, mhz)  # nan

    def test_the_summary_keeps_two_points_of_one_shape_apart(self):
        # Two points of one shape, each with FA4 beside it: at 700 W, 1.2 J and 1.0 J per call.
        samples = [(t / 10, 1500.0, 700.0, 4) for t in range(0, 81)]
        runs = [("b2h16s8192d128", "ours", "P=1", 1714.3, 0.0, 1.9),
                ("b2h16s8192d128", "fa4", "P=1", 1714.3, 2.0, 3.9),
                ("b2h16s8192d128", "ours", "P=0", 1428.6, 4.0, 5.9),
                ("b2h16s8192d128", "fa4", "P=0", 1714.3, 6.0, 7.9)]
        lines = pp.report(runs, samples)
        summary = [line for line in lines if line.startswith("b2h16s8192d128") and "|" in line]
        self.assertEqual(len(summary), 2, lines)
        self.assertIn("(1.000x, energy 1.000)", summary[0])
        self.assertTrue(summary[0].endswith("[P=1]"), summary[0])
        self.assertIn("ours   1428.60 us", summary[1])
        self.assertIn("(1.200x, energy 1.200)", summary[1])
        self.assertIn("1000.02 mJ", summary[1])


if __name__ == "__main__":
    unittest.main()


class PowerSamplerTest(unittest.TestCase):
    """PowerSampler against a stand-in nvidia-smi (a shell script): it samples while the block
    runs, parses what it printed, and takes the pre-535 field name when the first query fails."""

    def stand_in(self, dirname: str, old_driver: bool) -> str:
        script = Path(dirname) / "nvidia-smi"
        # The one-shot probe fails on the new field name for an "old driver"; the sampling call
        # (-lms) prints a line every 50 ms and records the query it was given.
        script.write_text(f"""#!/bin/sh
case "$*" in *clocks_event_reasons*) [ {int(old_driver)} = 1 ] && exit 1 ;; esac
case "$*" in *-lms*) echo "$*" > {dirname}/query
  while true; do echo "$(date '+%Y/%m/%d %H:%M:%S.%N' | cut -c1-23), 1755, 698.50, 0x0000000000000004"; sleep 0.05; done ;;
esac
exit 0
""")
        script.chmod(0o755)
        return str(script)

    def test_samples_while_the_block_runs_and_falls_back_to_the_old_field_name(self):
        import tempfile
        import time
        for old in (False, True):
            with self.subTest(old_driver=old), tempfile.TemporaryDirectory() as d:
                with pp.PowerSampler(smi=self.stand_in(d, old)) as s:
                    time.sleep(0.3)
                self.assertGreaterEqual(len(s.samples), 5, s.samples)
                self.assertEqual({(x[1], x[2], x[3]) for x in s.samples}, {(1755.0, 698.5, 4)})
                query = (Path(d) / "query").read_text()
                self.assertIn("clocks_throttle_reasons" if old else "clocks_event_reasons", query)
