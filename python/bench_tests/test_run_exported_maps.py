"""examples/run_exported.py's tensor maps from the manifest's formulas, on the CPU: for every shape a
real export recorded (session 28's Gemma / Phi-3 run, D 96 and D 256 Hopper kernels), the maps the
loader derives from the kernel's formulas over the contiguous view must be the very maps the daemon
resolved into the manifest. The loader takes the formula path for every view and length but the
exported one; in session 28 that path passed the D 96 maps' swizzle formula to the driver
unevaluated, which only the GPU run showed.
"""
from __future__ import annotations

import json
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import run_exported as RX  # noqa: E402

MANIFEST = ROOT / "docs/device-runs/2026-11-29-session28/gemma-phi3/manifest.json"
FIELDS = ("dims", "strides_bytes", "box", "swizzle_bytes", "param_index", "tensor")


class FormulaMapsTest(unittest.TestCase):
    def setUp(self):
        self.manifest = json.loads(MANIFEST.read_text())
        self.abi = RX.Abi(self.manifest["format"])
        self.device = self.manifest["device"]

    def maps(self, kernel, entry, shape, exported_view):
        _, _, vars_ = RX.launches_for(self.abi, kernel, shape, self.device)
        st = {t: RX.strides_of(shape, t, 0) for t in "qkvo"}
        names = {f"{t}_{x}": st[t][i] for t in "qkvo" for i, x in enumerate("bhs")}
        return RX.tensor_maps_for(self.abi, kernel, entry, shape, vars_, names, exported_view)

    def test_formulas_give_the_manifests_resolved_maps_at_every_exported_shape(self):
        checked = set()
        for kernel in self.manifest["kernels"]:
            if not kernel.get("tensor_maps"):
                continue
            for entry in kernel["shapes"]:
                shape = self.abi.shape(entry["shape"])
                resolved, source = self.maps(kernel, entry, shape, True)
                self.assertEqual(source, "manifest")
                derived, source = self.maps(kernel, entry, shape, False)
                self.assertEqual(source, "formulas")
                for r, d in zip(resolved, derived):
                    for f in FIELDS:
                        self.assertEqual(d[f], r[f], (entry["shape"], r["tensor"], f))
                    self.assertIsInstance(d["swizzle_bytes"], int)
                checked.add((shape["d"], resolved[0]["swizzle_bytes"]))
        # The run exported Hopper kernels at both swizzles: 64 bytes at D 96, 128 at D 256.
        self.assertEqual(checked, {(96, 64), (256, 128)})

    def test_a_formula_swizzle_is_a_number_the_driver_table_knows_at_other_lengths(self):
        for kernel in self.manifest["kernels"]:
            if not kernel.get("tensor_maps"):
                continue
            entry = kernel["shapes"][0]
            base = self.abi.shape(entry["shape"])
            for sk in (17, 100):
                shape = dict(base, sq=sk if base["sq"] == base["sk"] else min(base["sq"], sk), sk=sk)
                maps, _ = self.maps(kernel, entry, shape, False)
                for m in maps:
                    self.assertIn(m["swizzle_bytes"], (32, 64, 128), (kernel["file"], m["tensor"]))
                    self.assertEqual(m["dims"][1], shape["sq"] if m["tensor"] in "qo" else shape["sk"])


if __name__ == "__main__":
    unittest.main()
