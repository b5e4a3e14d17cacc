"""Sliding windows in the scripts, on the CPU (.dev/window-contract.md): row i of SQ, at position
p = i + SK - SQ, sees keys p - W < j <= p. The checker's fp32 reference mask, the daemon's SDPA /
FA4 baseline's masks and FA4 arguments, and run_exported's reference, each against a naive loop;
kernel ABI v3's argument lists (17, `window` right after `causal`) in the checker and in
run_exported (formats 1 and 2 keep their 13 and 16); manifest format 3 in run_exported; the
checker's windowed shapes, given only to templates whose spec says `windows = true`.
"""
from __future__ import annotations

import contextlib
import ctypes
import io
import sys
import unittest
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "examples"))

import check_templates_gpu as ctg  # noqa: E402
import nvrtc_compile_check as ncc  # noqa: E402
import run_exported as RX  # noqa: E402
import sdpa_baseline as sb  # noqa: E402

# (sq, sk, window): prefill, chunked, decode; windows of 1 key, narrower and wider than the
# chunk's offset, equal to SK and wider (those mask nothing).
CASES = [(1, 1, 1), (7, 7, 1), (7, 7, 3), (16, 16, 5), (5, 20, 3), (5, 20, 16), (5, 20, 17), (1, 30, 4),
         (4, 30, 8), (3, 9, 9), (9, 9, 9), (9, 9, 100), (1, 12, 12), (1, 12, 13), (13, 40, 1)]


def naive(sq, sk, w):
    """[SQ][SK] booleans from the contract's words, one key at a time."""
    out = []
    for i in range(sq):
        p = i + sk - sq
        out.append([(j <= p) and (w == 0 or j > p - w) and j < sk for j in range(sk)])
    return torch.tensor(out, dtype=torch.bool)


class ReferenceMaskTest(unittest.TestCase):
    def test_the_checkers_reference_mask_is_the_naive_loop(self):
        for sq, sk, w in CASES + [(5, 20, 0), (9, 9, 0)]:
            with self.subTest(sq=sq, sk=sk, w=w):
                shape = ctg.Shape(1, 2, 2, sq, sk, 64, True, window=w)
                got = ctg.visible_mask(shape, torch)
                self.assertTrue(torch.equal(got, naive(sq, sk, w)))
                # Its visible pairs (the TFLOPS count) are the mask's.
                self.assertEqual(shape.visible_pairs(), float(got.sum()))
        self.assertIsNone(ctg.visible_mask(ctg.Shape(1, 1, 1, 4, 4, 64, False), torch))

    def test_a_window_of_sk_keys_or_more_is_the_causal_mask(self):
        for sq, sk in ((9, 9), (1, 12), (5, 20)):
            for w in (sk, sk + 1, 4096):
                self.assertTrue(torch.equal(naive(sq, sk, w), naive(sq, sk, 0)))

    def test_the_baselines_mask_and_run_exporteds_reference_are_the_naive_loop(self):
        for sq, sk, w in CASES:
            with self.subTest(sq=sq, sk=sk, w=w):
                s = sb.normalize({"b": 1, "hq": 2, "hkv": 1, "sq": sq, "sk": sk, "d": 64, "causal": True, "window": w})
                self.assertTrue(torch.equal(sb.window_mask(torch, sq, sk, sb.masking_window(s)), naive(sq, sk, w)))
                shape = dict(b=1, hq=2, hkv=1, sq=sq, sk=sk, d=64, causal=True, layout="bhsd", window=w)
                self.assertTrue(torch.equal(RX.reference_mask(shape), naive(sq, sk, w)))

    def test_a_window_needs_causal_and_a_key(self):
        with self.assertRaises(ValueError):
            ctg.Shape(1, 1, 1, 4, 4, 64, False, window=2)
        for bad in ({"window": 0}, {"window": -3}, {"window": 4, "causal": False}, {"window": True}):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                sb.normalize(dict({"b": 1, "hq": 1, "sq": 4, "sk": 4, "d": 64, "causal": True}, **bad))


class BaselineTest(unittest.TestCase):
    """sdpa_baseline.py: how a window reaches SDPA and FA4."""

    def shape(self, sq, sk, w=None, causal=True):
        s = {"b": 1, "hq": 32, "hkv": 8, "sq": sq, "sk": sk, "d": 128, "causal": causal}
        if w is not None:
            s["window"] = w
        return sb.normalize(s)

    def test_a_window_that_masks_something_is_sdpas_boolean_mask_and_fa4s_window_size(self):
        for sq, sk, w in ((4096, 4096, 1024), (512, 4096, 1024), (1, 16384, 4096), (4, 4000, 1)):
            s = self.shape(sq, sk, w)
            self.assertEqual(sb.mask_kind(s), "window")
            self.assertEqual(sb.attempts(s), [("gqa", "window"), ("repeated", "window")])
            self.assertEqual(sb.fa4_mask_args(s), {"causal": True, "window_size": (w - 1, 0)})

    def test_a_window_of_sk_or_more_is_timed_as_causal(self):
        self.assertEqual(sb.mask_kind(self.shape(1000, 1000, 1000)), "is_causal")
        self.assertEqual(sb.mask_kind(self.shape(300, 1500, 4096)), "lower_right")
        self.assertEqual(sb.mask_kind(self.shape(1, 1000, 4096)), "none")
        self.assertEqual(sb.fa4_mask_args(self.shape(1, 1000, 4096)), {"causal": False})
        self.assertEqual(sb.fa4_mask_args(self.shape(1000, 1000, 4096)), {"causal": True})

    def test_shapes_without_a_window_are_timed_as_before(self):
        for sq, sk, kind in ((1000, 1000, "is_causal"), (300, 1500, "lower_right"), (1, 1500, "none")):
            s = self.shape(sq, sk)
            self.assertEqual((s["window"], sb.mask_kind(s)), (0, kind))
        self.assertEqual(sb.fa4_mask_args(self.shape(8, 8, causal=False)), {"causal": False})


class AbiTest(unittest.TestCase):
    def test_abi_v3_has_17_parameters_with_window_after_causal(self):
        self.assertEqual((ctg.ABI_PARAMS, ncc.ABI_PARAMS), (17, 17))
        for shape, w in ((ctg.swa(2, 32, 8, 1, 4000, 128, 1024), 1024), (ctg.gqa(1, 8, 2, 128, 128, 64, True), 0)):
            values = ctg.abi_values(1, 2, 3, 4, 5, 6, shape, 3, 7)
            self.assertEqual(len(values), ctg.ABI_PARAMS)
            self.assertEqual([v.value for v in values[:6]], [1, 2, 3, 4, 5, 6])
            self.assertEqual([v.value for v in values[6:12]], [shape.b, shape.hq, shape.hkv, shape.sq, shape.sk, 3])
            self.assertIsInstance(values[12], ctypes.c_float)
            self.assertEqual((type(values[13]), values[13].value), (ctypes.c_int32, 1))  # causal
            self.assertEqual((type(values[14]), values[14].value), (ctypes.c_int32, w))  # window
            self.assertIsInstance(values[15], ctg.Strides)
            self.assertEqual(values[16].value, 7)  # the CTA counter

    def test_a_copy_of_templates_before_windows_is_launched_with_abi_v2(self):
        # --time-against DIR: DIR's ABI from its optd.cuh (7608df7, the last before windows, is v2).
        import subprocess
        import tempfile
        self.assertEqual(ctg.template_abi(next(t for t in ctg.load_templates() if t.rel == "wgmma_tma.cu")), 3)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                tar = subprocess.run(["git", "-C", str(ROOT), "archive", "7608df7", "kernel-templates"],
                                     capture_output=True, check=True).stdout
            except (subprocess.CalledProcessError, FileNotFoundError) as e:
                self.skipTest(f"7608df7 not in this clone: {e}")
            subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
            old = next(t for t in ncc.load_templates(Path(tmp) / "kernel-templates") if t.rel == "wgmma_tma.cu")
            self.assertEqual(ctg.template_abi(old), 2)
        shape = ctg.gqa(1, 8, 2, 128, 128, 64, True)
        v2 = ctg.abi_values(1, 2, 3, 4, 5, 6, shape, 3, 7, abi=2)
        self.assertEqual(len(v2), 16)
        self.assertEqual((type(v2[13]), v2[13].value), (ctypes.c_int32, 1))  # causal, then the strides
        self.assertIsInstance(v2[14], ctg.Strides)
        with self.assertRaisesRegex(ValueError, "sliding window"):
            ctg.abi_values(1, 2, 3, 4, 5, 6, ctg.swa(2, 32, 8, 1, 4000, 128, 1024), 3, 7, abi=2)

    def test_tensor_maps_start_at_parameter_17(self):
        tpl = next(t for t in ctg.load_templates() if t.rel == "wgmma_tma.cu")
        _, launches, _ = ctg.plan(tpl, tpl.knob_combos()[0], ctg.mha(1, 2, 1000, 128, True), ctg.H100)
        maps = launches[0]["tensor_maps"]
        self.assertTrue(maps)
        self.assertEqual([m["param_index"] for m in maps], list(range(17, 17 + len(maps))))

    def test_run_exported_passes_each_formats_arguments(self):
        shape = dict(b=2, hq=32, hkv=8, sq=1, sk=4000, d=128, causal=True, layout="bhsd", window=1024)
        strides = RX.Strides()
        for fmt, n in ((1, 13), (2, 16), (3, 17)):
            abi = RX.Abi(fmt)
            s = shape if fmt == 3 else dict(shape, window=0)
            values = abi.args(list(range(1, 7)), s, 4, 0.125, strides if fmt >= 2 else None, 99)
            self.assertEqual((abi.params, len(values)), (n, n))
            self.assertEqual(values[-1].value, 99)
            causal_at = 11 if fmt == 1 else 13
            self.assertEqual([values[causal_at - 2].value, values[causal_at].value], [4, 1])  # n_splits, causal
            if fmt >= 2:
                self.assertIs(values[-2], strides)
            if fmt == 3:
                self.assertEqual((type(values[14]), values[14].value), (ctypes.c_int32, 1024))
        # An unwindowed call passes window 0.
        values = RX.Abi(3).args(list(range(1, 7)), dict(shape, window=0), 1, 0.1, strides, 0)
        self.assertEqual(values[14].value, 0)


def manifest3():
    """A format 3 manifest of two kernels: one whose template implements windows, one not."""
    base = {"iteration": 1, "params": {"BLOCK_N": 32}, "dtype": "fp16", "arch": "sm_90", "arch_specific": False,
            "min_cc": 80, "derived": [["splits", "1"], ["first_tile", "max(0, SK - SQ - WINDOW + 1) // 32 if WINDOW else 0"]],
            "launches": [{"kernel": "optd_fwd_d{D}", "grid": ["cdiv(SQ, 64)", "HQ", "B"], "block": ["128", "1", "1"],
                          "dyn_smem": "0", "when": None}], "tensor_maps": [], "refuse": []}
    win = {"key": "b1hq32hkv8sq1sk4000d128-causal-w1024",
           "shape": {"b": 1, "hq": 32, "hkv": 8, "sq": 1, "sk": 4000, "d": 128, "causal": True, "window": 1024,
                     "dtype": "fp16", "layout": "bhsd"}}
    plain = {"key": "b1hq32hkv8sq1sk4000d128-causal",
             "shape": {"b": 1, "hq": 32, "hkv": 8, "sq": 1, "sk": 4000, "d": 128, "causal": True, "dtype": "fp16",
                       "layout": "bhsd"}}
    return {"format": 3, "kernels": [dict(base, file="it1-decode.cu", windows=True, shapes=[win, plain]),
                                     dict(base, file="it2-wgmma.cu", windows=False, shapes=[win, plain])]}


class RunExportedFormat3Test(unittest.TestCase):
    DEVICE = {"sms": 132, "cc": 90, "smem_optin": 232448}

    def test_a_format_3_manifest_loads_with_its_windows(self):
        m = manifest3()
        abi = RX.Abi(m["format"])
        self.assertEqual(abi.params, 17)
        decode, wgmma = m["kernels"]
        win, plain = (abi.shape(e["shape"]) for e in decode["shapes"])
        self.assertEqual((win["window"], plain["window"]), (1024, 0))
        self.assertEqual(RX.key_of(win), "b1hq32hkv8sq1sk4000d128-causal-w1024")
        self.assertEqual(RX.key_of(plain), "b1hq32hkv8sq1sk4000d128-causal")
        # Formulas read WINDOW (0 without one).
        for shape, first in ((win, (4000 - 1 - 1024 + 1) // 32), (plain, 0)):
            _, launches, vars_ = RX.launches_for(abi, decode, shape, self.DEVICE)
            self.assertEqual((vars_["WINDOW"], vars_["first_tile"]), (shape["window"], first))
            self.assertEqual(launches[0]["grid"], (1, 32, 1))

    def test_a_windowed_shape_is_refused_on_a_kernel_without_windows(self):
        m = manifest3()
        abi = RX.Abi(3)
        decode, wgmma = m["kernels"]
        win, plain = (abi.shape(e["shape"]) for e in decode["shapes"])
        self.assertIsNone(abi.refusal(decode, win))
        self.assertIsNone(abi.refusal(decode, plain))
        self.assertIsNone(abi.refusal(wgmma, plain))
        why = abi.refusal(wgmma, win)
        self.assertIn("it2-wgmma.cu", why)
        self.assertIn("\"windows\": false", why)

    def test_formats_1_and_2_still_load_without_a_window(self):
        one = RX.Abi(1).shape({"b": 1, "h": 2, "s": 64, "d": 64, "causal": True, "dtype": "fp16"})
        two = RX.Abi(2).shape({"b": 1, "hq": 8, "hkv": 2, "sq": 5, "sk": 77, "d": 64, "causal": True})
        self.assertEqual((one["window"], two["window"]), (0, 0))
        self.assertNotIn("WINDOW", RX.Abi(2).formula_vars(two))
        self.assertEqual(RX.Abi(3).formula_vars(two)["WINDOW"], 0)
        with self.assertRaises(ValueError):  # a window in a format 2 manifest: its kernels take no window
            RX.Abi(2).shape({"b": 1, "hq": 8, "hkv": 2, "sq": 5, "sk": 77, "d": 64, "causal": True, "window": 4})
        with self.assertRaises(SystemExit):
            RX.Abi(4)


def without_windows(tpl):
    """`tpl` as a template whose spec does not say `windows = true` (whichever templates of the
    tree implement windows today)."""
    text = tpl.text.replace("windows = true\n", "")
    return ncc.Template(tpl.path, tpl.rel, text, ncc.parse_spec(text, tpl.rel))


class CheckerShapesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.templates = {t.rel: t for t in ctg.load_templates()}

    def test_the_existing_shape_sets_have_no_window(self):
        for name in ("CHECK_SHAPES", "EXTRA_CHECK_SHAPES", "TIME_SHAPES", "DECODE_TIME_SHAPES", "LLM_TIME_SHAPES",
                     "SDPA_SHAPES", "FAULT_CHECK_SHAPES"):
            self.assertFalse([s for s in getattr(ctg, name) if s.w], name)

    def test_the_windowed_shapes_cover_the_contracts_cases(self):
        ws = ctg.WINDOW_CHECK_SHAPES
        self.assertTrue(all(s.causal and s.w >= 1 for s in ws))
        prefill = [s for s in ws if s.sq == s.sk and s.sq > 16]
        self.assertTrue({1, 64, 100, 1000} <= {s.w for s in prefill if 1000 <= s.sq <= 2048 and s.sq % 64})
        self.assertIn((300, 1500, 256), {(s.sq, s.sk, s.w) for s in ws})  # chunked
        self.assertTrue(any(s.hq == 8 and s.hkv == 2 for s in ws))
        self.assertTrue(any(s.layout == "bshd" for s in ws) and any(s.padded for s in ws))
        decode = {(s.sq, s.sk, s.hq, s.hkv) for s in ws if s.w == 1024}
        for sq in (1, 4):
            self.assertTrue(any(d[0] == sq and d[1] in (4000, 16384) and d[2:] == (32, 8) for d in decode), sq)
            self.assertTrue(any(d[0] == sq and d[1] in (4000, 16384) and d[2:] == (32, 1) for d in decode), sq)
        self.assertTrue(any(s.w >= s.sk for s in ws))
        self.assertEqual(len({ctg.shape_key(s) for s in ws}), len(ws))

    def test_only_templates_with_windows_get_windowed_shapes(self):
        for rel, tpl in self.templates.items():
            with self.subTest(template=rel):
                self.assertEqual(bool(ctg.window_shapes(tpl)), tpl.windows)
        plain = [without_windows(t) for t in self.templates.values() if not t.testing]
        for tpl in plain:
            self.assertEqual(ctg.window_shapes(tpl), [])
            with self.assertRaisesRegex(ctg.DoesNotFit, "does not implement sliding windows"):
                ctg.plan(tpl, tpl.knob_combos()[0], ctg.WINDOW_CHECK_SHAPES[0], ctg.H100)

    def test_formulas_read_window(self):
        windowed = [t for t in self.templates.values() if t.windows]
        self.assertTrue(windowed)
        tpl = windowed[0]
        for shape, w in ((ctg.swa(2, 32, 8, 1, 4000, 128, 1024), 1024), (ctg.gqa(2, 32, 8, 1, 4000, 128, True), 0)):
            try:
                _, _, ctx = ctg.plan(tpl, tpl.knob_combos()[0], shape, ctg.H100)
            except ctg.DoesNotFit:
                continue
            self.assertEqual(ctx["WINDOW"], w)

    def test_the_spec_says_windows_as_a_boolean(self):
        tpl = self.templates["baseline.cu"]
        text = tpl.text
        self.assertIn("windows = true", text)
        self.assertFalse(ncc.parse_spec(text.replace("windows = true", "windows = false")).get("template")["windows"])
        with self.assertRaisesRegex(ValueError, "windows = 'yes'"):
            ncc.parse_spec(text.replace("windows = true", 'windows = "yes"'))

    def test_the_shape_key_puts_the_window_after_causal(self):
        self.assertEqual(ctg.shape_key(ctg.swa(1, 16, 8, 4096, 4096, 256, 1024)), "b1hq16hkv8s4096d256-causal-w1024")
        self.assertEqual(ctg.shape_key(ctg.swa(2, 4, 1, 700, 1200, 128, 256, "bshd", padded=True)),
                         "b2hq4hkv1sq700sk1200d128-causal-w256-bshd-padded")

    def test_unwindowed_inputs_keep_their_seed(self):
        # Gpu.inputs seeds by the shape as written before windows: the new field must not show.
        shape = ctg.gqa(1, 8, 2, 128, 128, 64, True)
        self.assertNotIn("window", repr((shape, "fp16")).replace(", window=0", ""))

    def test_dry_run_shows_the_windowed_shapes_of_windowed_templates_only(self):
        tpls = [self.templates["baseline.cu"], without_windows(self.templates["baseline.cu"])]
        self.assertTrue(tpls[0].windows)
        self.assertFalse(tpls[1].windows)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = ctg.dry_run(tpls[:1], windows_only=True)
        text = out.getvalue()
        self.assertEqual(rc, 0, text[-2000:])
        for s in ctg.WINDOW_CHECK_SHAPES:
            self.assertIn(ctg.shape_key(s), text)
        self.assertIn("windows: 24 windowed shapes", text)
        self.assertEqual(len(ctg.WINDOW_CHECK_SHAPES), 24)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            ctg.dry_run(tpls[1:], windows_only=True)
        self.assertIn("no windows (no windowed shapes)", out.getvalue())
        self.assertNotIn("-w", out.getvalue().split("\n", 1)[1])

    def test_the_window_point_set_resolves_to_windowed_templates(self):
        rows = ctg.best_points(list(self.templates.values()), "window")
        self.assertTrue(rows)
        for tpl, _, shape, _ in rows:
            self.assertTrue(tpl.windows and shape.w, (tpl.rel, ctg.shape_key(shape)))


if __name__ == "__main__":
    unittest.main()
