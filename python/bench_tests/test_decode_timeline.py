"""scripts/decode_timeline.py's stamps, on the CPU: they are patched into the rendered source by
string, so a template edit can silently move them. Every stamp of every timed point must land, and
the stamped source must compile (NVRTC from .deps, as the GPU machine compiles it).
"""
from __future__ import annotations

import re
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import decode_timeline as tl  # noqa: E402
import nvrtc_compile_check as nvc  # noqa: E402


class DecodeTimelineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        nvc._init_worker(nvc.default_nvrtc_lib(), nvc.default_cuda_include())

    def test_importing_leaves_the_renderer_alone(self):
        # Other suites in the same process name cubins by the plain rendered source.
        self.assertIsNot(tl.C.build_source, tl.build_source)

    def test_every_stamp_lands_and_the_stamped_source_compiles(self):
        for tpl, knobs, _ in tl.POINTS:
            for combine in ((2, 3, 1, 0) if "COMBINE" in knobs else (None,)):
                kn = tpl.complete(knobs if combine is None else {**knobs, "COMBINE": combine})
                with self.subTest(template=tpl.name, knobs=nvc.combo_label(kn)):
                    src = tl.build_source(tpl, kn, False)
                    stamps = {int(x) for x in re.findall(r"tl_mark(?:_any)?\((\d+)\);", src)}
                    self.assertEqual(stamps, set(tl.events_of(tpl.name)), "one stamp per event")
                    arch = "sm_90a" if tpl.arch_specific else "sm_90"  # decode-wgmma: wgmma
                    ok, log, cubin = nvc._NVRTC.compile(
                        src, "timeline", [f"--gpu-architecture={arch}", "-std=c++17", f"--include-path={nvc._INCLUDE}"])
                    self.assertTrue(ok, log[:2000])
                    self.assertIn(b"optd_tl", cubin)

    def test_a_template_without_a_stamped_line_is_refused_by_name(self):
        tpl, knobs, _ = tl.POINTS[0]
        real = tl._build
        try:
            tl._build = lambda *a, **k: real(*a, **k).replace("cp_async_wait<0>();  // only empty groups", "cp_async_wait<0>();")
            with self.assertRaises(RuntimeError) as e:
                tl.build_source(tpl, tpl.complete(knobs), False)
            self.assertIn("the template changed", str(e.exception))
        finally:
            tl._build = real


if __name__ == "__main__":
    unittest.main()
