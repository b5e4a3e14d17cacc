"""scripts/wgmma_energy.py's two loops compile with the pinned NVRTC to what the script says it
compares: HGMMAs whose A operand is a shared-memory descriptor (SS) or registers (RS, B
transposed as our P V issues it), nothing spilled, no global loads in the loop. Needs .deps/
(NVRTC, nvdisasm); no GPU.
"""
from __future__ import annotations

import re
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import sass_loop_stats as sls  # noqa: E402
import wgmma_energy as we  # noqa: E402

from test_sass_overlap import nvrtc_or_fail  # noqa: E402


class WgmmaEnergyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.nvrtc = nvrtc_or_fail()

    def sass(self, rs: bool) -> list[str]:
        ok, log, cubin = self.nvrtc.compile(we.source(rs, 3), "wgmma_energy.cu",
                                            ["--gpu-architecture=sm_90a", "-std=c++17"])
        self.assertTrue(ok, log)
        return sls.disassemble(cubin).splitlines()

    def test_ss_reads_a_from_shared_memory_and_rs_from_registers(self):
        for rs in (False, True):
            with self.subTest(rs=rs):
                lines = self.sass(rs)
                hgmma = [l for l in lines if "HGMMA.64x128x16.F32.BF16" in l]
                self.assertGreaterEqual(len(hgmma), 4)
                # SS: "HGMMA... Rd, gdesc[URa], Rd"; RS: "HGMMA... Rd, Ra, gdesc[URb].tnspB, Rd".
                a_in_regs = [bool(re.search(r"HGMMA\S*\s+R\d+, R\d+, gdesc", l)) for l in hgmma]
                self.assertTrue(all(a_in_regs) if rs else not any(a_in_regs), hgmma[0])
                self.assertEqual(all("tnspB" in l for l in hgmma), rs)
                ops = " ".join(lines)
                self.assertNotIn("STL", ops, "nothing spilled")
                self.assertNotIn("LDG", ops, "no global loads")


if __name__ == "__main__":
    unittest.main()
