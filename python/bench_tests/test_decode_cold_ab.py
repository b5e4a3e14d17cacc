"""scripts/decode_cold.py's paired A/Bs on the CPU (--kfirst, --against): the timers stand in for the
GPU, so what is checked is the bookkeeping the device runs trust: both sides timed once per round,
the order alternating (an order effect cancels in the medians), the paired ratio b / a per round,
the knob set to 0 and 1 on the same point, and --against's two template folders kept apart when
their modules are built.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import decode_cold as DC  # noqa: E402


class _NoGpu:
    name = "cpu"
    dev = DC.C.H100  # what plan() reads: SMs, the shared-memory opt-in, the compute capability


class PairedAbTest(unittest.TestCase):
    def setUp(self):
        self.calls = []
        self.saved = (DC.gpu, DC.time_cold_us, DC.sdpa_cold_us)
        DC.gpu = _NoGpu()

        def fake_time(tpl, kn, shape):
            self.calls.append((tpl.path, dict(kn)))
            # b is 10% faster than a at every point: K_FIRST 1, or the templates of this checkout.
            return 9.0 if kn.get("K_FIRST") == 1 or (tpl.path == DC.cluster.path and "K_FIRST" not in kn) else 10.0

        DC.time_cold_us = fake_time
        DC.sdpa_cold_us = lambda shape: 12.0
        self.tmp = Path(tempfile.mkdtemp())

    def tearDown(self):
        DC.gpu, DC.time_cold_us, DC.sdpa_cold_us = self.saved
        shutil.rmtree(self.tmp)

    def test_knob_ab_alternates_and_pairs_each_round(self):
        out = self.tmp / "ab.json"
        DC.knob_ab(out, 4, "K_FIRST", DC.KFIRST_WINNERS[:1])
        values = [kn["K_FIRST"] for _, kn in self.calls]
        self.assertEqual(values, [0, 1, 1, 0, 0, 1, 1, 0], "each round both, the order alternating")
        first = {k: v for k, v in self.calls[0][1].items() if k != "K_FIRST"}
        self.assertEqual(first, DC.KFIRST_WINNERS[0][1], "the winner's other knobs unchanged")
        rec = json.loads(out.read_text())
        self.assertEqual((rec["a"], rec["b"]), ("K_FIRST 0", "K_FIRST 1"))
        row = rec["rows"][0]
        self.assertEqual((row["a"], row["b"]), ([10.0] * 4, [9.0] * 4))
        self.assertAlmostEqual(row["paired"], 0.9)
        self.assertEqual(row["sdpa_cold"], 12.0)

    def test_against_times_the_old_folder_as_a_and_builds_both(self):
        old = self.tmp / "old"
        shutil.copytree(ROOT / "kernel-templates", old / "kernel-templates")
        pts = [p for p in DC.AGAINST_POINTS if "K_FIRST" not in p[1]][:1]
        split_pts = DC.AGAINST_SPLIT_POINTS[:1]
        wg_pts = DC.AGAINST_WGMMA_POINTS[:1]
        saved = DC.AGAINST_POINTS, DC.AGAINST_SPLIT_POINTS, DC.AGAINST_WGMMA_POINTS
        DC.AGAINST_POINTS, DC.AGAINST_SPLIT_POINTS, DC.AGAINST_WGMMA_POINTS = pts, split_pts, wg_pts
        try:
            DC.tree_ab(self.tmp / "t.json", 2, old / "kernel-templates")
        finally:
            DC.AGAINST_POINTS, DC.AGAINST_SPLIT_POINTS, DC.AGAINST_WGMMA_POINTS = saved
        folders = [path.parent for path, _ in self.calls]
        old_dir, new_dir = old / "kernel-templates", DC.cluster.path.parent
        self.assertEqual(folders, [old_dir, new_dir, new_dir, old_dir] * 3, "old first in round 0, new first in round 1")
        # decode-cluster's row, then decode-split's (decode.cu shares the merge), then decode-wgmma's:
        # each its own template.
        names = [path.name for path, _ in self.calls]
        self.assertEqual(names, ["decode_cluster.cu"] * 4 + ["decode.cu"] * 4 + ["decode_wgmma.cu"] * 4)
        rows = json.loads((self.tmp / "t.json").read_text())["rows"]
        self.assertEqual(len(rows), 3)
        self.assertTrue(rows[1]["knobs"].startswith("split "), rows[1]["knobs"])
        self.assertTrue(rows[2]["knobs"].startswith("wgmma "), rows[2]["knobs"])
        self.assertAlmostEqual(rows[0]["paired"], 0.9)
        # --build-cubins keeps the two folders' modules apart (same file name, other source).
        points = DC.against_points(old / "kernel-templates")
        self.assertEqual(len(points), 2 * sum(len(x) for x in saved))
        self.assertEqual({t.path.parent for t, _ in points}, {old / "kernel-templates", DC.cluster.path.parent})
        self.assertEqual({t.path.name for t, _ in points}, {"decode_cluster.cu", "decode.cu", "decode_wgmma.cu"})

    def test_wgmma_only_times_and_builds_decode_wgmmas_rows_alone(self):
        old = self.tmp / "old"
        shutil.copytree(ROOT / "kernel-templates", old / "kernel-templates")
        saved_argv, saved_wg = sys.argv, DC.AGAINST_WGMMA_POINTS
        sys.argv = ["decode_cold.py", "out.json", "--against", str(old / "kernel-templates"), "--wgmma-only"]
        DC.AGAINST_WGMMA_POINTS = saved_wg[:1]
        try:
            DC.tree_ab(self.tmp / "w.json", 2, old / "kernel-templates")
            points = DC.against_points(old / "kernel-templates")
        finally:
            sys.argv, DC.AGAINST_WGMMA_POINTS = saved_argv, saved_wg
        self.assertEqual([path.name for path, _ in self.calls], ["decode_wgmma.cu"] * 4)
        self.assertEqual(len(json.loads((self.tmp / "w.json").read_text())["rows"]), 1)
        self.assertEqual(sorted(t.path.parent == old / "kernel-templates" for t, _ in points), [False, True])

    def test_a_row_over_shared_memory_is_skipped_and_the_others_timed(self):
        shape, kn = DC.KFIRST_WINNERS[0]
        too_big = dict(kn, BLOCK_N=64, NUM_WARPS=8, STAGES=4)  # 8 x 64 keys x 4 stages of K and V: 1 MiB
        rows = [(shape, "too big", (DC.cluster, kn), (DC.cluster, too_big)),
                (shape, "fits", (DC.cluster, dict(kn, K_FIRST=0)), (DC.cluster, dict(kn, K_FIRST=1)))]
        out = self.tmp / "skip.json"
        DC.paired_ab(out, 2, rows, ("a", "b"))
        self.assertEqual([c[1]["K_FIRST"] for c in self.calls], [0, 1, 1, 0], "only the row that fits was timed")
        rec = json.loads(out.read_text())
        self.assertEqual([r["knobs"] for r in rec["rows"]], ["fits"])

    def test_deep_ab_pairs_each_winner_with_the_deep_ring_at_its_own_cluster_size(self):
        for shape, kn in DC.DEEP_AB:
            deep = DC.deep_of(kn)
            self.assertEqual((deep["BLOCK_N"], deep["NUM_WARPS"], deep["STAGES"], deep["COMBINE"]), (32, 4, 3, 3))
            self.assertEqual({k: v for k, v in deep.items() if k not in ("BLOCK_N", "NUM_WARPS", "STAGES", "COMBINE")},
                             {k: v for k, v in kn.items() if k not in ("BLOCK_N", "NUM_WARPS", "STAGES", "COMBINE")},
                             "the cluster size and the other knobs stay the winner's")
            self.assertLess(shape.sk, 16384, "caches the decode-deep-ring stage leaves out")


if __name__ == "__main__":
    unittest.main()
