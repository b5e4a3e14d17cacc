"""scripts/decode_ablation.py on the CPU: its cuts are patched into the rendered source by string,
so a template edit can move the text they cut. Every cut of every point must apply to the template
it names and the cut source must compile (NVRTC from .deps); the A/B alternates which version goes
first, so an order effect cancels in the medians.
"""
from __future__ import annotations

import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import decode_cold as DC  # noqa: E402


class _NoGpu:
    """Stands in for the GPU the script opens at import: nothing here launches a kernel."""
    name = "cpu"
    modules: dict = {}


DC.init = lambda *a, **k: _NoGpu()
_argv, _render = sys.argv, DC.C.build_source
sys.argv = ["decode_ablation.py", "unused.json"]
try:
    import decode_ablation as ab  # noqa: E402
finally:
    # The script installs its patching renderer at import; other suites in this process
    # name cubins by the plain one.
    sys.argv, DC.C.build_source = _argv, _render
import nvrtc_compile_check as nvc  # noqa: E402


class DecodeAblationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        nvc._init_worker(nvc.default_nvrtc_lib(), nvc.default_cuda_include())

    def tearDown(self):
        ab.variant["name"] = "full"

    def test_every_cut_applies_and_compiles(self):
        for name, patches in ab.PATCHES.items():
            ab.variant["name"] = name
            for tpl, knobs in ab.POINTS:
                with self.subTest(variant=name, template=tpl.name, knobs=nvc.combo_label(knobs)):
                    src = ab.build_source(tpl, tpl.complete(knobs), False)
                    mine = [p for p in patches if p[0] in (None, tpl.name)]
                    for _, old, new in mine:
                        self.assertNotIn(old, src.replace(new, ""), "the cut left its text")
                    ok, log, _ = nvc._NVRTC.compile(
                        src, "ablation", ["--gpu-architecture=sm_90", "-std=c++17", f"--include-path={nvc._INCLUDE}"])
                    self.assertTrue(ok, log[:2000])

    def test_a_moved_text_is_refused_by_name(self):
        tpl, knobs = ab.POINTS[0]
        ab.variant["name"] = "no_math"
        real = ab._build
        try:
            ab._build = lambda *a, **k: real(*a, **k).replace("&& !live) continue;", "&& !live)\n continue;")
            with self.assertRaises(RuntimeError) as e:
                ab.build_source(tpl, tpl.complete(knobs), False)
            self.assertIn("the template changed", str(e.exception))
        finally:
            ab._build = real

    def test_the_ab_alternates_which_version_goes_first(self):
        order = []
        real = ab.time_points
        try:
            ab.time_points = lambda name, points, rows: order.append(name)
            ab.paired_rounds("against", [], "full", [], 4)
        finally:
            ab.time_points = real
        self.assertEqual(order, ["against", "full", "full", "against", "against", "full", "full", "against"])


if __name__ == "__main__":
    unittest.main()
