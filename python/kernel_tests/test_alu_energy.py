"""scripts/alu_energy.py's three loops compile with the pinned NVRTC to the instructions the script
prices: MUFU.EX2 (and the FADD of its negated input), the FMA-pipe exponential (FRND, F2I, FFMA, no
MUFU), and one FFMA per step; no loads or spills. Needs .deps/ (NVRTC, nvdisasm); no GPU.
"""
from __future__ import annotations

import re
import sys
import unittest
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import alu_energy as ae  # noqa: E402
import sass_loop_stats as sls  # noqa: E402

from test_sass_overlap import nvrtc_or_fail  # noqa: E402


class AluEnergyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.nvrtc = nvrtc_or_fail()

    def ops(self, op: int) -> Counter:
        ok, log, cubin = self.nvrtc.compile(ae.source(op), "alu_energy.cu",
                                            ["--gpu-architecture=sm_90", "-std=c++17", "--use_fast_math"])
        self.assertTrue(ok, log)
        return Counter(re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sls.disassemble(cubin)))

    def test_each_loop_is_the_operation_it_prices(self):
        sfu, poly, ffma = self.ops(0), self.ops(1), self.ops(2)
        self.assertGreaterEqual(sfu["MUFU.EX2"], ae.CHAINS)
        self.assertEqual(sum(n for o, n in poly.items() if o.startswith("MUFU")), 0, "the emulated exp uses no SFU")
        self.assertGreaterEqual(sum(n for o, n in poly.items() if o.startswith("FFMA")), 3 * ae.CHAINS)
        self.assertGreaterEqual(sum(n for o, n in ffma.items() if o.startswith("FFMA")), ae.CHAINS)
        self.assertEqual(sum(n for o, n in ffma.items() if o.startswith("MUFU")), 0)
        for c in (sfu, poly, ffma):
            self.assertFalse([o for o in c if o.startswith(("LDG", "STL", "LDL"))], "no loads or spills in the loops")


if __name__ == "__main__":
    unittest.main()
