"""wgmma_tma.cu's register refusals agree with ptxas, checked on the CPU (NVRTC).

Three consumer warpgroups get 160 registers per thread (setmaxnreg). Where S (BLOCK_N / 2
floats), O (D / 2), P and, with OVERLAP, the next tile's S do not fit, ptxas serializes every
wgmma ("C7512 ... wgmma.mma_async instructions are serialized due to insufficient register
resources") and spills: such a kernel is correct and about half as fast (H100, D 128:
3317 us against 1805). The template's [[refuse]] entries say where; this test compiles the
points on both sides of each boundary at D 64, 96 and 128 and checks that ptxas serializes
exactly the refused ones. Needs .deps/ from scripts/setup.sh; no GPU.
"""
from __future__ import annotations

import itertools
import os
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import nvrtc_compile_check as ncc  # noqa: E402

HEAD_DIMS = (64, 96, 128, 256)


def have_nvrtc() -> str | None:
    lib = Path(ncc.default_nvrtc_lib())
    return None if lib.is_file() else f"no NVRTC at {lib} (run scripts/setup.sh)"


@unittest.skipIf(have_nvrtc() is not None and os.environ.get("CI") != "true", have_nvrtc() or "")
class RegisterRefusalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = have_nvrtc()
        if why:
            raise AssertionError(why)
        cls.nvrtc = ncc.Nvrtc(ncc.default_nvrtc_lib())
        cls.tpl = next(t for t in ncc.load_templates() if t.rel == "wgmma_tma.cu")

    def refused(self, knobs: dict, d: int) -> bool:
        ctx = dict(knobs, D=d)
        return any(ncc.eval_expr(r["when"], ctx) for r in self.tpl.spec.get("refuse", []))

    def serialized(self, knobs: dict, d: int) -> bool:
        opts = [f"--gpu-architecture={ncc.specific_arch(self.tpl)}", "-std=c++17",
                f"--include-path={ncc.default_cuda_include()}", "--ptxas-options=-v"]
        opts += [f"-DOPTD_BUILD_D{x}=0" for x in HEAD_DIMS if x != d]
        ok, log, _ = self.nvrtc.compile(ncc.render(self.tpl, knobs, True), "wgmma_tma.cu", opts)
        self.assertTrue(ok, f"{knobs} D {d} does not compile:\n{log[-2000:]}")
        return "C7512" in log

    def test_ptxas_serializes_exactly_the_refused_three_consumer_points(self):
        base = {k: v[0] for k, v in self.tpl.spec["knobs"].items()}
        seen = set()
        for d, (block_n, overlap) in itertools.product((64, 96, 128), [(176, 1), (128, 1), (80, 1), (176, 0), (128, 0)]):
            knobs = dict(base, CONSUMERS=3, BLOCK_N=block_n, OVERLAP=overlap)
            with self.subTest(d=d, block_n=block_n, overlap=overlap):
                refused = self.refused(knobs, d)
                self.assertEqual(self.serialized(knobs, d), refused,
                                 f"D {d} BLOCK_N {block_n} OVERLAP {overlap}: refused={refused}")
                seen.add(refused)
        self.assertEqual(seen, {True, False}, "both sides of the boundary were compiled")
        # 2 consumers (240 registers) hold every tile at these head dims.
        for d in (96, 128):
            knobs = dict(base, CONSUMERS=2, BLOCK_N=192, OVERLAP=1)
            self.assertFalse(self.refused(knobs, d))
            self.assertFalse(self.serialized(knobs, d), f"D {d}: 2 consumers, BLOCK_N 192")


if __name__ == "__main__":
    unittest.main()
