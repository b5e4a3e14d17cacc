"""The SASS of the Hopper template's hot loop, checked on the CPU (NVRTC + nvdisasm).

wgmma_tma.cu's OVERLAP issues tile t's Q K^T and tile t - 1's P V, waits for the first
(wgmma.wait_group 1), runs tile t's softmax, then waits for the P V (wait_group 0). Until
2026-11-26 ptxas hoisted that second wait above the exponentials in every OVERLAP point,
so the softmax ran after the P V instead of under it; no test on a GPU showed it (the
kernels were correct, only slower than they were meant to be). These tests read the
loops' SASS (the loop is peeled: unmasked tiles, then masked ones; a template implementing
sliding windows may peel a third, the tiles crossing a window's left edge): every exponential of
the tile sits between the two waits in each, the old straight-line code, rebuilt from a
copy of the templates, puts few there (so the check can fail), and the loop of unmasked
tiles holds no mask code. PV_WAIT 1 (the default since 2026-11-27) asks for FA4's order
instead: the wait right after the row max, O's rescale interleaved with the exponentials.

Needs .deps/ from scripts/setup.sh (NVRTC and nvdisasm); no GPU.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import nvrtc_compile_check as ncc  # noqa: E402
import sass_loop_stats as sls  # noqa: E402

# A function in nvdisasm's layout: an outer loop (.L_x_1) holding the tensor-core work, a
# spin wait nested in it (.L_x_2), two exponentials between wait_group 1 and wait_group 0
# and one after, and a tail outside every loop.
SYNTHETIC = """
//--------------------- .text.optd_fwd_d64 --------------------------
.text.optd_fwd_d64:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   UIADD3 UR4, UR4, 0x1, URZ ;
.L_x_2:
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R3 ;
        /*0030*/              @!P0 BRA `(.L_x_2) ;
        /*0040*/                   HGMMA.64x128x16.F32 R24, gdesc[UR20], R24, gsb0 ;
        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0060*/                   FMNMX R3, R24, R25, !PT ;
        /*0070*/                   MUFU.EX2 R24, R24 ;
        /*0080*/                   MUFU.EX2 R25, R25 ;
        /*0090*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*00a0*/                   MUFU.EX2 R26, R26 ;
        /*00b0*/                   ISETP.NE.AND P1, PT, R2, RZ, PT ;
        /*00c0*/               @P1 BRA `(.L_x_1) ;
        /*00d0*/                   STG.E [R4.64], R24 ;
        /*00e0*/                   EXIT ;
"""


def have_tools() -> str | None:
    """Why the compile tests cannot run here, or None."""
    lib = Path(ncc.default_nvrtc_lib())
    if not lib.is_file():
        return f"no NVRTC at {lib} (run scripts/setup.sh)"
    try:
        sls.nvdisasm_path()
    except sls.SassError as e:
        return str(e)
    return None


def nvrtc_or_fail() -> ncc.Nvrtc:
    """NVRTC for a compile test class's setUpClass; a missing tool fails it (under CI=true a
    missing tool fails, never skips; elsewhere the classes are skipped before this runs)."""
    why = have_tools()
    if why:
        raise AssertionError(why)
    return ncc.Nvrtc(ncc.default_nvrtc_lib())


def compile_wgmma_point(nvrtc: ncc.Nvrtc, knobs: dict) -> tuple[dict, bytes]:
    """wgmma_tma.cu rendered at `knobs` (the rest at their first values), fp16, compiled for its
    arch: (the whole knob set, the cubin)."""
    tpl = next(t for t in ncc.load_templates() if t.rel == "wgmma_tma.cu")
    full = sls.parse_knobs(tpl, ",".join(f"{k}={v}" for k, v in knobs.items()))
    ok, log, cubin = nvrtc.compile(ncc.render(tpl, full, False), "wgmma_tma.cu", [
        f"--gpu-architecture={ncc.specific_arch(tpl)}", "-std=c++17", f"--include-path={ncc.default_cuda_include()}"])
    if not ok:
        raise AssertionError(f"wgmma_tma.cu {knobs} does not compile:\n{log}")
    return full, cubin


class ParseTest(unittest.TestCase):
    def test_hot_loop_counts_its_own_body_and_sets_nested_loops_apart(self):
        funcs = sls.parse_sass(SYNTHETIC)
        self.assertEqual(list(funcs), ["optd_fwd_d64"])
        insns, labels = funcs["optd_fwd_d64"]
        self.assertEqual(len(insns), 15)
        loops = sls.hot_loops(insns, labels)
        self.assertEqual(len(loops), 1)
        lp = loops[0]
        self.assertEqual((lp.start, max(lp.ends)), (0x10, 0xC0))
        # 12 instructions from 0x10 to 0xc0, of which the spin wait's 2 are a nested loop.
        self.assertEqual(lp.nested, [2])
        self.assertEqual(lp.total, 10)
        self.assertEqual(lp.counts["mufu"], 3)
        self.assertEqual(lp.counts["tensor"], 3)  # HGMMA and both waits
        self.assertEqual(lp.counts["uniform"], 1)
        self.assertEqual(lp.counts["mbarrier"], 0)  # only in the nested spin loop
        self.assertEqual(lp.ex2_under_pv, 2)

    def test_guarded_branches_fall_through_and_plain_ones_do_not(self):
        insns, labels = sls.parse_sass(SYNTHETIC)["optd_fwd_d64"]
        by_addr = {i.addr: i for i in insns}
        self.assertTrue(by_addr[0x30].guarded)
        self.assertTrue(by_addr[0xC0].guarded)
        self.assertFalse(by_addr[0xE0].guarded)
        self.assertEqual(by_addr[0x30].op, "BRA")

    def test_a_loop_without_tensor_work_is_not_hot(self):
        text = SYNTHETIC.replace("HGMMA.64x128x16.F32 R24, gdesc[UR20], R24, gsb0", "FADD R24, R24, R25")
        text = text.replace("WARPGROUP.DEPBAR.LE gsb0, 0x1", "NOP").replace("WARPGROUP.DEPBAR.LE gsb0, 0x0", "NOP")
        insns, labels = sls.parse_sass(text)["optd_fwd_d64"]
        self.assertEqual(sls.hot_loops(insns, labels), [])


# (knobs, head dim): the OVERLAP points the daemon's runs and FA4 pick (D 64: 3 consumers,
# BLOCK_N 128; D 128: 2 consumers, BLOCK_N 128 or 192).
# PV_WAIT 0: the wait for the P V after the whole softmax (the order these tests were written
# for); PV_WAIT 1, FA4's order, has its own test below.
POINTS = [
    (dict(CONSUMERS=3, BLOCK_N=128, OVERLAP=1, PV_WAIT=0), 64),
    (dict(CONSUMERS=2, BLOCK_N=128, OVERLAP=1, PV_WAIT=0), 128),
    (dict(CONSUMERS=2, BLOCK_N=192, OVERLAP=1, PV_WAIT=0), 128),
    # D 96 (64-byte-swizzled panels): the same loop, O 48 registers, P V m64n96k16; 2 consumers
    # (3 with OVERLAP at BLOCK_N 128 serialize the wgmma: refused, test_wgmma_registers.py).
    (dict(CONSUMERS=2, BLOCK_N=128, OVERLAP=1, PV_WAIT=0), 96),
]

# The code before the fix: the wait for the P V straight after the softmax.
OLD_WAIT = """wgmma_wait<0>();
                    reg_fence(cs.o);
                    if (cs.rescale) m16n8_scale_rows<1, D / 8>(cs.o_at(), corr);"""


# Outside CI a machine without .deps/ skips these; under CI=true they fail instead.
@unittest.skipIf(have_tools() is not None and os.environ.get("CI") != "true", have_tools() or "")
class OverlapSassTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.nvrtc = nvrtc_or_fail()

    def overlap_loops(self, root: Path, knobs: dict, d: int) -> list[dict]:
        """The OVERLAP key-tile loops (those waiting for wait_group 1), fewest instructions first:
        the peeled loop of unmasked tiles, the one of masked tiles (the causal edge) and, where a
        template that implements sliding windows peels one more, the one of tiles crossing a
        window's left edge (both edges masked): 2 or 3."""
        out = sls.analyse(root, "wgmma_tma.cu", ",".join(f"{k}={v}" for k, v in knobs.items()), d, False, self.nvrtc)
        kernel = out["kernels"][f"optd_fwd_d{d}"]
        loops = [lp for lp in kernel["hot_loops"] if lp["ex2_under_pv"] is not None]
        self.assertIn(len(loops), (2, 3), f"{knobs} d{d}: expected 2 or 3 loops waiting for wait_group 1, got "
                                          f"{kernel['hot_loops']}")
        return sorted(loops, key=lambda lp: lp["total"])

    def test_the_softmax_runs_under_the_previous_tiles_pv(self):
        for knobs, d in POINTS:
            with self.subTest(knobs=knobs, d=d):
                per_thread = knobs["BLOCK_N"] // 2  # S values per thread: one exponential each
                for lp in self.overlap_loops(ncc.TEMPLATES_DIR, knobs, d):
                    self.assertGreaterEqual(lp["ex2_under_pv"], per_thread, lp)

    def test_the_newer_knobs_keep_the_softmax_under_the_pv(self):
        # STREAM_K (key-range pieces), PACK_GQA (at D 128 a Q / O box per panel) and DYNAMIC 0
        # (the static rounds; 1, the counter, is the default the other tests compile) change
        # the code around the key-tile loops, not the overlap in them.
        for knobs, d in [
            (dict(CONSUMERS=3, BLOCK_N=128, OVERLAP=1, PERSISTENT=1, DYNAMIC=0, PV_WAIT=0), 64),
            (dict(CONSUMERS=3, BLOCK_N=128, OVERLAP=1, PERSISTENT=1, STREAM_K=1, PV_WAIT=0), 64),
            (dict(CONSUMERS=2, BLOCK_N=128, OVERLAP=1, PACK_GQA=1, PV_WAIT=0), 128),
        ]:
            with self.subTest(knobs=knobs, d=d):
                for lp in self.overlap_loops(ncc.TEMPLATES_DIR, knobs, d):
                    self.assertGreaterEqual(lp["ex2_under_pv"], knobs["BLOCK_N"] // 2, lp)

    def test_pv_wait_1_is_fa4s_order(self):
        # FA4's loop (its cubin, 2026-11-27): the P V waited for after the row max and 6 of 64
        # exponentials, O's 64 rescale multiplies among the rest. PV_WAIT 1 asks for that order:
        # most exponentials after the wait (ptxas puts 7-18 of 66 before it, depending on the
        # code around: PV_WAIT 0 puts all 66 there), every multiply of O's rescale (D / 2 per
        # thread) after it and before the last exponential, in the loops of unmasked and
        # masked tiles.
        for knobs, d in POINTS:
            knobs = dict(knobs, PV_WAIT=1)
            with self.subTest(knobs=knobs, d=d):
                per_thread = knobs["BLOCK_N"] // 2
                for lp in self.overlap_loops(ncc.TEMPLATES_DIR, knobs, d):
                    self.assertLess(lp["ex2_under_pv"], per_thread // 2, lp)
                    self.assertGreaterEqual(lp["fmul_among_ex2"], d // 2, lp)
        # PV_WAIT 0 keeps them apart: the rescale (a branch of its own) after every exponential.
        for knobs, d in POINTS[:1]:
            for lp in self.overlap_loops(ncc.TEMPLATES_DIR, knobs, d):
                self.assertEqual(lp["fmul_among_ex2"], 0, lp)

    def test_d96_multiplies_in_three_panels(self):
        # At D 96 every Q K^T is 6 k-steps of m64n128k16 (2 per 32-column panel) and every P V
        # is BLOCK_N / 16 = 8 k-steps of m64n96k16 (V's 3 panels in one N of 96); no other
        # HGMMA shape. Counted over the whole kernel (each issue site is a full sequence).
        _, cubin = compile_wgmma_point(self.nvrtc, POINTS[3][0])
        insns, _ = sls.parse_sass(sls.disassemble(cubin))["optd_fwd_d96"]
        shapes = {}
        for i in insns:
            if i.op.startswith("HGMMA."):
                shape = i.op.split(".")[1]
                shapes[shape] = shapes.get(shape, 0) + 1
        self.assertEqual(set(shapes), {"64x128x16", "64x96x16"}, shapes)
        self.assertEqual(shapes["64x128x16"] % 6, 0, shapes)
        self.assertEqual(shapes["64x96x16"] % 8, 0, shapes)

    def test_mbarrier_waits_sleep_between_polls(self):
        # common/hopper.cuh's mbar_wait passes try_wait a suspend-time hint: ptxas then puts
        # NANOSLEEP.SYNCS (woken by the barrier's update) in each wait's retry path, as in FA4's
        # SASS, where a bare try_wait loop re-polls (ncu 2026-11-27: 3x FA4's try-wait executions).
        _, cubin = compile_wgmma_point(self.nvrtc, POINTS[1][0])
        text = sls.disassemble(cubin)
        tries = text.count("SYNCS.PHASECHK.TRANS64.TRYWAIT")
        sleeps = text.count("NANOSLEEP.SYNCS")
        self.assertGreater(tries, 0)
        self.assertGreater(sleeps, 0, "no NANOSLEEP.SYNCS: mbar_wait lost its suspend-time hint")

    def test_the_steady_loop_carries_no_mask_code(self):
        # The per-key compares and selects of the mask (two per S value) are in the
        # loops of masked tiles only (the causal edge's, and a window's left edge's).
        for knobs, d in POINTS:
            with self.subTest(knobs=knobs, d=d):
                plain, *masked_loops = self.overlap_loops(ncc.TEMPLATES_DIR, knobs, d)
                for masked in masked_loops:
                    self.assertGreater(masked["total"] - plain["total"], knobs["BLOCK_N"], (plain, masked))
                    self.assertEqual(plain["mufu"], masked["mufu"], (plain, masked))

    def test_the_straight_line_wait_puts_few_exponentials_there(self):
        knobs, d = POINTS[0]
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "kernel-templates"
            shutil.copytree(ncc.TEMPLATES_DIR, root)
            path = root / "wgmma_tma.cu"
            text = path.read_text()
            call = "cs.wait_pv_and_rescale(corr);"
            self.assertEqual(text.count(call), 1, "the OVERLAP loop's call moved: update this test")
            path.write_text(text.replace(call, OLD_WAIT))
            loops = self.overlap_loops(root, knobs, d)
        # Without the branch ptxas lifts the wait into the softmax: at most a few of the
        # 64 exponentials before it (0 in the masked loop, 12 in the plain one at 13.0).
        per_thread = knobs["BLOCK_N"] // 2
        self.assertTrue(all(lp["ex2_under_pv"] < per_thread // 4 for lp in loops), loops)


if __name__ == "__main__":
    unittest.main()
