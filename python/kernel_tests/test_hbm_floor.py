"""scripts/decode_hbm_floor.py's streaming kernel: the source the GPU machine compiles with CuPy
compiles here with the pinned NVRTC at every ring depth the script times, and its SASS does what
the script's numbers are said to measure: TMA bulk copies completing on mbarriers (UBLKCP,
SYNCS), the claim counter's atomic, and no loads through the register file (the bytes reach
shared memory only). Needs .deps/ (NVRTC, nvdisasm); no GPU.
"""
from __future__ import annotations

import re
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import decode_hbm_floor as floor  # noqa: E402
import nvrtc_compile_check as ncc  # noqa: E402
import sass_loop_stats as sls  # noqa: E402

from test_sass_overlap import nvrtc_or_fail  # noqa: E402


class StreamReadTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.nvrtc = nvrtc_or_fail()

    def test_every_ring_depth_compiles_to_bulk_copies_and_one_claim_atomic(self):
        for stages in (3, 4, 6):
            with self.subTest(stages=stages):
                ok, log, cubin = self.nvrtc.compile(floor.SRC, "decode_hbm_floor.cu", [
                    "--gpu-architecture=sm_90", "-std=c++17", f"-DSTAGES={stages}",
                    f"--include-path={ncc.default_cuda_include()}"])
                self.assertTrue(ok, log)
                sass = sls.disassemble(cubin)
                self.assertIn("stream_read", sass)
                ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
                self.assertTrue(any(o.startswith("UBLKCP") for o in ops), "the chunks are TMA bulk copies")
                self.assertTrue(any(o.startswith("SYNCS") for o in ops), "waited for on mbarriers")
                self.assertTrue(any(o.startswith(("ATOMG", "ATOM", "RED")) for o in ops), "the dynamic schedule claims")
                # The only global load is the claim's atomic: the data never passes through registers.
                self.assertFalse([o for o in ops if o.startswith("LDG")], "no global loads besides the copies")


if __name__ == "__main__":
    unittest.main()
