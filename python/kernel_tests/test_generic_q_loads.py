"""kv-split, memory and wmma issue every global load of a thread's Q chunks before the tile's first store.

Each stages its Q tile from global into shared memory in 16-byte chunks, chunk c = tid + i * threads.
In a load-store loop the compiler kept each chunk's load behind the previous chunk's shared store (q
and the tile are both generic pointers): one global round trip per chunk, up to 16 per thread (BLOCK_M
64, D 256, 4 warps), the fault decode-wgmma had (test_decode_wgmma_q_loads.py). kv-split's and memory's
(VEC_LOADS 1) runtime loops issued one chunk, as four 4-byte LDGs, before the first STS; wmma's
unrolled loop was scheduled loads-first except where its last step is guarded (D 96 at BLOCK_M 32, 8
warps: the second chunk's load came after the first store). The templates now load every chunk into
registers (__ldg, a compile-time count) first. Here, in the SASS of every head dim's forward kernel
(NVRTC 13.0 from .deps, nvdisasm; no GPU), at the defaults and one more point each (kv-split at 8
warps: D 64's 128 chunks over 256 threads, a partial step; memory with CP_ASYNC 0, its K/V loads LDGs
too; wmma at BLOCK_M 32, 8 warps: D 96's partial last step): the global loads before the key loop's
first barrier are Q's, one 16-byte LDG per chunk, cdiv(BLOCK_M * D / 8, threads) of them, and all
come before the first shared-memory store.
Needs .deps/ (NVRTC, nvdisasm).
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
import sass_loop_stats as sls  # noqa: E402

from test_sass_overlap import nvrtc_or_fail  # noqa: E402

POINTS = [
    ("kv_split.cu", {}),
    ("kv_split.cu", dict(NUM_WARPS=8)),
    ("memory.cu", {}),
    ("memory.cu", dict(CP_ASYNC=0)),  # K/V through LDG too, after the barrier
    ("wmma.cu", {}),
    ("wmma.cu", dict(BLOCK_M=32, BLOCK_N=32, NUM_WARPS=8)),
]


class GenericQLoadsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        nvrtc_or_fail()

    def test_q_chunks_are_all_loaded_before_the_first_store(self):
        points = [(DC.tpls[rel], DC.tpls[rel].complete(kn)) for rel, kn in POINTS]
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(DC.build_cubins(tmp, points), 0)
            for tpl, kn in points:
                arch = C.arch_targets(tpl, ["sm_90"])[0]
                cubin = Path(tmp) / C.cubin_name(C.build_source(tpl, kn, False), False, arch)
                sass = sls.disassemble(cubin.read_bytes())
                parts = re.split(r"\n\s*\.text\.(\w+):", sass)[1:]
                kernels = {n: body for n, body in zip(parts[0::2], parts[1::2]) if n.startswith("optd_fwd_d")}
                self.assertEqual(sorted(kernels), sorted(f"optd_fwd_d{d}" for d in tpl.spec["template"]["head_dims"]))
                threads = kn["NUM_WARPS"] * 32
                for name, body in kernels.items():
                    d = int(name.rsplit("_d", 1)[1])
                    chunks = -(-kn["BLOCK_M"] * d // 8 // threads)
                    with self.subTest(template=tpl.rel, knobs=kn, kernel=name):
                        ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", body)
                        first_store = next(i for i, o in enumerate(ops) if o.startswith("STS"))
                        first_bar = next(i for i, o in enumerate(ops) if o.startswith("BAR"))
                        # LDG, not LDGSTS (memory's cp.async K/V prologue) or LDGDEPBAR.
                        loads = [i for i, o in enumerate(ops) if re.match(r"LDG(\.|$)", o) and i < first_bar]
                        self.assertEqual([ops[i] for i in loads if i < first_store], ["LDG.E.128.CONSTANT"] * chunks,
                                         "the thread's Q chunks loaded before the tile's first store")
                        self.assertLess(loads[-1], first_store, f"a Q load after the tile's first store: "
                                        f"{[(i, ops[i]) for i in loads]}, first STS at {first_store}")


if __name__ == "__main__":
    unittest.main()
