"""scripts/check_points.py --build-cubins: the cubins it names are the ones the GPU machine's check
looks up (check_templates_gpu.Gpu.module's file name for a check build), on the CPU."""
from __future__ import annotations

import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import check_points as cpts  # noqa: E402
import check_templates_gpu as ctg  # noqa: E402


class CheckBuildsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.templates = ctg.load_templates(ctg.TEMPLATES_DIR)

    def test_each_point_has_its_fp16_and_bf16_check_build_under_the_name_the_check_loads(self):
        jobs = cpts.check_jobs("large", self.templates)
        tpls = {t.rel: t for t in self.templates}
        expected = set()
        for rel, knobs, _ in ctg.POINT_SETS["large"]:
            tpl = tpls[rel]
            full = tpl.complete(knobs)
            arch = ctg.device_arch(tpl, 90)  # what Gpu.arch gives on an H100
            for bf16 in (False, True):
                expected.add(ctg.cubin_name(ctg.build_source(tpl, full, bf16), True, arch))
        self.assertEqual(set(jobs), expected)
        self.assertTrue(all(j.count_ctas for j in jobs.values()), "check builds count CTAs")
        self.assertEqual({j.bf16 for j in jobs.values()}, {False, True})
        self.assertTrue(all(j.arch == "sm_90a" for j in jobs.values()), {j.arch for j in jobs.values()})


if __name__ == "__main__":
    unittest.main()
