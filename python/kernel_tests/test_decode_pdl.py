"""scripts/decode_pdl.py's builds: its source patch still finds its anchors in the rendered decode
templates (one wait per forward, one more in decode-split's combine), the modules compile with the
pinned NVRTC, and in every kernel of their SASS the grid-dependency wait (ACQBULK) comes before the
first global memory access, so a programmatic launch cannot read its inputs or write its output
while the kernel before it still runs. Needs .deps/ (NVRTC, nvdisasm); no GPU.
"""
from __future__ import annotations

import re
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import check_templates_gpu as C  # noqa: E402
import decode_cold as DC  # noqa: E402
import decode_pdl as P  # noqa: E402
import sass_loop_stats as sls  # noqa: E402

from test_sass_overlap import nvrtc_or_fail  # noqa: E402

GLOBAL_OPS = ("LDG", "LDGSTS", "STG", "ATOMG", "RED", "UBLKCP", "UTMALDG")


class DecodePdlTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        nvrtc_or_fail()
        cls.unpatched = C.build_source
        P.install()

    @classmethod
    def tearDownClass(cls):
        C.build_source = cls.unpatched  # the other kernel tests render the templates as they are

    def test_patch_finds_its_anchors(self):
        for label, _shape, tpl, kn in P.POINTS:
            with self.subTest(point=label):
                src = C.build_source(tpl, tpl.complete(kn), False)
                want = 2 if tpl.rel == "decode.cu" else 1  # the forward's tile, and decode.cu's combine
                self.assertEqual(src.count("griddepcontrol.wait"), want)
                self.assertEqual(src.count("griddepcontrol.launch_dependents"), want)

    def test_every_kernel_waits_before_touching_global_memory(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(DC.build_cubins(tmp, [(t, k) for _, _, t, k in P.POINTS]), 0)
            cubins = sorted(Path(tmp).glob("*.cubin"))
            self.assertEqual(len(cubins), len(P.POINTS))
            templates = {t.rel: t for _, _, t, _ in P.POINTS}
            for cubin in cubins:
                sass = sls.disassemble(cubin.read_bytes())
                parts = re.split(r"\n\s*\.text\.(\w+):", sass)[1:]
                kernels = dict(zip(parts[0::2], parts[1::2]))
                # One kernel per role and head dim the templates list (decode.cu: fwd and combine).
                roles = 2 if any(k.startswith("optd_combine") for k in kernels) else 1
                dims = {len(t.head_dims) for t in templates.values()}
                self.assertEqual(len(dims), 1, f"the points' templates list different head dims: {templates}")
                self.assertEqual(len(kernels), roles * dims.pop(), f"{cubin.name}: kernels {sorted(kernels)}")
                self.assertTrue(any(k.startswith("optd_fwd") for k in kernels), f"{cubin.name}: no forward kernel")
                for name, body in kernels.items():
                    with self.subTest(cubin=cubin.name, kernel=name):
                        ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", body)
                        self.assertIn("ACQBULK", ops, "griddepcontrol.wait compiled in")
                        first_global = next((i for i, o in enumerate(ops) if o.startswith(GLOBAL_OPS)), len(ops))
                        self.assertLess(ops.index("ACQBULK"), first_global,
                                        f"global access {ops[first_global] if first_global < len(ops) else ''} "
                                        f"before the wait")


if __name__ == "__main__":
    unittest.main()
