"""The decode templates' tail in SASS, on the CPU (NVRTC + nvdisasm from .deps/; no GPU).

Two schedules that a later edit could silently undo (docs/BENCHMARKS.md 2026-11-28 (17): together
1-1.5% of the small-cache and MQA calls on the H200):
- the warps' merge (common/decode_split.cuh) computes both of a thread's rows' factors (one
  division, MUFU.RCP, each) before it stores either row: as two branches, one per row, the two
  dependent chains ran one after the other;
- decode_cluster.cu's scatter (COMBINE 3) loads every chunk sum of a thread (KEY_WARPS
  LDS.128 per chunk) before the barrier after which it stages them, and sends the staged shares by
  bulk copies (UBLKCP), not one 16-byte remote store (STAS.128) per chunk (0.983 at MQA on the
  H200, docs/BENCHMARKS.md 2026-11-28 (18)).
"""
from __future__ import annotations

import re
import sys
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import nvrtc_compile_check as ncc  # noqa: E402
import sass_loop_stats as sls  # noqa: E402

from test_sass_overlap import nvrtc_or_fail  # noqa: E402

# decode-wide's start (MQA: 32 rows, 8 warps = 2 row tiles x 4 key warps, 4 chunks per thread).
WIDE = dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2, K_FIRST=1)
# decode-split with its combine launch: the merge alone.
SPLIT = dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, SPLIT_WAVES=1, MIN_SPLIT_TILES=2, FUSED_COMBINE=0, WARP_LOADS=0, M_TILES=1)


def forward_sass(root: Path, rel: str, knobs: dict) -> list[str]:
    """The D 128 forward's instructions (opcode and operands, one per line) of `rel` from `root`."""
    tpl = {t.rel: t for t in ncc.load_templates(root)}[rel]
    src = ncc.render(tpl, tpl.complete(knobs), False)
    nv = ncc.Nvrtc(ncc.default_nvrtc_lib())
    ok, log, cubin = nv.compile(src, rel, ["--gpu-architecture=sm_90", f"-I{ncc.default_cuda_include()}"])
    if not ok:
        raise AssertionError(f"{rel} does not compile: {log[:2000]}")
    sass = sls.disassemble(cubin)
    body = re.split(r"\n\s*\.text\.optd_fwd_d128:", sass)[1].split(".text.")[0]
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]+);", body)]


def merge_divisions_before_first_row_store(insns: list[str]) -> int:
    """MUFU.RCP between the key loop's last mma.sync and the merge's first fp32 row store (STS.64)."""
    last_mma = max(i for i, x in enumerate(insns) if x.startswith("HMMA"))
    tail = insns[last_mma:]
    first_store = next(i for i, x in enumerate(tail) if x.startswith("STS.64"))
    return sum(x.startswith("MUFU.RCP") for x in tail[:first_store])


def scatter_send(insns: list[str]) -> tuple[int, int, int]:
    """After the cluster wait (UCGABAR_WAIT) that precedes the scatter: (LDS.128 before the next
    barrier, STAS.128 anywhere after the wait, UBLKCP anywhere after the wait)."""
    wait = next(i for i, x in enumerate(insns) if x.startswith("UCGABAR_WAIT"))
    tail = insns[wait:]
    bar = next(i for i, x in enumerate(tail) if x.startswith("BAR.SYNC"))
    return (sum(x.startswith("LDS.128") for x in tail[:bar]), sum(x.startswith("STAS.128") for x in tail),
            sum(x.startswith("UBLKCP") for x in tail))


class DecodeTailSassTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        nvrtc_or_fail()
        root = ROOT / "kernel-templates"
        cls.wide = forward_sass(root, "decode_cluster.cu", WIDE)
        cls.split = forward_sass(root, "decode.cu", SPLIT)

    def test_the_merge_divides_for_both_rows_before_it_stores_a_row(self):
        for name, insns in (("decode-cluster", self.wide), ("decode-split", self.split)):
            with self.subTest(template=name):
                self.assertGreaterEqual(merge_divisions_before_first_row_store(insns), 2)

    def test_the_scatter_loads_every_chunk_sum_first_and_sends_by_bulk_copies(self):
        chunks = 32 * 32 // (WIDE["NUM_WARPS"] * 32)  # 32 rows x 32 chunks of 4 columns over the threads
        key_warps = WIDE["NUM_WARPS"] // WIDE["M_TILES"]
        loads, stas, bulk = scatter_send(self.wide)
        self.assertGreaterEqual(loads, chunks * key_warps)
        self.assertEqual(stas, 0, "no chunk leaves as a 16-byte remote store")
        self.assertGreaterEqual(bulk, 1)


if __name__ == "__main__":
    unittest.main()
