"""The --time-best point sets of scripts/check_templates_gpu.py, resolved on the CPU.

A point set names knob values by hand; a value outside the template's space (or a knob the
template lost) is found only when `--time-best --points NAME` runs, on the GPU machine, after
its cubins were built and carried there. These tests resolve every set against the templates
here, as that run does first.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import check_points as cpts  # noqa: E402
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
                for tpl, knobs, _, own in rows:
                    self.assertLessEqual(own.items(), knobs.items(), f"{name}: the point's own knobs")
                    space = tpl.spec["knobs"]
                    self.assertEqual(set(knobs), set(space), f"{name}: {tpl.rel} knobs")
                    for knob, value in knobs.items():
                        self.assertIn(value, ctg.knob_values(tpl, knob), f"{name}: {tpl.rel} {knob}")

    def test_a_point_set_may_give_an_experimental_value_and_nothing_else_outside_the_spec(self):
        # The mechanism CLUSTER_SPLIT 1 went through (session 30 built it, 31 checked it): a value
        # the template builds but the spec does not list resolves in a point set only while
        # EXPERIMENTAL_VALUES names it.
        wt = next(t for t in self.templates if t.rel == "wgmma_tma.cu")
        spec_values = list(wt.spec["knobs"]["BLOCK_N"])
        new = max(spec_values) + 16
        name = "_experiment_test"
        ctg.POINT_SETS[name] = [("wgmma_tma.cu", dict(BLOCK_N=new), [ctg.Shape(1, 8, 8, 1024, 1024, 64, False)])]
        saved = dict(ctg.EXPERIMENTAL_VALUES)
        try:
            self.assertEqual(ctg.knob_values(wt, "BLOCK_N"), spec_values)
            with self.assertRaises(SystemExit):
                ctg.best_points(self.templates, name)
            ctg.EXPERIMENTAL_VALUES["wgmma_tma.cu"] = {"BLOCK_N": [new]}
            self.assertEqual(ctg.knob_values(wt, "BLOCK_N"), spec_values + [new])
            rows = ctg.best_points(self.templates, name)
            self.assertEqual([knobs["BLOCK_N"] for _, knobs, _, _ in rows], [new])
        finally:
            del ctg.POINT_SETS[name]
            ctg.EXPERIMENTAL_VALUES.clear()
            ctg.EXPERIMENTAL_VALUES.update(saved)

    def test_experimental_values_are_new_values_of_spec_knobs(self):
        # A value the template builds but the search does not try yet: a knob of the spec,
        # not already in its list (else it would be no experiment).
        by_rel = {t.rel: t for t in self.templates}
        for rel, knobs in ctg.EXPERIMENTAL_VALUES.items():
            space = by_rel[rel].spec["knobs"]
            for knob, values in knobs.items():
                self.assertIn(knob, space, f"{rel}: {knob}")
                self.assertFalse(set(values) & set(space[knob]), f"{rel}: {knob} {values} already in the spec")

    def test_check_points_builds_each_points_check_cubins_under_the_name_the_gpu_check_loads(self):
        # check_points.py --build-cubins (CPU) must write what Gpu.module looks up on the GPU
        # machine for a check build (fp16 and bf16, CTA-counting, the device's arch).
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
        self.assertEqual({j.arch for j in jobs.values()}, {"sm_90a"})

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
        shapes = {ctg.shape_key(shape) for _, _, shape, _ in rows}
        self.assertEqual(len(shapes), 1)
        (shape,) = {shape for _, _, shape, _ in rows}
        self.assertEqual((shape.sq, shape.sk, shape.hq, shape.hkv, shape.causal), (512, 4096, 32, 8, True))

    def test_a_copy_with_another_first_value_times_the_other_value(self):
        # --points pv_wait --time-against a copy whose PV_WAIT list starts with 0: the points
        # leave PV_WAIT out, so the copy completes them with 0 and the templates here with 1.
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "kernel-templates"
            shutil.copytree(ctg.TEMPLATES_DIR, root)
            path = root / "wgmma_tma.cu"
            text = path.read_text()
            self.assertIn("PV_WAIT = [1, 0]", text)
            path.write_text(text.replace("PV_WAIT = [1, 0]", "PV_WAIT = [0, 1]"))
            copy = {t.rel: t for t in ctg.load_templates(root)}["wgmma_tma.cu"]
            rows = ctg.best_points(self.templates, "pv_wait")
            self.assertTrue(rows)
            for tpl, knobs, _, own in rows:
                self.assertNotIn("PV_WAIT", own)
                self.assertEqual(knobs["PV_WAIT"], 1)
                self.assertEqual(copy.complete(own)["PV_WAIT"], 0)
                self.assertEqual({k: v for k, v in copy.complete(own).items() if k != "PV_WAIT"},
                                 {k: v for k, v in knobs.items() if k != "PV_WAIT"})

    def test_building_a_point_sets_cubins_says_what_the_check_builds_add(self):
        # --build-cubins with --time-best builds what such a GPU run loads: without --no-check the
        # check builds of every combination too (thousands of modules); the note says so first.
        import contextlib
        import io

        decode = [t for t in self.templates if t.rel == "decode_cluster.cu"]
        built = []
        saved = ctg.compile_cubins
        ctg.compile_cubins = lambda todo, out_dir, jobs: built.append(len(todo)) or 0
        tmp = Path(tempfile.mkdtemp())
        try:
            for check in (True, False):
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    # --pairs: the covering set of knob pairs, not every combination (test time)
                    ctg.build_cubins(decode, tmp, "sm_90", 1, pairs=["decode_cluster.cu"], check=check, time_best=True,
                                     points="long_decode")
                text = out.getvalue()
                if check:
                    self.assertIn("check and fault builds of every combination of 1 template(s)", text)
                    self.assertIn("--no-check builds only the --points set's 3 timed modules", text)
                else:
                    self.assertNotIn("note:", text)
        finally:
            ctg.compile_cubins = saved
            shutil.rmtree(tmp)
        self.assertGreater(built[0], 20, "the covering set's check builds, fp16 and bf16, counting and not")
        self.assertEqual(built[1], 3, "--no-check: the set's three timed modules alone")


if __name__ == "__main__":
    unittest.main()
