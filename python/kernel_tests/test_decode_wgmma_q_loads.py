"""decode-wgmma's prologue issues every global load of its Q tile before the first store of it.

In a load-then-store loop the compiler kept each 16-byte chunk's load behind the previous chunk's
store (q and the shared tile are both generic pointers, so it could not tell them apart): one
global round trip per chunk, up to 8 per thread at 64 packed rows, and the consumers' first K tile
waited 2 us (MQA) to 6.5 us (64 rows) longer than at 4 rows (scripts/decode_timeline.py, H200,
docs/BENCHMARKS.md (46)). The template now loads every chunk into registers first. Here, in the SASS
of both head dims' kernels (NVRTC 13.0 from .deps, nvdisasm; no GPU): the kernel's only global loads
are Q's chunks, D / 8 x 64 / 128 of them per consumer thread, and all of them come before its first
shared-memory store. Needs .deps/ (NVRTC, nvdisasm).
"""
from __future__ import annotations

import re
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import decode_cold as DC  # noqa: E402
import sass_loop_stats as sls  # noqa: E402

from test_sass_overlap import nvrtc_or_fail  # noqa: E402

POINTS = [dict(BLOCK_N=64, STAGES=3, CLUSTER=2, ROWS=64), dict(BLOCK_N=128, STAGES=3, CLUSTER=8, ROWS=32)]


class DecodeWgmmaQLoadsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        nvrtc_or_fail()

    def test_q_chunks_are_all_loaded_before_the_first_store(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(DC.build_cubins(tmp, [(DC.wg, kn) for kn in POINTS]), 0)
            cubins = sorted(Path(tmp).glob("*.cubin"))
            self.assertEqual(len(cubins), len(POINTS))
            for cubin in cubins:
                sass = sls.disassemble(cubin.read_bytes())
                parts = re.split(r"\n\s*\.text\.(\w+):", sass)[1:]
                kernels = dict(zip(parts[0::2], parts[1::2]))
                self.assertEqual(sorted(kernels), ["optd_fwd_d128", "optd_fwd_d64"], cubin.name)
                for name, body in kernels.items():
                    d = int(name.rsplit("_d", 1)[1])
                    with self.subTest(cubin=cubin.name, kernel=name):
                        ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", body)
                        loads = [i for i, o in enumerate(ops) if o.startswith("LDG")]
                        self.assertEqual(len(loads), d // 8 * 64 // 128, f"global loads: {[ops[i] for i in loads]}")
                        first_store = next(i for i, o in enumerate(ops) if o.startswith("STS"))
                        self.assertLess(loads[-1], first_store, "a Q chunk's load after the tile's first store")


if __name__ == "__main__":
    unittest.main()
