"""The --time-best point sets of scripts/check_templates_gpu.py, resolved on the CPU.

A point set names knob values by hand; a value outside the template's space (or a knob the
template lost) is found only when `--time-best --points NAME` runs, on the GPU machine, after
its cubins were built and carried there. These tests resolve every set against the templates
here, as that run does first.
"""
from __future__ import annotations

import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import check_templates_gpu as ctg  # noqa: E402


class PointSetsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.templates = ctg.load_templates(ctg.TEMPLATES_DIR)

    def test_every_point_set_resolves_to_points_of_its_templates_knob_space(self):
        for name, points in ctg.POINT_SETS.items():
            with self.subTest(points=name):
                rows = ctg.best_points(self.templates, name)
                self.assertEqual(len(rows), sum(len(shapes) for _, _, shapes in points))
                for tpl, knobs, _ in rows:
                    space = tpl.spec["knobs"]
                    self.assertEqual(set(knobs), set(space), f"{name}: {tpl.rel} knobs")
                    for knob, value in knobs.items():
                        self.assertIn(value, space[knob], f"{name}: {tpl.rel} {knob}")

    def test_a_value_outside_the_space_is_refused(self):
        wgmma = next(t for t in self.templates if t.rel == "wgmma_tma.cu")
        bad = {"bad": [("wgmma_tma.cu", dict(CONSUMERS=5), [ctg.mha(1, 1, 128, 64, False)])]}
        saved = dict(ctg.POINT_SETS)
        try:
            ctg.POINT_SETS.update(bad)
            with self.assertRaises(SystemExit) as e:
                ctg.best_points([wgmma], "bad")
            self.assertIn("not a point of its knob space", str(e.exception))
        finally:
            ctg.POINT_SETS.clear()
            ctg.POINT_SETS.update(saved)

    def test_the_chunked_set_is_issue_17s_chunked_prefill_shape(self):
        rows = ctg.best_points(self.templates, "chunked")
        shapes = {ctg.shape_key(shape) for _, _, shape in rows}
        self.assertEqual(len(shapes), 1)
        (shape,) = {shape for _, _, shape in rows}
        self.assertEqual((shape.sq, shape.sk, shape.hq, shape.hkv, shape.causal), (512, 4096, 32, 8, True))


if __name__ == "__main__":
    unittest.main()
