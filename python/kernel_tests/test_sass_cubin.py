"""scripts/sass_loop_stats.py --cubin: a kernel compiled elsewhere (FlashAttention-4's, kept by the
CuTe DSL on the GPU machine) read the same way as our rendered points, so the two hot loops can
be compared instruction class by instruction class.

Checked here with one of our own points written to a cubin file: read back through --cubin it
must give exactly the hot loops the template path gives. Needs .deps/ (NVRTC, nvdisasm); no GPU.
"""
from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import nvrtc_compile_check as ncc  # noqa: E402
import sass_loop_stats as sls  # noqa: E402

from test_sass_overlap import compile_wgmma_point, nvrtc_or_fail  # noqa: E402

KNOBS = dict(BLOCK_N=128, STAGES=2, CONSUMERS=2, PINGPONG=1, OVERLAP=1, PERSISTENT=1, LAZY_RESCALE=1)


class CubinTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.nvrtc = nvrtc_or_fail()
        cls.knobs, cubin = compile_wgmma_point(cls.nvrtc, KNOBS)
        cls.dir = tempfile.TemporaryDirectory()
        cls.cubin = Path(cls.dir.name) / "point.cubin"
        cls.cubin.write_bytes(cubin)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_a_cubin_read_back_gives_the_template_paths_hot_loops(self):
        ours = sls.analyse(ncc.TEMPLATES_DIR, "wgmma_tma.cu", ",".join(f"{k}={v}" for k, v in self.knobs.items()),
                           128, False, self.nvrtc)["kernels"]["optd_fwd_d128"]
        back = sls.analyse_cubin(self.cubin, r"_d128$")
        self.assertEqual(list(back["kernels"]), ["optd_fwd_d128"])
        got = back["kernels"]["optd_fwd_d128"]
        self.assertGreater(len(ours["hot_loops"]), 0)
        self.assertEqual(got["hot_loops"], ours["hot_loops"])
        self.assertEqual(got["instructions"], ours["instructions"])

    def test_without_a_filter_every_function_with_a_hot_loop_is_read(self):
        back = sls.analyse_cubin(self.cubin, None)
        self.assertIn("optd_fwd_d128", back["kernels"])
        self.assertTrue(all(k["hot_loops"] for k in back["kernels"].values()))

    def test_the_table_pairs_a_differently_named_kernel_by_position(self):
        ours = sls.analyse(ncc.TEMPLATES_DIR, "wgmma_tma.cu", ",".join(f"{k}={v}" for k, v in self.knobs.items()),
                           128, False, self.nvrtc)
        ours["kernels"] = {k: v for k, v in ours["kernels"].items() if k.endswith("_d128")}
        other = sls.analyse_cubin(self.cubin, r"_d128$")
        other["kernels"] = {"flash_fwd_sm90_kernel": other["kernels"]["optd_fwd_d128"]}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            sls.print_table([ours, other])
        text = out.getvalue()
        self.assertIn("optd_fwd_d128 | flash_fwd_sm90_kernel", text)
        self.assertIn("a cubin compiled elsewhere", text)
        # Same code on both sides: every class differs by +0.
        diffs = [line.split()[-1] for line in text.splitlines() if line.strip() and line.split()[-1].startswith(("+", "-"))
                 and line.split()[-1][1:].isdigit()]
        self.assertTrue(diffs)
        self.assertEqual(set(diffs), {"+0"})

    def test_what_is_not_a_cubin_or_matches_nothing_is_named(self):
        bad = Path(self.dir.name) / "notes.txt"
        bad.write_text("not a cubin")
        with self.assertRaises(sls.SassError) as e:
            sls.analyse_cubin(bad, None)
        self.assertIn("notes.txt", str(e.exception))
        with self.assertRaises(sls.SassError) as e:
            sls.analyse_cubin(self.cubin, r"flash_fwd")
        self.assertIn("optd_fwd_d128", str(e.exception))
        with self.assertRaises(sls.SassError) as e:
            sls.analyse_cubin(Path(self.dir.name) / "missing.cubin", None)
        self.assertIn("missing.cubin", str(e.exception))


if __name__ == "__main__":
    unittest.main()
