#!/usr/bin/env python3
"""Check optimizerd's kernel templates on a real GPU, without the Rust daemon.

Needs python3 with torch and cupy (cupy-cuda13x). For every non-testing
template under kernel-templates/ and every knob combination, fp16 and bf16:

  1. render the source as the daemon does (scripts/nvrtc_compile_check.py),
     compile the check build (-DOPTD_COUNT_CTAS=1) with cupy.RawModule (NVRTC);
  2. per shape, evaluate the spec's [derived] names and [[launch]] grid / block /
     smem / when expressions, fill O (and the fp32 partial buffers) with NaN,
     except lse_partial's split semaphores (its last B*HQ*SQ words, zeroed),
     launch every planned kernel with the shared ABI, and check
       - each launch's CTA counter equals its grid size,
       - the split semaphores are zero again after the launches,
       - no NaN / inf is left in O,
       - max |O - ref| <= atol (2e-2 fp16, 6e-2 bf16) and rel. L2 <= 1e-2,
     against torch's scaled_dot_product_attention in fp32 on the same inputs;
  3. time the baseline against every kv-split combination (timed build, fp16,
     CUDA graphs of back-to-back launches, median of 50 samples) and print a
     table.

Knobs that the kernel code never names (kv-split's MAX_SPLITS only enters the
launch formulas) cannot change the compiled code, so one module is compiled per
combination of the knobs it does name and shared by the others.

Hopper templates (wgmma_tma.cu):
  - `arch_specific = true`: compiled for sm_<min_cc>a (sm_90a), never for
    --arch; on a GPU whose compute capability is not exactly min_cc they are
    skipped with the reason printed (an sm_90a cubin runs only on cc 9.0).
    In-process compiles pass --gpu-architecture=sm_90a to cupy.RawModule; CuPy
    appends its own -arch=sm_90, and NVRTC 13.0 keeps sm_90a (checked on the CPU
    machine with .deps' NVRTC 13.0.88; the templates #error without the sm_90a
    feature macro, so a different NVRTC that picked sm_90 fails loudly). The
    dependable path is --build-cubins here, --cubin-dir there.
  - `[[tensor_map]]` entries: plan() resolves each map's geometry per shape
    (tensor_map_geometry(): the daemon's convention, rank 5, dims
    {P, rows, D/P, heads, B}, byte strides {row, 2P, head, batch} from the
    shape's strides, box {P, box_rows, box_panels (default D/P), 1, 1}, P = swizzle / 2);
    Gpu.launch_args() encodes them with cuda.bindings' cuTensorMapEncodeTiled
    on the very q/k/v/o buffers of that check or timing run, and Gpu.launch()
    (the one launch function of every path: check, timing and its CUDA graph,
    --sdpa, --faults) passes them by value after the 17 ABI arguments through
    cuLaunchKernel on the current CuPy stream.

Sliding windows (.dev/window-contract.md): a Shape's `window` W (causal only) limits row i, at
position p = i + SK - SQ, to keys p - W < j <= p; the ABI's `window` argument carries it (0:
none), formulas read WINDOW, and the fp32 reference applies it (visible_mask). Templates whose
spec says `windows = true` are also checked on WINDOW_CHECK_SHAPES (prefill, chunked, GQA/MQA,
bshd, padded, decode, W >= SK); the others are never given a windowed shape (plan() refuses
one, as the daemon's gate does). --windows-only checks those shapes alone.

Kernel ABI v3 (v2 plus `int window` after `causal`): every launch goes through cuLaunchKernel
(cuda-bindings), since the `strides` struct is passed by value. Shapes (class Shape) carry HQ/HKV (grouped-query,
multi-query), SQ/SK (chunked prefill, decode; causal is bottom-right), the layout (bhsd,
bshd) and `padded` (rows VIEW_PAD elements further apart than contiguous, the gaps NaN and
checked untouched in O). Inputs are placed into flat storage through the strides; the
reference is fp32 SDPA with K/V repeated per group and the bottom-right mask. CHECK_SHAPES
cover GQA ratios 1, 4, 8 and 32, SQ < SK causal, decode, both layouts, padded views and a
ragged SK; templates whose spec sets `max_sq` skip shapes above it (as the gate does).
  A (combo, shape) whose shared memory exceeds the device's, or whose tensor
  map the TMA cannot encode, is skipped and counted, as the daemon's gate does.

  --dry-run   no GPU: render every template and print every launch plan
              (SMS=132, H100 values, cc 9.0) with each tensor map's geometry,
              cross-checking the expression evaluator against jinja2 when it is
              installed.
  --faults    also run the planted faults, each in a child process (a sticky
              error or a hung kernel would take the parent's context with it):
              the out-of-bounds writer must fail with an illegal address, the
              infinite loop must still be running --fault-timeout s after its
              launch, testing/tensor_map_probe.cu (a TMA plumbing probe, not a
              fault) must pass the full check; and every non-testing template
              with tensor maps is rendered with `#define OPTD_FAULT_MBAR_PHASE 1`
              first (its consumers wait on the wrong mbarrier parity) and checked
              on FAULT_CHECK_SHAPES: "caught" when a check fails (values, NaN,
              CTA count), the child crashes, or it hangs; "NOT caught" when it
              passes. Compile / load time does not count against the timeout.
  --pairs T   check template T on a set of knob combinations that covers every
              pair of knob values (instead of every combination).
  --more-shapes   also check EXTRA_CHECK_SHAPES (more ragged / causal / D=128
              cases; slower, off by default).
  --sdpa      time every combination of the selected non-testing templates
              against torch's scaled_dot_product_attention (default backend,
              and the flash and cuDNN backends when available) on SDPA_SHAPES,
              fp16, CUDA events, median; prints TFLOPS = 4 B H S^2 D / t
              (halved for causal) and ends with a short table.
  --build-cubins DIR  no GPU: compile every module the run would compile
              (check and timed builds, fp16 and bf16, and the --faults
              modules) with NVRTC on this machine (.deps, as
              scripts/nvrtc_compile_check.py) for --arch (default sm_90), or
              sm_<min_cc>a for arch-specific templates, into DIR (file names end
              in the target, e.g. -count-sm_90a.cubin); a GPU run given
              --cubin-dir DIR loads those instead of compiling (any module
              missing there is compiled as usual), which saves the device
              machine the compile time.
  --time-best  time BEST_POINTS, the daemon's best kernel per shape (mma-fa2
              on the small shapes, wgmma-tma on the four large ones), and SDPA
              default on the same shapes, fp16, --rounds rounds of graph-timed
              medians; --time-against DIR also times each point with the
              templates of DIR (an earlier kernel-templates/, e.g. from
              `git archive`), the two versions alternating within each round
              (DIR's kernel ABI is read from its common/optd.cuh: a copy from
              before sliding windows, ABI v2, is launched without `window`).
              With --build-cubins (and --no-check: only these) their timed
              builds are precompiled too. --points ragged times RAGGED_POINTS
              instead (ragged S: last query tiles of a few rows), --points
              medium issue 19's medium shapes at six wgmma-tma points (the
              fastest per shape summarised), --points pingpong PINGPONG and
              PERSISTENT on and off, --points overlap OVERLAP on and off at
              FA4's points and the daemon's, --points epilogue EPI_TMA on and
              off, --points gqa PACK_GQA on and off, --points streamk
              STREAM_K on and off, --points lpt LPT_MIB 32 and 8, --points
              dynamic DYNAMIC on and off, --points tiles_per_cta GQA and MHA
              D 64 causal at B 1, 2, 4, --points chunked the single-tile knobs
              on issue 17's chunked prefill, --points chunked_code the code it
              carries and never runs (TAIL_SPLIT, DYNAMIC, PERSISTENT),
              --points chunked_sweep its point and FA4 over sk 512-16384,
              --points chunked_loop LAZY_RESCALE and PINGPONG at sk 16384,
              --points loop_ab the OVERLAP loops and two large shapes (for
              --time-against), --points loop_ab2 the same on the LLM run's
              D 128 prefill shapes, --points pv_wait the OVERLAP points of
              the benchmark shapes (for --time-against a copy whose PV_WAIT
              list starts with 0), --points large issue 19's four large
              shapes at their fixed points (for --time-against, e.g. two
              compilers' cubins with --cubins-only), --points large_nc
              other points of the two non-causal ones, --points
              persist_nc those persistent and not, --points sk_causal
              STREAM_K on and off on causal grids of one partial round
              (chunked prefill), --points sk_diag its D 128 fixed cost,
              --points lazy_pv / lazy_ab LAZY_RESCALE under PV_WAIT (since
              WT_LAZY both values build the same OVERLAP kernel: the record
              of that A/B; lazy_ab's non-OVERLAP point still differs),
              --points window the windowed templates on sliding-window
              shapes (Mistral, Gemma 3 local layers; SDPA with the window's
              boolean mask, FA4 with window_size = (W - 1, 0)), --points
              generic_q kv-split, memory and wmma at their first knob values
              (for --time-against: their Q staging). Where
              flash_attn.cute imports
              (FlashAttention-4), it is timed on every shape too, the same
              way, in an `fa4 us` column.

The Hopper template on the GPU machine, e.g. (.dev is git-ignored: carry .dev/ctg there):
  here:  python3 scripts/check_templates_gpu.py --build-cubins .dev/ctg --template wgmma_tma.cu \\
             --template tensor_map_probe.cu --pairs wgmma_tma.cu
  there: python3 scripts/check_templates_gpu.py --cubin-dir .dev/ctg --template wgmma_tma.cu \\
             --template tensor_map_probe.cu --pairs wgmma_tma.cu --faults
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import hashlib
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvrtc_compile_check import (  # noqa: E402
    FUNCS, ROOT, TEMPLATES_DIR, TMA_SWIZZLES, Template, Unsupported, arch_targets, combo_label,
    device_arch, eval_expr, load_templates, render, specific_arch,
)

# Kernel ABI v3 (kernel-templates/common/optd.cuh): 6 pointers, batch, heads_q, heads_kv,
# seq_q, seq_k, n_splits, softmax_scale, causal, window (0 = none), the strides struct, the
# CTA counter (.dev/window-contract.md).
ABI_PARAMS = 17
# Extra elements per row of a padded view: src/spec/protocol.rs VIEW_PAD.
VIEW_PAD = 64
DECODE_MAX_SQ = 16


@dataclass(frozen=True)
class Shape:
    """One attention problem as the daemon states it (src/spec/protocol.rs Shape): B batches,
    HQ query heads of SQ rows over HKV key/value heads of SK keys (query head h reads KV head
    h // (HQ // HKV)), causal bottom-right (row i sees keys <= i + SK - SQ), in `layout`
    ("bhsd" or "bshd"); `padded`: every tensor a view whose rows are VIEW_PAD elements further
    apart than contiguous (the daemon's check runs such views too); `window` W (causal only; 0
    or None: none): row i, at position p = i + SK - SQ, sees keys p - W < j <= p only."""
    b: int
    hq: int
    hkv: int
    sq: int
    sk: int
    d: int
    causal: bool
    layout: str = "bhsd"
    padded: bool = False
    window: int | None = 0

    def __post_init__(self):
        if self.window and not self.causal:
            raise ValueError(f"a sliding window ({self.window}) needs a causal shape")
        if self.window is not None and self.window < 0:
            raise ValueError(f"window = {self.window}: at least 1 key (0 or None: none)")

    @property
    def group(self) -> int:
        return self.hq // self.hkv

    @property
    def w(self) -> int:
        """The ABI's `window`: the window's keys, 0 for none."""
        return int(self.window or 0)

    def dims_of(self, tensor: str) -> tuple[int, int]:
        """(heads, rows) of q/o or k/v."""
        return (self.hq, self.sq) if tensor in ("q", "o") else (self.hkv, self.sk)

    def strides(self, tensor: str) -> tuple[int, int, int]:
        """Element strides (batch, head, row) of `tensor`, as ViewStrides in protocol.rs."""
        heads, rows = self.dims_of(tensor)
        pad = VIEW_PAD if self.padded else 0
        if self.layout == "bhsd":
            return heads * rows * (self.d + pad), rows * (self.d + pad), self.d + pad
        return rows * (heads * self.d + pad), self.d, heads * self.d + pad

    def extent(self, tensor: str) -> int:
        heads, rows = self.dims_of(tensor)
        sb, sh, ss = self.strides(tensor)
        return (self.b - 1) * sb + (heads - 1) * sh + (rows - 1) * ss + self.d

    def visible_pairs(self) -> float:
        if self.w:
            # Row i (position p = i + SK - SQ) sees min(p + 1, W) keys: rows before the
            # window fills (an arithmetic series), then W each.
            off = self.sk - self.sq
            full_from = min(max(self.w - off - 1, 0), self.sq)  # rows i < full_from see fewer than W
            return full_from * (off + 1) + full_from * (full_from - 1) / 2 + (self.sq - full_from) * self.w
        if self.causal:
            return self.sq * (self.sk - self.sq) + self.sq * (self.sq + 1) / 2
        return float(self.sq * self.sk)

    def kv_bytes(self) -> int:
        return 2 * self.b * self.hkv * self.sk * self.d * ELEM_BYTES


def mha(b: int, h: int, s: int, d: int, causal: bool) -> Shape:
    return Shape(b, h, h, s, s, d, causal)


def gqa(b: int, hq: int, hkv: int, sq: int, sk: int, d: int, causal: bool, layout: str = "bhsd",
        padded: bool = False, window: int = 0) -> Shape:
    return Shape(b, hq, hkv, sq, sk, d, causal, layout, padded, window)


def swa(b: int, hq: int, hkv: int, sq: int, sk: int, d: int, window: int, layout: str = "bhsd",
        padded: bool = False) -> Shape:
    """A causal shape with a sliding window of `window` keys."""
    return Shape(b, hq, hkv, sq, sk, d, True, layout, padded, window)


def visible_mask(shape: Shape, torch, device="cpu"):
    """The [SQ, SK] boolean mask of the keys each query row sees (True: seen), or None when it
    sees every key (not causal): bottom-right causal, j <= p with p = i + SK - SQ, and with a
    window W also j > p - W (.dev/window-contract.md). The fp32 reference applies it."""
    if not shape.causal:
        return None
    p = torch.arange(shape.sq, device=device)[:, None] + (shape.sk - shape.sq)
    j = torch.arange(shape.sk, device=device)[None, :]
    mask = j <= p
    if shape.w:
        mask &= j > p - shape.w
    return mask


def mhas(tuples) -> list[Shape]:
    return [mha(*x) for x in tuples]


CHECK_SHAPES = mhas([
    (1, 1, 1, 64, False), (1, 1, 17, 64, True), (1, 1, 32, 64, False),
    (1, 1, 100, 128, True), (1, 1, 128, 64, False), (2, 8, 128, 64, False),
    (1, 2, 1000, 64, True), (1, 1, 4097, 128, False), (4, 16, 1024, 64, True),
]) + [
    # Grouped-query heads: ratios 4, 8 and 32 (multi-query), ragged SK, chunked prefill
    # (SQ < SK, bottom-right causal), decode (SQ 1 and 4 against a long cache), both layouts
    # and padded (non-contiguous) views.
    gqa(1, 8, 2, 128, 128, 64, True),
    gqa(2, 8, 1, 100, 333, 128, True),
    gqa(1, 32, 4, 64, 1000, 128, True, "bshd"),
    gqa(1, 32, 1, 257, 257, 64, False, padded=True),
    gqa(2, 16, 2, 200, 700, 64, False, "bshd", padded=True),
    gqa(2, 32, 8, 1, 1024, 128, False),
    gqa(1, 32, 8, 1, 4000, 128, True, "bshd"),
    gqa(2, 8, 1, 4, 999, 128, True, padded=True),
    gqa(1, 4, 4, 16, 2048, 64, True, "bshd", padded=True),
    # 48 packed rows (G 16 x SQ 3): decode's M_TILES 2 has a CTA with a partly padded second
    # row tile and one whose second row tile is all padding.
    gqa(2, 16, 1, 3, 777, 64, True, "bshd"),
    # More work tiles than the H100's 132 SMs, not causal, the count not a multiple of 132:
    # wgmma_tma's STREAM_K runs the last round in key-range pieces (ragged tail tiles, SQ < SK,
    # a ragged last key tile, bshd on a padded view, packed GQA heads).
    mha(3, 16, 1000, 64, False),
    gqa(2, 32, 8, 700, 900, 128, False, "bshd", padded=True),
    gqa(4, 32, 8, 600, 2048, 64, False),
    # Causal with more work tiles than SMs, persistent: wgmma_tma's DYNAMIC takes them from a
    # counter in the split semaphore words (left zero), packed GQA heads and SQ < SK included.
    gqa(2, 32, 8, 1000, 1000, 64, True),
    gqa(1, 32, 8, 700, 1500, 128, True, "bshd", padded=True),
    # Head dims 96 (Phi-3-mini: 32 heads, MHA) and 256 (Gemma 2/3: GQA): prefill, chunked,
    # decode; a template without them skips these (its spec's head_dims).
    mha(1, 2, 100, 96, True),
    gqa(1, 32, 32, 300, 300, 96, False, "bshd", padded=True),
    gqa(2, 8, 8, 1, 999, 96, True),
    # D 96 on Hopper (wgmma_tma.cu's 64-byte-swizzled panels): causal with more work tiles than
    # SMs and packed GQA heads (DYNAMIC), and a non-causal STREAM_K tail with a ragged key tile.
    gqa(2, 32, 8, 1000, 1000, 96, True),
    mha(3, 16, 1000, 96, False),
    gqa(1, 8, 4, 333, 333, 256, True),
    gqa(2, 16, 8, 128, 1000, 256, True, "bshd"),
    gqa(1, 16, 8, 1, 4000, 256, True, padded=True),
    gqa(2, 8, 4, 4, 1024, 256, False),
]
# Sliding windows (.dev/window-contract.md): only templates whose spec says `windows = true` are
# given these (added to their check; the others are never given a windowed shape). Prefill with
# SQ = SK at W 1, 64, 100 and 1000 over S of 1000-2048 that are no multiple of a tile; chunked
# prefill (SQ < SK, the first row's window starting mid-cache, and one wider than the cache before
# the chunk); grouped-query and multi-query heads; bshd and padded views; decode (SQ 1 and 4) over
# 4000 and 16384 keys with W 1024 (GQA 32/8, MQA 32/1); W >= SK (masks nothing: the causal
# result), W = 1 in decode; head dims 96 and 256 (Phi-3, Gemma 2/3's local layers, W 1024 / 512).
# The last three are chunks of fewer work tiles than SMs whose windows span many key tiles
# (bshd and a ragged last query tile among them): where wgmma-tma's STREAM_K would cut tiles
# into key-range pieces were it engaged with a window (session 30 built that: correct on
# these, 2x slower on Gemma 3's local chunk; not kept, docs/HOPPER.md).
WINDOW_CHECK_SHAPES = [
    swa(1, 4, 4, 1000, 1000, 64, 1),
    swa(1, 8, 2, 1537, 1537, 128, 64),
    swa(2, 4, 4, 1111, 1111, 64, 100),
    swa(1, 4, 2, 2047, 2047, 128, 1000),
    swa(1, 8, 2, 300, 1500, 128, 256),
    swa(2, 4, 4, 100, 333, 64, 300),
    swa(1, 8, 2, 1000, 1000, 64, 100, "bshd"),
    swa(2, 4, 1, 700, 1200, 128, 256, "bshd", padded=True),
    swa(1, 4, 4, 1025, 1025, 64, 64, padded=True),
    swa(2, 32, 8, 1, 4000, 128, 1024),
    swa(1, 32, 8, 4, 16384, 128, 1024),
    swa(2, 32, 1, 1, 4000, 128, 1024),
    swa(1, 32, 1, 4, 16384, 128, 1024, "bshd", padded=True),
    swa(2, 16, 1, 3, 777, 64, 100, "bshd"),
    swa(1, 8, 8, 1, 999, 64, 1),
    swa(1, 4, 4, 500, 500, 64, 500),
    swa(1, 4, 2, 300, 300, 128, 4096),
    swa(1, 32, 8, 1, 1000, 128, 4096),
    swa(1, 32, 32, 700, 700, 96, 256),
    swa(1, 8, 4, 1300, 1300, 256, 512),
    swa(2, 16, 8, 1, 4000, 256, 1024),
    swa(1, 16, 8, 512, 4096, 256, 1024),
    swa(1, 8, 2, 384, 3000, 128, 1500),
    swa(2, 8, 8, 600, 2000, 64, 900, "bshd"),
]


def window_shapes(tpl: Template, shapes=None) -> list[Shape]:
    """The windowed shapes a template is checked on: WINDOW_CHECK_SHAPES (or `shapes`) where its
    spec says `windows = true`, none otherwise."""
    return list(WINDOW_CHECK_SHAPES if shapes is None else shapes) if tpl.windows else []


TIME_SHAPES = mhas([
    (1, 1, 128, 64, False), (1, 1, 256, 64, False), (1, 1, 512, 64, False), (2, 8, 128, 64, False),
    (4, 16, 1024, 64, True),
])
# --more-shapes: ragged S around the tile sizes, causal and not, both head dims.
EXTRA_CHECK_SHAPES = mhas([
    (1, 1, 1, 128, True), (1, 1, 17, 128, False), (1, 3, 100, 64, False), (1, 1, 64, 128, True),
    (1, 1, 65, 64, True), (2, 3, 333, 64, True), (1, 1, 1000, 128, False), (1, 2, 1000, 128, True),
    (1, 1, 4097, 64, True), (1, 2, 4097, 128, True),
    # Causal, one CTA per tile: heads scheduled in groups whose K/V fit 8 MiB (wgmma_tma.cu),
    # here with a smaller last group (groups of 2, 2, 1 heads; of 7, 3 with a ragged S).
    (1, 5, 8192, 128, True), (2, 5, 4500, 64, True),
]) + [
    gqa(1, 32, 8, 512, 4096, 128, True), gqa(2, 16, 4, 2048, 2048, 64, True, "bshd"),
    gqa(8, 32, 8, 1, 16384, 128, False), gqa(8, 32, 1, 1, 4096, 128, True, padded=True),
]
# --time-shapes decode: the LLM decode shapes of issue 17 (Llama-3-8B heads 32/8, D 128, bf16
# in the daemon; timed here in fp16 like the other tables), plus MQA and a ragged cache.
DECODE_TIME_SHAPES = [
    gqa(1, 32, 8, 1, 1024, 128, True), gqa(1, 32, 8, 1, 4096, 128, True), gqa(8, 32, 8, 1, 4096, 128, True),
    gqa(8, 32, 8, 1, 4000, 128, True), gqa(64, 32, 8, 1, 4096, 128, True), gqa(8, 32, 8, 1, 16384, 128, True),
    gqa(8, 32, 1, 1, 4096, 128, True),
]
# --time-shapes llm: prefill and chunked prefill with grouped-query heads.
LLM_TIME_SHAPES = [
    gqa(1, 32, 8, 4096, 4096, 128, True), gqa(4, 32, 8, 1024, 1024, 128, True), gqa(1, 32, 8, 512, 4096, 128, True),
    gqa(4, 16, 4, 2048, 2048, 64, True),
]
# --sdpa: large prefill shapes
SDPA_SHAPES = mhas([
    (4, 16, 4096, 64, False), (4, 16, 4096, 64, True), (2, 16, 8192, 128, False), (2, 16, 8192, 128, True),
])
# --faults: the testing templates' single launch, and the shapes a planted fault in a
# real template is checked on (several key tiles per CTA, so a K/V ring slot is reused).
FAULT_SHAPE = mha(1, 1, 128, 64, False)
FAULT_CHECK_SHAPES = mhas([(1, 1, 128, 64, False), (2, 4, 1000, 64, True), (1, 2, 4097, 128, False)])
MBAR_FAULT_MACRO = "OPTD_FAULT_MBAR_PHASE"
# --time-best: the best kernel per shape of the daemon's last complete benchmark run (docs/BENCHMARKS.md,
# 2026-11-23, run 20261123-234147-be5c, its report's best-kernel table): mma-fa2 on the latency-bound
# shapes, wgmma-tma on the four large ones. (template file, knobs, shapes)
_FA2 = dict(NUM_WARPS=4, STAGES=2, SWIZZLE=1, WARP_ROWS=16)
_WT = dict(CONSUMERS=3, LAZY_RESCALE=1, PINGPONG=1)
BEST_POINTS = [
    ("mma_fa2.cu", dict(_FA2, BLOCK_N=32, KV_WARPS=1), mhas([(1, 1, 32, 64, False)])),
    ("mma_fa2.cu", dict(_FA2, BLOCK_N=64, KV_WARPS=1), mhas([(1, 1, 64, 64, False)])),
    ("mma_fa2.cu", dict(_FA2, BLOCK_N=64, KV_WARPS=2), mhas([(1, 1, 128, 64, False), (2, 8, 128, 64, False)])),
    ("mma_fa2.cu", dict(_FA2, BLOCK_N=64, KV_WARPS=4), mhas([(1, 1, 256, 64, False), (1, 1, 512, 64, False)])),
    ("wgmma_tma.cu", dict(_WT, BLOCK_N=128, STAGES=2, OVERLAP=1, PERSISTENT=1), mhas([(4, 16, 4096, 64, False)])),
    ("wgmma_tma.cu", dict(_WT, BLOCK_N=192, STAGES=3, OVERLAP=0, PERSISTENT=0), mhas([(4, 16, 4096, 64, True)])),
    ("wgmma_tma.cu", dict(_WT, BLOCK_N=128, STAGES=2, OVERLAP=0, PERSISTENT=1), mhas([(2, 16, 8192, 128, False)])),
    ("wgmma_tma.cu", dict(_WT, BLOCK_N=128, STAGES=2, OVERLAP=0, PERSISTENT=0), mhas([(2, 16, 8192, 128, True)])),
]
# --time-best --points ragged: ragged S, where the last query tile holds a few rows
# (wgmma_tma.cu's TAIL_SPLIT and the persistent non-causal rotation of
# common/tile_scheduler.cuh): the unseen workload's S 577 kernel (run 20261126, 20m, it43)
# around S 577 and at (16,16,577,64), the tail split or not; D 128 causal with a 40-row tail
# (3 consumers) and a one-row tail (2 consumers, the LLM workload's (4,32,1024,128) kernel).
_S577 = dict(_WT, BLOCK_N=128, STAGES=2, OVERLAP=1, PERSISTENT=1)
RAGGED_POINTS = [
    ("wgmma_tma.cu", dict(_S577, TAIL_SPLIT=ts),
     mhas([(32, 16, s, 64, False) for s in (512, 576, 577, 640, 704)] + [(16, 16, 577, 64, False)]))
    for ts in (1, 0)
] + [
    ("wgmma_tma.cu", dict(_WT, BLOCK_N=128, STAGES=2, OVERLAP=0, PERSISTENT=0, TAIL_SPLIT=ts),
     mhas([(4, 32, 1000, 128, True)])) for ts in (1, 0)
] + [
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=2, BLOCK_N=128, STAGES=2, OVERLAP=1, PERSISTENT=1, TAIL_SPLIT=ts),
     mhas([(4, 32, 1025, 128, True)])) for ts in (1, 0)
]
# --time-best --points medium: issue 19's medium shapes (S 577-2048, D 64 and 128, causal and
# not), each at the wgmma-tma points the daemon's runs picked for such shapes; the summary
# compares the fastest with cuDNN and FA4.
_MEDIUM_KNOBS = [
    dict(_WT, BLOCK_N=128, STAGES=2, OVERLAP=1, PERSISTENT=1),  # unseen S 577, benchmark (4,16,4096,64)
    dict(_WT, BLOCK_N=128, STAGES=2, OVERLAP=0, PERSISTENT=1),  # benchmark (2,16,8192,128)
    dict(_WT, BLOCK_N=128, STAGES=2, OVERLAP=0, PERSISTENT=0),  # LLM / unseen D 128 causal
    dict(_WT, BLOCK_N=192, STAGES=2, OVERLAP=0, PERSISTENT=0),  # LLM (4,16,2048,64) causal
    dict(_WT, CONSUMERS=2, BLOCK_N=128, STAGES=2, OVERLAP=1, PERSISTENT=1),  # LLM (4,32,1024,128) causal
    dict(_WT, CONSUMERS=2, BLOCK_N=192, STAGES=2, OVERLAP=1, PERSISTENT=1),  # LLM chunked prefill
]
MEDIUM_SHAPES = mhas([
    (16, 16, 577, 64, False), (32, 16, 577, 64, False), (8, 16, 1024, 64, False), (8, 16, 1024, 64, True),
    (8, 16, 2048, 64, False), (4, 32, 1024, 128, True), (4, 32, 2048, 128, True), (8, 16, 1536, 128, False),
])
MEDIUM_POINTS = [("wgmma_tma.cu", kn, MEDIUM_SHAPES) for kn in _MEDIUM_KNOBS]
# --time-best --points pingpong: ncu showed our best (4,16,4096,64) kernel stalled on barriers
# 5.6x as often per issued instruction as FA4's (docs/HOPPER.md): PINGPONG and PERSISTENT on and
# off at the large non-causal points and a medium causal one.
PINGPONG_POINTS = [
    ("wgmma_tma.cu", dict(_WT, BLOCK_N=128, STAGES=2, OVERLAP=1, PINGPONG=pp, PERSISTENT=pe), mhas([(4, 16, 4096, 64, False)]))
    for pp in (1, 0) for pe in (1, 0)
] + [
    ("wgmma_tma.cu", dict(_WT, BLOCK_N=128, STAGES=2, OVERLAP=0, PINGPONG=pp, PERSISTENT=pe), mhas([(2, 16, 8192, 128, False)]))
    for pp in (1, 0) for pe in (1, 0)
] + [
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=2, BLOCK_N=128, STAGES=2, OVERLAP=1, PINGPONG=pp, PERSISTENT=1),
     mhas([(8, 16, 1024, 64, True)])) for pp in (1, 0)
]
# --time-best --points overlap: OVERLAP 1 against 0 after the softmax was kept under the previous
# tile's P V (ptxas had hoisted wgmma.wait_group 0 above the exponentials in every OVERLAP point,
# docs/HOPPER.md "The softmax under the P V"): the large shapes at FA4's points (D 64: 3 consumers,
# D 128: 2, BLOCK_N 128, not persistent) and the daemon's, and two medium shapes. With
# --time-against DIR (the templates before the change) each point runs both ways.
OVERLAP_POINTS = [
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=c, BLOCK_N=bn, STAGES=2, OVERLAP=ov, PERSISTENT=pe), shapes)
    for c, bn, pe, shapes in (
        (3, 128, 1, mhas([(4, 16, 4096, 64, False), (16, 16, 577, 64, False)])),
        (3, 128, 0, mhas([(4, 16, 4096, 64, False), (4, 16, 4096, 64, True)])),
        (2, 128, 0, mhas([(2, 16, 8192, 128, False), (2, 16, 8192, 128, True), (4, 32, 1024, 128, True)])),
        (2, 128, 1, mhas([(2, 16, 8192, 128, False), (8, 16, 1536, 128, False)])),
        (2, 192, 1, mhas([(2, 16, 8192, 128, False)])),
    )
    for ov in (1, 0)
]
# --time-best --points epilogue: EPI_TMA 1 (O through shared memory and a TMA store per
# warpgroup) against 0 (4-byte stores from registers) at the benchmark's best points and two
# medium shapes, where the epilogue is a larger share (fewer key tiles per work tile).
EPILOGUE_POINTS = [
    (tpl, dict(knobs, EPI_TMA=e), shapes)
    for tpl, knobs, shapes in BEST_POINTS if tpl == "wgmma_tma.cu"
    for e in (1, 0)
] + [
    ("wgmma_tma.cu", dict(_WT, BLOCK_N=128, STAGES=2, OVERLAP=1, PERSISTENT=1, EPI_TMA=e),
     mhas([(16, 16, 577, 64, False), (8, 16, 1024, 64, False)])) for e in (1, 0)
]
# --time-best --points gqa: PACK_GQA 1 against 0 (the G query heads of a K/V head in one work
# tile) on grouped-query D 64 prefill, causal (where the packed tile's shorter
# diagonal saves work) and not, G 4 and 8, at the points the LLM run picked for such shapes.
GQA_SHAPES = [gqa(4, 16, 4, 2048, 2048, 64, True), gqa(1, 32, 8, 4096, 4096, 64, True),
              gqa(2, 32, 4, 1024, 1024, 64, True), gqa(4, 16, 4, 2048, 2048, 64, False)]
# D 128 (Llama-3-8B's heads; packed with a Q / O box per panel): prefill, a batch of shorter
# prompts, chunked prefill, at the two D 128 points the runs pick (3 consumers without OVERLAP,
# whose 160 registers do not hold two tiles in flight; 2 with it).
GQA_SHAPES_D128 = [gqa(1, 32, 8, 4096, 4096, 128, True), gqa(4, 32, 8, 1024, 1024, 128, True),
                   gqa(1, 32, 8, 512, 4096, 128, True)]
GQA_POINTS = [
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=c, BLOCK_N=128, STAGES=2, OVERLAP=1, PERSISTENT=1, EPI_TMA=1, PACK_GQA=pk), GQA_SHAPES)
    for c in (3, 2) for pk in (1, 0)
] + [
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=c, BLOCK_N=128, STAGES=2, OVERLAP=ov, PERSISTENT=1, EPI_TMA=1, PACK_GQA=pk),
     GQA_SHAPES_D128)
    for c, ov in ((3, 0), (2, 1)) for pk in (1, 0)
]
# --time-best --points streamk: STREAM_K 1 (the last round's work tiles in key-range pieces over
# every SM, merged by the last piece) against 0 on the non-causal large and medium shapes, at the
# points the daemon's runs picked (persistent: the knob needs it).
STREAMK_POINTS = [
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=c, BLOCK_N=bn, STAGES=2, OVERLAP=ov, PERSISTENT=1, EPI_TMA=1, STREAM_K=sk), shapes)
    for c, bn, ov, shapes in (
        (3, 128, 0, mhas([(2, 16, 8192, 128, False), (8, 16, 1536, 128, False)])),
        (2, 128, 1, mhas([(2, 16, 8192, 128, False), (8, 16, 1536, 128, False)])),
        (3, 128, 1, mhas([(4, 16, 4096, 64, False), (16, 16, 577, 64, False), (32, 16, 577, 64, False),
                          (8, 16, 1024, 64, False), (8, 16, 2048, 64, False)])),
    )
    for sk in (1, 0)
]
# --time-best --points lpt: LPT_MIB 32 against 8 (the K/V bytes of the heads whose tiles are
# ordered longest first together; causal, one CTA per tile) on the causal large and LLM shapes.
LPT_POINTS = [
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=c, BLOCK_N=128, STAGES=2, OVERLAP=ov, PERSISTENT=0, EPI_TMA=1, LPT_MIB=mib), shapes)
    for c, ov, shapes in (
        (3, 1, mhas([(4, 16, 4096, 64, True), (8, 16, 1024, 64, True)]) + [gqa(4, 16, 4, 2048, 2048, 64, True)]),
        (2, 1, mhas([(2, 16, 8192, 128, True)]) + [gqa(1, 32, 8, 4096, 4096, 128, True)]),
        (3, 0, mhas([(2, 16, 8192, 128, True)])),
    )
    for mib in (32, 8)
]
# --time-best --points dynamic: DYNAMIC 1 (persistent causal CTAs take work tiles longest first
# from a global counter) against the static snake rounds (DYNAMIC 0) and against one CTA per tile
# (PERSISTENT 0, the hardware's dynamic order), packed GQA heads and not, on the causal large and
# LLM shapes; the static rounds' busiest CTA models at 1.03-1.79x the mean there.
_DYN_D64 = mhas([(4, 16, 4096, 64, True), (8, 16, 1024, 64, True)]) + [
    gqa(4, 16, 4, 2048, 2048, 64, True), gqa(1, 32, 8, 4096, 4096, 64, True), gqa(2, 32, 4, 1024, 1024, 64, True)]
_DYN_D128 = mhas([(2, 16, 8192, 128, True), (4, 32, 1024, 128, True)]) + [
    gqa(1, 32, 8, 4096, 4096, 128, True), gqa(4, 32, 8, 1024, 1024, 128, True)]
DYNAMIC_POINTS = [
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=c, BLOCK_N=128, STAGES=2, OVERLAP=ov, PERSISTENT=pe, EPI_TMA=1, DYNAMIC=dy,
                          PACK_GQA=pk), shapes)
    for c, ov, shapes in ((3, 1, _DYN_D64), (2, 1, _DYN_D128), (3, 0, _DYN_D128[:1] + _DYN_D128[2:3]))
    for pe, dy, pk in ((1, 1, 0), (1, 0, 0), (0, 0, 0), (1, 1, 1), (0, 0, 1))
]
# --time-best --points tiles_per_cta: DYNAMIC's D 64 causal point on GQA and MHA shapes of one
# per-head size at B 1, 2, 4 (5.3 to 21 work tiles per CTA): does our gap to FA4 on GQA prefill
# shrink as each CTA gets more tiles (a per-CTA fixed cost), docs/HOPPER.md.
TILES_PER_CTA_POINTS = [
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=c, BLOCK_N=128, STAGES=2, OVERLAP=1, PERSISTENT=1, EPI_TMA=1, DYNAMIC=1),
     [gqa(b, 32, 8, 4096, 4096, 64, True) for b in (1, 2, 4)] + [gqa(b, 32, 32, 4096, 4096, 64, True) for b in (1, 2)])
    for c in (3, 2)
]
# --time-best --points qstages: Q_STAGES 2 against 1 (the next work tile's Q loaded into a second
# slot under this tile's last key tiles), persistent points: DYNAMIC causal at D 64 (3 consumers,
# OVERLAP) and D 128 (2 consumers, OVERLAP), and the static non-causal D 64 point.
_QS_D64C = [gqa(4, 16, 4, 2048, 2048, 64, True), gqa(1, 32, 8, 4096, 4096, 64, True)] + \
    mhas([(8, 16, 1024, 64, True), (4, 16, 4096, 64, True)])
_QS_D128C = mhas([(2, 16, 8192, 128, True), (4, 32, 1024, 128, True), (4, 32, 2048, 128, True)]) + \
    [gqa(1, 32, 8, 4096, 4096, 128, True)]
_QS_D64 = mhas([(4, 16, 4096, 64, False), (8, 16, 1024, 64, False), (16, 16, 577, 64, False)])
QSTAGES_POINTS = [
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=c, BLOCK_N=128, STAGES=2, OVERLAP=1, PERSISTENT=1, EPI_TMA=1, DYNAMIC=1,
                          Q_STAGES=q), shapes)
    for c, shapes in ((3, _QS_D64C), (2, _QS_D128C), (3, _QS_D64)) for q in (1, 2)
]
# --time-best --points medium_causal: issue 19's medium shape at parity with cuDNN, (8,16,1024,64)
# causal, over the knobs that shape the causal schedule (tile height, ping-pong, overlap, Q slots).
# --points gqa_causal: the same knobs on issue 17's D 64 GQA prefill shapes.
def _causal_points(shapes):
    return [
        ("wgmma_tma.cu", dict(_WT, CONSUMERS=c, PINGPONG=pp, OVERLAP=ov, Q_STAGES=q, BLOCK_N=128, STAGES=2, PERSISTENT=1,
                              EPI_TMA=1, DYNAMIC=1), shapes)
        for c in (3, 2) for pp in (1, 0) for ov in (1, 0) for q in (1, 2)
    ]


MEDIUM_CAUSAL_POINTS = _causal_points(mhas([(8, 16, 1024, 64, True)]))
GQA_CAUSAL_POINTS = _causal_points([gqa(4, 16, 4, 2048, 2048, 64, True), gqa(1, 32, 8, 4096, 4096, 64, True)])
# --points causal_ring: with a second Q slot, the next tile's first K/V load is gated by the ring
# instead: STAGES 3 and 192-key tiles on the same short causal shapes.
CAUSAL_RING_POINTS = [
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=3, PINGPONG=pp, OVERLAP=1, Q_STAGES=2, BLOCK_N=bn, STAGES=st, PERSISTENT=1,
                          EPI_TMA=1, DYNAMIC=1),
     [gqa(4, 16, 4, 2048, 2048, 64, True), gqa(1, 32, 8, 4096, 4096, 64, True)] + mhas([(8, 16, 1024, 64, True)]))
    for pp in (1, 0) for bn in (128, 192) for st in (2, 3)
]
# --points chunked: issue 17's chunked prefill (sq 512 against sk 4096, 32/8 heads, D 128, causal), at
# 0.95-0.97x FA4 on 2026-11-27: 128 work tiles of 29-32 key tiles each, one per CTA, so persistence
# and Q slots do nothing; the knobs that change a single tile's time: packing the G query heads of a
# K/V head, ping-pong, overlap, the epilogue, 176-key tiles (with O stored without shared memory, as
# 176 keys and the TMA-store buffer exceed 227 KiB), and one CTA per tile.
_CHUNKED = [gqa(1, 32, 8, 512, 4096, 128, True)]
_CH = dict(_WT, CONSUMERS=2, BLOCK_N=128, STAGES=2, PERSISTENT=1, DYNAMIC=1, Q_STAGES=1)
CHUNKED_POINTS = [
    ("wgmma_tma.cu", dict(_CH, PACK_GQA=pk, PINGPONG=pp, OVERLAP=ov, EPI_TMA=ep), _CHUNKED)
    for pk in (0, 1) for pp in (1, 0) for ov in (1, 0) for ep in (1, 0)
] + [
    ("wgmma_tma.cu", dict(_CH, BLOCK_N=176, EPI_TMA=0, PACK_GQA=0, PINGPONG=pp, OVERLAP=1), _CHUNKED) for pp in (1, 0)
] + [("wgmma_tma.cu", dict(_CH, PERSISTENT=0, DYNAMIC=0, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1), _CHUNKED)]
# --points chunked_code: the same shape, the code our kernel carries that the shape never runs
# (ncu, 2026-11-27: 5960 SASS instructions against FA4's 2328, 5.8% of warp stalls on no
# instruction against 0.8%): the tail split's path (TAIL_SPLIT; S 512 has no ragged tail), the
# dynamic counter (DYNAMIC) and the persistent loop (PERSISTENT), on and off.
CHUNKED_CODE_POINTS = [
    ("wgmma_tma.cu", dict(_CH, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1, TAIL_SPLIT=ts, DYNAMIC=dy), _CHUNKED)
    for ts in (1, 0) for dy in (1, 0)
] + [("wgmma_tma.cu", dict(_CH, PERSISTENT=0, DYNAMIC=0, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1, TAIL_SPLIT=0),
      _CHUNKED)]
# --points chunked_sweep: the LLM run's chunked-prefill point and FA4 over sk 512-16384 at sq 512:
# time against key tiles per CTA separates a fixed per-tile cost from a per-key-tile one.
CHUNKED_SWEEP_POINTS = [
    ("wgmma_tma.cu", dict(_CH, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1),
     [gqa(1, 32, 8, 512, sk, 128, True) for sk in (512, 1024, 2048, 4096, 8192, 16384)])
]
# --points chunked_loop: the steady-state key-tile loop alone (sq 512 against sk 16384: 128 key tiles
# per CTA), lazy rescaling and ping-pong on and off.
CHUNKED_LOOP_POINTS = [
    ("wgmma_tma.cu", dict(_CH, PACK_GQA=0, PINGPONG=pp, OVERLAP=1, EPI_TMA=1, LAZY_RESCALE=lz),
     [gqa(1, 32, 8, 512, 16384, 128, True)])
    for lz in (1, 0) for pp in (1, 0)
] + [
    # 3 consumers (192-row tiles: 96 CTAs here), without and with OVERLAP, as the large D 128 shapes run
    ("wgmma_tma.cu", dict(_CH, CONSUMERS=3, PACK_GQA=0, PINGPONG=1, OVERLAP=ov, EPI_TMA=1),
     [gqa(1, 32, 8, 512, 16384, 128, True)]) for ov in (0, 1)
] + [
    # D 64 at the daemon's D 64 point (3 consumers, OVERLAP; FA4 runs 192 x 128 tiles there too)
    ("wgmma_tma.cu", dict(_CH, CONSUMERS=3, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1),
     [gqa(1, 32, 8, 576, 16384, 64, True)])
]
# --points loop_ab: the OVERLAP loops in the long-loop bench (sq 512 / 576 against sk 16384, one tile
# per CTA) and two large shapes at the daemon's points, for --time-against A/B of a loop change.
LOOP_AB_POINTS = [
    ("wgmma_tma.cu", dict(_CH, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1), [gqa(1, 32, 8, 512, 16384, 128, True)]),
    ("wgmma_tma.cu", dict(_CH, CONSUMERS=3, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1),
     [gqa(1, 32, 8, 576, 16384, 64, True)]),
    ("wgmma_tma.cu", dict(_CH, CONSUMERS=3, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1, DYNAMIC=0),
     mhas([(4, 16, 4096, 64, False)])),
    ("wgmma_tma.cu", dict(_CH, CONSUMERS=3, PACK_GQA=0, PINGPONG=1, OVERLAP=0, EPI_TMA=1, DYNAMIC=0),
     mhas([(2, 16, 8192, 128, False)])),
]
# --points loop_ab2: the same A/B on the LLM run's D 128 prefill shapes at its winners' points.
LOOP_AB2_POINTS = [
    ("wgmma_tma.cu", dict(_CH, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1),
     [gqa(1, 32, 8, 512, 4096, 128, True), gqa(1, 32, 8, 512, 16384, 128, True)]),
    ("wgmma_tma.cu", dict(_CH, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1, Q_STAGES=2),
     [gqa(4, 32, 8, 1024, 1024, 128, True)]),
    ("wgmma_tma.cu", dict(_CH, CONSUMERS=3, PACK_GQA=0, PINGPONG=1, OVERLAP=0, EPI_TMA=1),
     [gqa(1, 32, 8, 4096, 4096, 128, True)]),
]
# --points pv_wait: the OVERLAP points of the daemon's large, medium, LLM and chunked shapes, for
# PV_WAIT's A/B: --time-against a copy of kernel-templates/ whose PV_WAIT list starts with the other
# value (points here leave PV_WAIT to each copy's first value), so each round times 1 and 0 back to back.
_PV = dict(_WT, BLOCK_N=128, PERSISTENT=1, OVERLAP=1, PINGPONG=1, EPI_TMA=1, PACK_GQA=0, DYNAMIC=1)
PV_WAIT_POINTS = [
    ("wgmma_tma.cu", dict(_PV, CONSUMERS=3, STAGES=2, Q_STAGES=2),
     mhas([(4, 16, 4096, 64, True), (4, 16, 4096, 64, False), (16, 16, 577, 64, False)])),
    ("wgmma_tma.cu", dict(_PV, CONSUMERS=3, STAGES=3, Q_STAGES=2),
     [gqa(4, 16, 4, 2048, 2048, 64, True)] + mhas([(8, 16, 1024, 64, True)])),
    ("wgmma_tma.cu", dict(_PV, CONSUMERS=2, STAGES=2, Q_STAGES=1),
     mhas([(2, 16, 8192, 128, True)]) + [gqa(1, 32, 8, 512, 4096, 128, True), gqa(1, 32, 8, 512, 16384, 128, True)]),
    ("wgmma_tma.cu", dict(_PV, CONSUMERS=2, STAGES=2, Q_STAGES=2),
     mhas([(4, 32, 1024, 128, True)]) + [gqa(4, 32, 8, 1024, 1024, 128, True)]),
    ("wgmma_tma.cu", dict(_PV, CONSUMERS=3, STAGES=2, Q_STAGES=1), [gqa(1, 32, 8, 576, 16384, 64, True)]),
]
# --points sk_causal: STREAM_K on causal grids of one partial round (fewer work tiles than SMs):
# chunked prefill (128 tiles of 29-32 key tiles on 132 SMs; 512 of 16384: 125-128), its D 64 loop
# bench (96 192-row tiles), packed GQA tiles, a ragged last query tile split between the consumers
# (TAIL_SPLIT) with a ragged SK, and a shape whose first tiles are too short for the pieces
# (MHA S 2048: the kernel keeps whole tiles on its 132-CTA grid); STREAM_K 0 beside each.
_SKC_SHAPES_128 = [gqa(1, 32, 8, 512, 4096, 128, True), gqa(1, 32, 8, 512, 16384, 128, True),
                   gqa(1, 16, 4, 300, 2000, 128, True), gqa(1, 4, 4, 2048, 2048, 128, True)]
SK_CAUSAL_POINTS = [
    ("wgmma_tma.cu", dict(_CH, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1, STREAM_K=sk), _SKC_SHAPES_128)
    for sk in (1, 0)
] + [
    ("wgmma_tma.cu", dict(_CH, PACK_GQA=1, PINGPONG=1, OVERLAP=1, EPI_TMA=1, STREAM_K=sk), [gqa(1, 32, 8, 512, 4096, 128, True)])
    for sk in (1, 0)
] + [
    ("wgmma_tma.cu", dict(_CH, CONSUMERS=3, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1, STREAM_K=sk),
     [gqa(1, 32, 8, 576, 16384, 64, True), gqa(1, 16, 4, 300, 2000, 64, True)])
    for sk in (1, 0)
]
# --points sk_diag: STREAM_K's fixed cost at D 128 (two consumers): the second segment's Q in its
# own slot (Q_STAGES 2) or behind the first's (1), against whole tiles.
SK_DIAG_POINTS = [
    ("wgmma_tma.cu", dict(_CH, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1, STREAM_K=sk, Q_STAGES=qs),
     [gqa(1, 32, 8, 512, 4096, 128, True), gqa(1, 32, 8, 512, 16384, 128, True)])
    for sk, qs in ((1, 1), (1, 2), (0, 1))
] + [
    # MHA (no two CTAs read one K/V head) against GQA 4 (16 CTAs read each), at sk 2048
    ("wgmma_tma.cu", dict(_CH, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1, STREAM_K=sk),
     [gqa(1, 32, 32, 512, 2048, 128, True), gqa(1, 32, 8, 512, 2048, 128, True)])
    for sk in (1, 0)
]
# --points lazy_pv (session 14's A/B, before WT_LAZY made the two values one kernel in the OVERLAP
# loop): LAZY_RESCALE 0 against 1 under PV_WAIT 1, where O is rescaled on every key tile
# anyway and the lazy threshold only adds compares per row (ncu, 2026-11-27: FSETP 5.9 and PLOP3
# 3.8 per warp and key tile against FA4's 2 and 0 on the sk 16384 bench), at the OVERLAP points of
# the chunked, LLM and large causal shapes.
LAZY_PV_POINTS = [
    (rel, dict(kn, LAZY_RESCALE=lz), shapes)
    for rel, kn, shapes in (
        ("wgmma_tma.cu", dict(_CH, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1),
         [gqa(1, 32, 8, 512, 4096, 128, True), gqa(1, 32, 8, 512, 16384, 128, True)]),
        ("wgmma_tma.cu", dict(_PV, CONSUMERS=2, STAGES=2, Q_STAGES=2),
         [gqa(4, 32, 8, 1024, 1024, 128, True)] + mhas([(2, 16, 8192, 128, True)])),
        ("wgmma_tma.cu", dict(_PV, CONSUMERS=3, STAGES=2, Q_STAGES=2), mhas([(4, 16, 4096, 64, True), (4, 16, 4096, 64, False)])),
        ("wgmma_tma.cu", dict(_CH, CONSUMERS=3, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1), [gqa(1, 32, 8, 576, 16384, 64, True)]),
    )
    for lz in (0, 1)
]
# --points large: issue 19's four large shapes at the fixed points of the session-11 comparison with
# FA4 (BENCHMARKS 2026-11-27 (7)), non-causal (4,16,4096,64) at both of its candidate points; for
# --time-against A/Bs (e.g. two compilers' cubins) with FA4 and --sustain-ms beside them.
LARGE_POINTS = [
    ("wgmma_tma.cu", dict(_PV, CONSUMERS=3, STAGES=2, Q_STAGES=2), mhas([(4, 16, 4096, 64, True), (4, 16, 4096, 64, False)])),
    ("wgmma_tma.cu", dict(_CH, CONSUMERS=3, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1, DYNAMIC=0),
     mhas([(4, 16, 4096, 64, False)])),
    ("wgmma_tma.cu", dict(_PV, CONSUMERS=2, STAGES=2, Q_STAGES=1), mhas([(2, 16, 8192, 128, True)])),
    ("wgmma_tma.cu", dict(_CH, CONSUMERS=3, PACK_GQA=0, PINGPONG=1, OVERLAP=0, EPI_TMA=1, DYNAMIC=0),
     mhas([(2, 16, 8192, 128, False)])),
]
# --points large_nc: the two non-causal large shapes, where FA4 leads under sustained (power-capped)
# timing (docs/HOPPER.md, "Sustained timing is power-capped"), at their current points and at FA4's
# tile (128 rows with OVERLAP: 2 consumers) and FA3's D 128 non-causal tile (128 x 176).
_NC = dict(_WT, PERSISTENT=1, PINGPONG=1, EPI_TMA=1, PACK_GQA=0, STAGES=2)
LARGE_NC_POINTS = [
    ("wgmma_tma.cu", dict(_NC, CONSUMERS=3, BLOCK_N=128, OVERLAP=0, DYNAMIC=0, Q_STAGES=1), mhas([(2, 16, 8192, 128, False)])),
    ("wgmma_tma.cu", dict(_NC, CONSUMERS=2, BLOCK_N=128, OVERLAP=1, DYNAMIC=0, Q_STAGES=1), mhas([(2, 16, 8192, 128, False)])),
    ("wgmma_tma.cu", dict(_NC, CONSUMERS=2, BLOCK_N=128, OVERLAP=1, DYNAMIC=1, Q_STAGES=2), mhas([(2, 16, 8192, 128, False)])),
    ("wgmma_tma.cu", dict(_NC, CONSUMERS=2, BLOCK_N=176, OVERLAP=1, DYNAMIC=0, Q_STAGES=1, EPI_TMA=0),
     mhas([(2, 16, 8192, 128, False)])),
    ("wgmma_tma.cu", dict(_NC, CONSUMERS=3, BLOCK_N=128, OVERLAP=1, DYNAMIC=0, Q_STAGES=1), mhas([(4, 16, 4096, 64, False)])),
    ("wgmma_tma.cu", dict(_NC, CONSUMERS=3, BLOCK_N=192, OVERLAP=1, DYNAMIC=0, Q_STAGES=1), mhas([(4, 16, 4096, 64, False)])),
    ("wgmma_tma.cu", dict(_NC, CONSUMERS=2, BLOCK_N=128, OVERLAP=1, DYNAMIC=0, Q_STAGES=1), mhas([(4, 16, 4096, 64, False)])),
    ("wgmma_tma.cu", dict(_NC, CONSUMERS=3, BLOCK_N=128, OVERLAP=1, DYNAMIC=0, Q_STAGES=1, STAGES=3),
     mhas([(4, 16, 4096, 64, False)])),
]
# --points persist_nc: the non-causal large shapes' points persistent (132 CTAs walking the tiles)
# and not (one CTA per tile, launched in order as FA4's grid is): L2 traffic and energy per call.
PERSIST_NC_POINTS = [
    ("wgmma_tma.cu", dict(_NC, CONSUMERS=3, BLOCK_N=128, OVERLAP=0, DYNAMIC=0, Q_STAGES=1, PERSISTENT=p),
     mhas([(2, 16, 8192, 128, False)])) for p in (1, 0)
] + [
    ("wgmma_tma.cu", dict(_NC, CONSUMERS=3, BLOCK_N=128, OVERLAP=1, DYNAMIC=0, Q_STAGES=1, PERSISTENT=p),
     mhas([(4, 16, 4096, 64, False)])) for p in (1, 0)
]
# --points lazy_ab: the same question as a paired A/B (--time-against a copy of kernel-templates/
# whose LAZY_RESCALE list starts with the other value; the points leave LAZY_RESCALE to each copy's
# first value) on issue 19's four large shapes at LARGE_POINTS' points, the chunked prefill and
# the D 64 long-key bench.
def _no_lazy(kn):
    return {k: v for k, v in kn.items() if k != "LAZY_RESCALE"}


LAZY_AB_POINTS = [(rel, _no_lazy(kn), shapes) for rel, kn, shapes in LARGE_POINTS] + [
    ("wgmma_tma.cu", _no_lazy(dict(_CH, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1)), [gqa(1, 32, 8, 512, 4096, 128, True)]),
    ("wgmma_tma.cu", _no_lazy(dict(_CH, CONSUMERS=3, PACK_GQA=0, PINGPONG=1, OVERLAP=1, EPI_TMA=1)),
     [gqa(1, 32, 8, 576, 16384, 64, True)]),
]
# --points k_first: the decode templates with K_FIRST 1 (a tile's K copies one cp.async group, its V
# the next; Q K^T and the softmax wait for K only) at the LLM workload's decode winners (run
# 20261128-051150-92f2) and at points that exercise the other paths of the per-tile waits: WARP_LOADS
# 0 and 1, one and two row tiles (a padded second tile: G 16 x SQ 3), 2-4 stages, 16-64 keys per warp,
# every combine; on the decode shapes and, in check_points.py, the checker's.
_DEC_SHAPES = [gqa(1, 32, 8, 1, 1024, 128, True), gqa(1, 32, 8, 1, 4096, 128, True), gqa(8, 32, 1, 1, 4096, 128, True),
               gqa(8, 32, 8, 1, 4000, 128, True), gqa(2, 16, 1, 3, 777, 64, True, "bshd")]
K_FIRST_POINTS = [
    ("decode_cluster.cu", dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2, K_FIRST=1), _DEC_SHAPES),
    ("decode_cluster.cu", dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=8, COMBINE=2, WARP_LOADS=0, M_TILES=1, K_FIRST=1), _DEC_SHAPES),
    ("decode_cluster.cu", dict(BLOCK_N=16, NUM_WARPS=4, STAGES=4, CLUSTER=2, COMBINE=2, WARP_LOADS=0, M_TILES=1, K_FIRST=1), _DEC_SHAPES),
    ("decode_cluster.cu", dict(BLOCK_N=64, NUM_WARPS=2, STAGES=2, CLUSTER=4, COMBINE=1, WARP_LOADS=1, M_TILES=1, K_FIRST=1), _DEC_SHAPES),
    ("decode_cluster.cu", dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=8, COMBINE=0, WARP_LOADS=0, M_TILES=2, K_FIRST=1), _DEC_SHAPES),
    ("decode.cu", dict(BLOCK_N=32, NUM_WARPS=4, STAGES=3, SPLIT_WAVES=1, MIN_SPLIT_TILES=1, FUSED_COMBINE=1, WARP_LOADS=1, M_TILES=1,
                       K_FIRST=1), _DEC_SHAPES),
    ("decode.cu", dict(BLOCK_N=16, NUM_WARPS=8, STAGES=2, SPLIT_WAVES=2, MIN_SPLIT_TILES=2, FUSED_COMBINE=0, WARP_LOADS=0, M_TILES=2,
                       K_FIRST=1), _DEC_SHAPES),
    ("decode.cu", dict(BLOCK_N=64, NUM_WARPS=4, STAGES=4, SPLIT_WAVES=1, MIN_SPLIT_TILES=1, FUSED_COMBINE=0, WARP_LOADS=1, M_TILES=2,
                       K_FIRST=1), _DEC_SHAPES),
]
# --points bulk_send: decode-cluster's scatter (COMBINE 3), which stages the split's summed rows over
# xo and sends each rank's share (and the row LSEs) by one bulk copy, and the push (COMBINE 2) beside
# it (its bulk form was measured with this set and dropped, BENCHMARKS 2026-11-28 (18)): 1, 2, 4 and 8
# key warps, one and two row tiles, both K_FIRST, WARP_LOADS 0 and 1, clusters of 2, 4 and 8, on the
# decode shapes (4 packed GQA rows, ragged SK, MQA's 32 rows, D 64 bshd with SQ 3: 48 rows, and in
# check_points.py the checker's, whose row counts that are not a multiple of 4 send their LSEs by
# st.async).
BULK_SEND_POINTS = [
    ("decode_cluster.cu", dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2, K_FIRST=1), _DEC_SHAPES),
    ("decode_cluster.cu", dict(BLOCK_N=16, NUM_WARPS=8, STAGES=3, CLUSTER=4, COMBINE=3, WARP_LOADS=1, M_TILES=1, K_FIRST=0), _DEC_SHAPES),
    ("decode_cluster.cu", dict(BLOCK_N=64, NUM_WARPS=2, STAGES=2, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2, K_FIRST=0), _DEC_SHAPES),
    ("decode_cluster.cu", dict(BLOCK_N=16, NUM_WARPS=4, STAGES=4, CLUSTER=2, COMBINE=3, WARP_LOADS=0, M_TILES=1, K_FIRST=1), _DEC_SHAPES),
    ("decode_cluster.cu", dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=8, COMBINE=2, WARP_LOADS=0, M_TILES=1, K_FIRST=1), _DEC_SHAPES),
    ("decode_cluster.cu", dict(BLOCK_N=32, NUM_WARPS=4, STAGES=3, CLUSTER=4, COMBINE=2, WARP_LOADS=1, M_TILES=2, K_FIRST=0), _DEC_SHAPES),
    ("decode_cluster.cu", dict(BLOCK_N=16, NUM_WARPS=8, STAGES=4, CLUSTER=2, COMBINE=2, WARP_LOADS=1, M_TILES=1, K_FIRST=0), _DEC_SHAPES),
    ("decode_cluster.cu", dict(BLOCK_N=64, NUM_WARPS=2, STAGES=2, CLUSTER=8, COMBINE=2, WARP_LOADS=0, M_TILES=1, K_FIRST=1), _DEC_SHAPES),
]
# --points window: sliding-window shapes of the models the window serves (.dev/window-contract.md)
# at the points the daemon starts the windowed templates from, against SDPA (a boolean window
# mask) and FA4 (window_size = (W - 1, 0)): Mistral 7B (32/8 heads, D 128, W 4096) prefill at
# 8192, chunked prefill and decode over 16384 keys; Gemma 3's local layers (16/8 heads, D 256,
# W 1024) prefill at 4096 and decode; a narrow window (gpt-oss's 128) at D 64.
_WIN_PREFILL = [swa(1, 32, 8, 8192, 8192, 128, 4096), swa(1, 32, 8, 512, 16384, 128, 4096),
                swa(1, 16, 8, 4096, 4096, 256, 1024), swa(2, 64, 8, 4096, 4096, 64, 128)]
_WIN_DECODE = [swa(8, 32, 8, 1, 16384, 128, 4096), swa(1, 32, 8, 1, 16384, 128, 4096),
               swa(8, 16, 8, 1, 16384, 256, 1024), swa(8, 64, 8, 1, 16384, 64, 128)]
WINDOW_POINTS = [
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=2, BLOCK_N=128, STAGES=2, OVERLAP=1, PERSISTENT=1),
     [_WIN_PREFILL[0], _WIN_PREFILL[1], _WIN_PREFILL[3]]),
    ("wgmma_tma.cu", dict(_WT, CONSUMERS=2, BLOCK_N=80, STAGES=2, OVERLAP=1, PERSISTENT=1), [_WIN_PREFILL[2]]),
    ("mma_fa2.cu", dict(_FA2, BLOCK_N=64, KV_WARPS=1), _WIN_PREFILL),
    ("mma_fa2.cu", dict(_FA2, NUM_WARPS=8, BLOCK_N=64, KV_WARPS=1), _WIN_PREFILL),
    ("decode.cu", dict(BLOCK_N=32, NUM_WARPS=4, STAGES=3, SPLIT_WAVES=1, MIN_SPLIT_TILES=1, FUSED_COMBINE=1, WARP_LOADS=1,
                       M_TILES=1, K_FIRST=1), _WIN_DECODE),
    ("decode_cluster.cu", dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=8, COMBINE=2, WARP_LOADS=0, M_TILES=1, K_FIRST=1),
     _WIN_DECODE),
]
# --points window_sk: windowed chunks of fewer work tiles than SMs (Gemma 3 12B's local layers'
# chunk: 64 tiles of 128 rows, 18 key tiles of 64 each, on 132 SMs; a 256-row Mistral chunk),
# whole tiles (one CTA per tile, as the window run's winner, or persistent) against STREAM_K's
# key-range pieces over every SM, beside the same chunks without a window (STREAM_K is inert
# with a window: its windowed rows time whole tiles unless run with session 30's templates,
# e4b025d, where pieces took 58.7 us against 29.4).
_WSK = dict(_WT, CONSUMERS=2, STAGES=2, OVERLAP=1, PINGPONG=1, PACK_GQA=0, DYNAMIC=1, Q_STAGES=1)
_WSK_SHAPES = {256: [swa(1, 16, 8, 512, 4096, 256, 1024), Shape(1, 16, 8, 512, 4096, 256, True)],
               128: [swa(1, 32, 8, 256, 8192, 128, 4096), Shape(1, 32, 8, 256, 8192, 128, True)]}
WINDOW_SK_POINTS = [
    ("wgmma_tma.cu", dict(_WSK, BLOCK_N=bn, EPI_TMA=ep, PERSISTENT=pe, STREAM_K=sk), _WSK_SHAPES[d])
    for d, bn, ep in ((256, 64, 0), (128, 128, 1))
    for pe, sk in ((0, 0), (1, 0), (1, 1))
]
# --points cluster_split: wgmma-tma's CLUSTER_SPLIT (two CTAs per work tile in a cluster, each
# half its key tiles, merged through distributed shared memory; one CTA per tile) against whole
# tiles, on grids of fewer work tiles than half the SMs (the windowed chunks of window_sk, the same
# without a window, D 64 prefill of 8 heads) and one that fills them (Llama's chunk: 128 tiles),
# with a ragged last query tile of 48 rows (TAIL_SPLIT's merged consumers) and packed GQA. Built
# in session 30, checked and timed in session 31 (H200: 760 checks, 0 failures; 0.69-0.87x the
# time of whole tiles under half the SMs, 1.13x at 128 tiles; docs/HOPPER.md "CLUSTER_SPLIT"):
#   timeout 300 python3 scripts/check_points.py cluster_split --windows
_CS = dict(_WT, STAGES=2, PINGPONG=1, PERSISTENT=0, DYNAMIC=1, Q_STAGES=1)
CLUSTER_SPLIT_POINTS = [
    (tpl, dict(knobs, CLUSTER_SPLIT=cs), shapes)
    for tpl, knobs, shapes in (
        ("wgmma_tma.cu", dict(_CS, CONSUMERS=2, BLOCK_N=64, OVERLAP=1, EPI_TMA=0, PACK_GQA=0), _WSK_SHAPES[256]),
        ("wgmma_tma.cu", dict(_CS, CONSUMERS=2, BLOCK_N=128, OVERLAP=1, EPI_TMA=1, PACK_GQA=0),
         _WSK_SHAPES[128] + [Shape(1, 32, 8, 512, 4096, 128, True), swa(1, 8, 2, 560, 2000, 128, 700)]),
        ("wgmma_tma.cu", dict(_CS, CONSUMERS=2, BLOCK_N=128, OVERLAP=1, EPI_TMA=1, PACK_GQA=1),
         [Shape(1, 32, 8, 256, 8192, 128, True)]),
        ("wgmma_tma.cu", dict(_CS, CONSUMERS=3, BLOCK_N=128, OVERLAP=1, EPI_TMA=1, PACK_GQA=0),
         mhas([(1, 8, 1024, 64, False), (1, 8, 1024, 64, True)])),
    )
    for cs in (0, 1)
]
# --points long_decode: the long-decode workload's winners (run 20261130-040353-d0cd: decode-deep-ring's
# 32 keys x 3 stages with the scatter combine, clusters of 8 at batch 1 and of 2 at batch 4; MQA at
# decode-wide's start) on its shapes, timed against SDPA and, where it imports, FA4:
#   python3 scripts/check_templates_gpu.py --time-best --points long_decode --sustain-ms 200 --no-check
_DEEP = dict(BLOCK_N=32, NUM_WARPS=4, STAGES=3, COMBINE=3, WARP_LOADS=0, M_TILES=1, K_FIRST=0)
LONG_DECODE_POINTS = [
    ("decode_cluster.cu", dict(_DEEP, CLUSTER=8), [gqa(1, 32, 8, 1, sk, 128, True) for sk in (16384, 65536, 131072)]),
    ("decode_cluster.cu", dict(_DEEP, CLUSTER=2), [gqa(4, 32, 8, 1, 32768, 128, True)]),
    ("decode_cluster.cu", dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2, K_FIRST=1),
     [gqa(8, 32, 1, 1, 16384, 128, True)]),
]
# --points decode_wgmma: decode-wgmma (one wgmma warpgroup per KV split, K/V by TMA, the cluster's
# scatter combine) at points over every knob value (keys per tile, ring depth, cluster size, 32 or
# 64 packed rows per CTA), with decode-cluster's MQA winner (decode-wide's start) beside it, on the
# decode shapes (4 packed GQA rows, ragged SK, MQA's 32 rows, D 64 bshd with SQ 3: 48 rows, two row
# tiles at ROWS 32) and, in check_points.py, the checker's (head dims 64 and 128 only).
DECODE_WGMMA_POINTS = [
    ("decode_wgmma.cu", dict(BLOCK_N=bn, STAGES=st, CLUSTER=cl, ROWS=rows),
     _DEC_SHAPES + [gqa(2, 32, 8, 16, 1000, 128, True), gqa(1, 32, 4, 8, 2049, 64, True, "bshd")])
    for bn, st, cl, rows in ((128, 3, 8, 32), (64, 4, 8, 32), (128, 2, 4, 64), (64, 2, 2, 64), (64, 3, 8, 64),
                             (128, 2, 2, 32))
] + [
    ("decode_cluster.cu", dict(BLOCK_N=32, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=3, WARP_LOADS=1, M_TILES=2, K_FIRST=1),
     _DEC_SHAPES),
]
# --points generic_q: the generic templates (kv-split, memory, wmma: the plan's stages before tensor
# cores, and the tuned kernels on GPUs without Hopper's) at their first knob values, for a
# --time-against A/B of their Q staging (every chunk loaded before any is stored).
GENERIC_Q_POINTS = [
    (name, {}, mhas([(1, 16, 512, 64, False), (8, 16, 1024, 64, True), (2, 32, 2048, 128, False)]))
    for name in ("kv_split.cu", "memory.cu", "wmma.cu")
]
POINT_SETS = {"best": BEST_POINTS, "ragged": RAGGED_POINTS, "medium": MEDIUM_POINTS, "pingpong": PINGPONG_POINTS,
              "qstages": QSTAGES_POINTS, "medium_causal": MEDIUM_CAUSAL_POINTS, "gqa_causal": GQA_CAUSAL_POINTS,
              "causal_ring": CAUSAL_RING_POINTS, "chunked": CHUNKED_POINTS, "chunked_code": CHUNKED_CODE_POINTS,
              "chunked_sweep": CHUNKED_SWEEP_POINTS, "chunked_loop": CHUNKED_LOOP_POINTS, "loop_ab": LOOP_AB_POINTS,
              "loop_ab2": LOOP_AB2_POINTS,
              "overlap": OVERLAP_POINTS, "epilogue": EPILOGUE_POINTS, "gqa": GQA_POINTS,
              "streamk": STREAMK_POINTS, "lpt": LPT_POINTS, "dynamic": DYNAMIC_POINTS,
              "tiles_per_cta": TILES_PER_CTA_POINTS, "window_sk": WINDOW_SK_POINTS,
              "cluster_split": CLUSTER_SPLIT_POINTS, "pv_wait": PV_WAIT_POINTS,
              "large": LARGE_POINTS, "large_nc": LARGE_NC_POINTS, "persist_nc": PERSIST_NC_POINTS,
              "sk_causal": SK_CAUSAL_POINTS, "sk_diag": SK_DIAG_POINTS,
              "lazy_pv": LAZY_PV_POINTS, "lazy_ab": LAZY_AB_POINTS, "k_first": K_FIRST_POINTS,
              "bulk_send": BULK_SEND_POINTS, "decode_wgmma": DECODE_WGMMA_POINTS, "window": WINDOW_POINTS,
              "long_decode": LONG_DECODE_POINTS, "generic_q": GENERIC_Q_POINTS}
ATOL = {"fp16": 2e-2, "bf16": 6e-2}
RTOL_L2 = 1e-2
H100 = dict(SMS=132, SMEM_OPTIN=232448, CC=90)
ELEM_BYTES = 2


# ---------------------------------------------------------------------------
# Spec expressions: nvrtc_compile_check.eval_expr (Python's eval with no builtins),
# cross-checked against jinja2 when it is installed.
# ---------------------------------------------------------------------------
class Evaluator:
    def __init__(self) -> None:
        try:
            import jinja2
            self.env = jinja2.Environment()
            self.env.globals.update(FUNCS)
        except ImportError:
            self.env = None
        self._cache: dict[str, object] = {}

    def __call__(self, expr: str, ctx: dict) -> int:
        value = eval_expr(expr, ctx)
        if self.env is not None:
            fn = self._cache.get(expr)
            if fn is None:
                fn = self._cache[expr] = self.env.compile_expression(expr)
            jv = fn(**ctx)
            if jv != value:
                raise ValueError(f"jinja2 gives {jv!r}, python {value!r} for {expr!r} with {ctx}")
        if isinstance(value, bool):
            return int(value)
        if not isinstance(value, int):
            raise ValueError(f"{expr!r} gave {value!r}, not an integer")
        return value


EVAL = Evaluator()


class DoesNotFit(ValueError):
    """A (combo, shape) the daemon's gate rejects, so it is skipped, not failed: more shared
    memory than the device has, or a tensor map the TMA cannot encode."""


# ---------------------------------------------------------------------------
# TMA tensor maps: the daemon's fixed geometry convention (src/spec/protocol.rs,
# TensorMap::geometry). Pure, so it is checked without a GPU.
# ---------------------------------------------------------------------------
def tensor_map_geometry(shape: Shape, tensor: str, box_rows: int, swizzle: int, box_panels: int | None = None) -> dict:
    """cuTensorMapEncodeTiled's arguments for one tensor (q, k, v or o) of `shape` through
    its strides (contiguous or padded, either layout), 2-byte elements, a `swizzle`-byte
    swizzle: P = swizzle / 2 elements per panel; rank 5, dims innermost first
    {P, rows, D/P, heads, B} (rows/heads: SQ/HQ for q and o, SK/HKV for k and v), byte
    strides of dims 1..4 {row, P*2, head, batch}, box {P, box_rows, box_panels, 1, 1}
    (box_panels: D/P when None), element strides all 1. Raises ValueError, saying why,
    where the TMA cannot encode it."""
    d = shape.d
    if swizzle not in TMA_SWIZZLES:
        raise ValueError(f"swizzle = {swizzle} bytes; allowed: 32, 64, 128")
    p = swizzle // ELEM_BYTES
    if d <= 0 or d % p:
        raise ValueError(f"D = {d} is not a multiple of the {p}-element panel of a {swizzle}-byte swizzle")
    panels = d // p
    if panels > 256:
        raise ValueError(f"D / {p} = {panels} panels; a box dimension holds at most 256")
    if not 1 <= box_rows <= 256:
        raise ValueError(f"box_rows = {box_rows}; a box dimension holds 1..256")
    box_panels = panels if box_panels is None else box_panels
    if not 1 <= box_panels <= panels:
        raise ValueError(f"box_panels = {box_panels}; D / {p} = {panels} panels, so 1..{panels}")
    heads, rows = shape.dims_of(tensor)
    if rows <= 0 or heads <= 0 or shape.b <= 0:
        raise ValueError(f"shape {shape} has an empty dimension")
    sb, sh, ss = shape.strides(tensor)
    dims = (p, rows, panels, heads, shape.b)
    strides = (ss * ELEM_BYTES, p * ELEM_BYTES, sh * ELEM_BYTES, sb * ELEM_BYTES)
    if max(dims) > 1 << 32:
        raise ValueError(f"a dimension of {max(dims)} exceeds the TMA's 2^32")
    for st in strides:
        if st % 16 or st >= 1 << 40:
            raise ValueError(f"a stride of {st} bytes is not a multiple of 16 below 2^40")
    return dict(swizzle=swizzle, dims=dims, strides_bytes=strides, box=(p, box_rows, box_panels, 1, 1),
                element_strides=(1, 1, 1, 1, 1))


def resolve_tensor_maps(tpl: Template, shape, ctx: dict) -> list[dict]:
    """The template's [[tensor_map]] entries for one shape: param_index, tensor and the
    geometry; box_rows is evaluated like the launch formulas. DoesNotFit when the TMA
    cannot encode one (the daemon's gate rejects the shape too)."""
    maps = []
    for i, tm in enumerate(tpl.tensor_maps):
        rows = EVAL(str(tm["box_rows"]), ctx)
        panels = EVAL(str(tm["box_panels"]), ctx) if "box_panels" in tm else None
        swizzle = EVAL(str(tm["swizzle"]), ctx)  # an integer, or a formula of D (wgmma_tma.cu: 64 at D 96)
        try:
            geometry = tensor_map_geometry(shape, tm["tensor"], rows, swizzle, panels)
        except ValueError as e:
            raise DoesNotFit(f"tensor_map[{i}] ({tm['tensor']}, box_rows \"{tm['box_rows']}\" = {rows}, "
                             f"swizzle {swizzle}): {e}") from None
        maps.append(dict(param_index=ABI_PARAMS + i, tensor=tm["tensor"], **geometry))
    return maps


def describe_tensor_map(m: dict) -> str:
    def braces(xs):
        return "{" + ", ".join(str(x) for x in xs) + "}"
    return (f"param {m['param_index']} {m['tensor']}: dims {braces(m['dims'])} strides_bytes "
            f"{braces(m['strides_bytes'])} box {braces(m['box'])} swizzle {m['swizzle']}B")


def plan(tpl: Template, knobs: dict, shape, dev: dict) -> tuple[int, list[dict], dict]:
    """(n_splits, launches, context) for one shape. Each launch has kernel, grid, block, smem
    and tensor_maps: the template's resolved [[tensor_map]] entries (the same list for every
    launch; empty for templates without). Raises DoesNotFit where the daemon's gate would
    reject the (combo, shape), ValueError for a plan that is wrong."""
    if shape.w and not tpl.windows:
        raise DoesNotFit(f"window = {shape.w}: the template does not implement sliding windows (no `windows = true`)")
    max_sq = tpl.spec["template"].get("max_sq")
    if max_sq is not None and shape.sq > max_sq:
        raise DoesNotFit(f"SQ = {shape.sq} is above the template's max_sq = {max_sq}")
    if shape.d not in tpl.head_dims:
        raise DoesNotFit(f"D = {shape.d} is not among the template's head_dims {list(tpl.head_dims)}")
    d = shape.d
    ctx = dict(tpl.complete(knobs), B=shape.b, HQ=shape.hq, HKV=shape.hkv, G=shape.group, SQ=shape.sq, SK=shape.sk, D=d,
               CAUSAL=int(shape.causal), WINDOW=shape.w, BSHD=int(shape.layout == "bshd"), ELEM_BYTES=ELEM_BYTES,
               **dev)
    for name, expr in tpl.spec["derived"].items():
        ctx[name] = EVAL(str(expr), ctx)
    # [[refuse]]: a point the kernel cannot run on this shape (the daemon's plan refuses it too).
    for r in tpl.spec.get("refuse", []):
        if EVAL(str(r["when"]), ctx):
            raise DoesNotFit(f"refused ({r['when']}): {r['why']}")
    splits = ctx["splits"]
    if splits < 1:
        raise ValueError(f"splits = {splits} < 1")
    tensor_maps = resolve_tensor_maps(tpl, shape, ctx)
    launches = []
    for launch in tpl.spec["launch"]:
        if "when" in launch and not EVAL(launch["when"], ctx):
            continue
        grid = [EVAL(e, ctx) for e in launch["grid"]]
        block = [EVAL(e, ctx) for e in launch["block"]]
        smem = EVAL(launch.get("smem", "0"), ctx)
        if min(grid) < 1 or min(block) < 1 or math.prod(block) > 1024 or grid[1] > 65535 or grid[2] > 65535:
            raise ValueError(f"bad launch {launch['kernel']}: grid {grid} block {block}")
        if smem > dev["SMEM_OPTIN"]:
            raise DoesNotFit(f"launch {launch['kernel']} wants {smem} B of shared memory")
        launches.append(dict(kernel=f"optd_{launch['kernel']}_d{d}", grid=tuple(grid), block=tuple(block), smem=smem,
                             tensor_maps=tensor_maps))
    return splits, launches, ctx


def shape_key(shape: Shape) -> str:
    """The daemon's key (Shape::key), plus `-padded` for a padded view."""
    heads = f"h{shape.hq}" if shape.hq == shape.hkv else f"hq{shape.hq}hkv{shape.hkv}"
    rows = f"s{shape.sq}" if shape.sq == shape.sk else f"sq{shape.sq}sk{shape.sk}"
    key = f"b{shape.b}{heads}{rows}d{shape.d}" + ("-causal" if shape.causal else "")
    key += f"-w{shape.w}" if shape.w else ""
    key += "-bshd" if shape.layout == "bshd" else ""
    return key + ("-padded" if shape.padded else "")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def code_knobs(tpl: Template) -> list[str]:
    """Knobs the code (not the comments or spec) mentions: only these can change a build."""
    common = "".join(p.read_text() for p in sorted((tpl.root / "common").glob("*.cuh")))
    code = _strip_comments(tpl.text) + _strip_comments(common)
    return [k for k in tpl.spec["knobs"] if re.search(rf"\b{re.escape(k)}\b", code)]


def pairwise_combos(tpl: Template) -> list[dict]:
    """A covering set: every value of every knob appears together with every value of
    every other knob in at least one combination (greedy, deterministic). Used where
    the full product is too large to run on the device (memory.cu: 384 combos)."""
    combos = tpl.knob_combos()
    names = list(tpl.spec["knobs"])

    def pairs(c: dict) -> set:
        return {(a, c[a], b, c[b]) for i, a in enumerate(names) for b in names[i + 1:]}

    uncovered = set().union(*(pairs(c) for c in combos))
    chosen = []
    while uncovered:
        best = max(combos, key=lambda c: len(pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


def combos_for(tpl: Template, pairs) -> list[dict]:
    """All combos, or the pairwise covering set when --pairs names this template."""
    if pairs and (tpl.rel in pairs or tpl.name in pairs or Path(tpl.rel).name in pairs):
        return pairwise_combos(tpl)
    return tpl.knob_combos()


def target_label(tpl: Template) -> str:
    if tpl.arch_specific:
        return f"target {specific_arch(tpl)} (arch-specific: cc {tpl.min_cc} only)"
    return "target sm_<cc> of the GPU (--arch for --build-cubins)"


def dry_run(templates: list[Template], windows_only: bool = False) -> int:
    """Print every launch plan (H100 values) of every combination on CHECK_SHAPES and TIME_SHAPES,
    and on WINDOW_CHECK_SHAPES for templates with `windows = true` (windows_only: those alone)."""
    bad = 0
    for tpl in templates:
        used = code_knobs(tpl)
        wins = window_shapes(tpl)
        print(f"== {tpl.rel} ({tpl.name}{', testing' if tpl.testing else ''}); knobs in code: {used}; "
              f"{target_label(tpl)}; {len(tpl.tensor_maps)} tensor maps; "
              + (f"windows: {len(wins)} windowed shapes" if tpl.windows else "no windows (no windowed shapes)"))
        try:
            device_arch(tpl, H100["CC"])
        except Unsupported as e:
            print(f"  skipped on an H100: {e}")
            continue
        for knobs in tpl.knob_combos():
            for bf16 in (False, True):
                render(tpl, knobs, bf16)
            for shape in ([] if windows_only else CHECK_SHAPES + TIME_SHAPES) + wins:
                try:
                    splits, launches, _ = plan(tpl, knobs, shape, H100)
                except DoesNotFit as e:  # the gate rejects it
                    print(f"  {combo_label(knobs):40} {shape_key(shape):22} does not fit: {e}")
                    continue
                except Exception as e:  # noqa: BLE001
                    bad += 1
                    print(f"  {combo_label(knobs):40} {shape_key(shape):22} ERROR {e}")
                    continue
                desc = "; ".join(f"{l['kernel']} {l['grid']}x{l['block'][0]} smem {l['smem']}" for l in launches)
                print(f"  {combo_label(knobs):40} {shape_key(shape):22} splits {splits:2}  {desc}")
                for m in launches[0]["tensor_maps"] if launches else []:
                    print(f"      tensor map {describe_tensor_map(m)}")
    print(f"\ndry run: {'jinja2 cross-checked' if EVAL.env else 'jinja2 not installed'}, {bad} errors")
    return 1 if bad else 0


# ---------------------------------------------------------------------------
# Driver API launches, for templates with tensor maps: CuPy's RawKernel call cannot
# pass a 128-byte struct by value, cuLaunchKernel (cuda.bindings) can.
# ---------------------------------------------------------------------------
class TensorMapArg:
    """One encoded CUtensorMap, copied into 128 bytes of 64-byte aligned host memory (the
    storage of a cuda.bindings CUtensorMap object is not 64-byte aligned): what a
    kernelParams entry points at. `address` stays valid as long as this object."""

    SIZE, ALIGN = 128, 64

    def __init__(self, src_address: int):
        self._storage = (ctypes.c_ubyte * (self.SIZE + self.ALIGN))()
        base = ctypes.addressof(self._storage)
        self.address = base + (-base) % self.ALIGN
        ctypes.memmove(self.address, src_address, self.SIZE)

    def raw(self) -> bytes:
        return ctypes.string_at(self.address, self.SIZE)


class KernelParams:
    """cuLaunchKernel's kernelParams: a void*[] whose entry i points at the storage of kernel
    parameter i (a ctypes scalar, or a TensorMapArg). Keeps that storage alive."""

    def __init__(self, values: list):
        self.values = values
        ptrs = [v.address if isinstance(v, TensorMapArg) else ctypes.addressof(v) for v in values]
        self._array = (ctypes.c_void_p * len(ptrs))(*ptrs)
        self.address = ctypes.addressof(self._array)

    def sizes(self) -> list[int]:
        return [v.SIZE if isinstance(v, TensorMapArg) else ctypes.sizeof(v) for v in self.values]


class Strides(ctypes.Structure):
    """`struct optd_strides` (kernel-templates/common/optd.cuh), passed by value: element
    strides (batch, head, row) of q, k, v, o."""
    _fields_ = [(f"{t}_{x}", ctypes.c_int64) for t in "qkvo" for x in "bhs"]
    SIZE = 96


def semaphore_error(lse, splits: int, rows: int) -> str | None:
    """Why the split semaphores of `lse` (a float32 torch tensor of (splits + 1) * rows
    words; the last `rows` are u32 semaphores) are not all zero after a plan's launches,
    or None. The ABI requires every plan to leave them zero."""
    import torch  # only on the GPU paths, where torch is loaded already

    sem = lse[splits * rows:].view(torch.int32)
    nonzero = (sem != 0).nonzero()
    if nonzero.numel() == 0:
        return None
    i = int(nonzero[0])
    word = int(sem[i]) & 0xFFFFFFFF
    return (f"left split semaphores nonzero (lse_partial[{splits * rows + i}] = {word}, {nonzero.numel()} of "
            f"{sem.numel()} words): the ABI requires every plan to leave lse_partial's last B*HQ*SQ words zero")


def abi_values(q: int, k: int, v: int, o: int, o_part: int, lse: int, shape: Shape, splits: int, counter: int,
               abi: int = 3) -> list:
    """The 17 ABI v3 parameters as ctypes values: six pointers, batch, heads_q, heads_kv, seq_q,
    seq_k, n_splits (int32), softmax_scale = 1/sqrt(D) (float32), causal, window (int32; 0 =
    none), the strides struct, the CTA counter pointer. abi 2 (templates before sliding windows,
    e.g. a --time-against copy of an older commit's): the 16 without `window`, for unwindowed
    shapes only."""
    if abi not in (2, 3):
        raise ValueError(f"kernel ABI v{abi}: this script launches v2 and v3 kernels only")
    if abi == 2 and shape.w:
        raise ValueError(f"{shape_key(shape)} has a sliding window: kernel ABI v2 templates have none")
    strides = Strides(*[x for t in "qkvo" for x in shape.strides(t)])
    window = [ctypes.c_int32(shape.w)] if abi >= 3 else []
    return [ctypes.c_uint64(x) for x in (q, k, v, o, o_part, lse)] + [
        ctypes.c_int32(shape.b), ctypes.c_int32(shape.hq), ctypes.c_int32(shape.hkv), ctypes.c_int32(shape.sq),
        ctypes.c_int32(shape.sk), ctypes.c_int32(splits), ctypes.c_float(1.0 / math.sqrt(shape.d)),
        ctypes.c_int32(int(shape.causal)), *window, strides, ctypes.c_uint64(counter),
    ]


def template_abi(tpl: Template) -> int:
    """The kernel ABI a templates folder's kernels take, read from its common/optd.cuh's
    OPTD_ARGS: 3 with `int window` (2026-11-29 on), 2 before (heads_kv and the strides struct).
    What lets --time-against time the templates of a commit before a change of the ABI."""
    return _folder_abi(tpl.root)


@functools.lru_cache(maxsize=None)
def _folder_abi(root: Path) -> int:
    text = (root / "common" / "optd.cuh").read_text()
    args = text[text.find("#define OPTD_ARGS"):]
    args = args[:args.find("#define OPTD_ARG_NAMES")]
    if "int window" in args:
        return 3
    if "heads_kv" in args and "optd_strides" in args:
        return 2
    raise ValueError(f"{root}/common/optd.cuh: OPTD_ARGS is neither kernel ABI v2 nor v3")


class Driver:
    """The few cuda.bindings.driver calls this script makes, each checked: a failure raises
    RuntimeError naming the call, its arguments and the CUDA error."""

    def __init__(self):
        try:
            from cuda.bindings import driver
        except ImportError as e:
            raise RuntimeError(
                "templates with [[tensor_map]] are encoded (cuTensorMapEncodeTiled) and launched "
                f"(cuLaunchKernel) through cuda-bindings, which is not importable: {e}; pip install cuda-bindings"
            ) from None
        self.cu = driver
        self._checked_params: set = set()

    def check(self, result, what: str):
        """result: a cuda.bindings return tuple (CUresult, values...). Returns the values."""
        err, *values = result if isinstance(result, tuple) else (result,)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            name = self.cu.cuGetErrorName(err)[1] or b"?"
            text = self.cu.cuGetErrorString(err)[1] or b""
            raise RuntimeError(f"{what}: {name.decode(errors='replace')}: {text.decode(errors='replace')}")
        return values[0] if len(values) == 1 else tuple(values)

    def encode_tensor_map(self, m: dict, address: int) -> TensorMapArg:
        """cuTensorMapEncodeTiled for the resolved map `m` (see tensor_map_geometry) over the
        tensor at device address `address`: UINT16 elements, no interleave, m's swizzle,
        L2 promotion 128B, OOB fill NONE (rows past S read as zeros)."""
        cu = self.cu
        if address % 16:
            raise ValueError(f"tensor {m['tensor']} at {address:#x}: the TMA needs a 16-byte aligned address")
        swizzle = {32: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
                   64: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
                   128: cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}[m["swizzle"]]
        tmap = self.check(
            cu.cuTensorMapEncodeTiled(
                cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16, len(m["dims"]), address,
                [cu.cuuint64_t(x) for x in m["dims"]],
                [cu.cuuint64_t(x) for x in m["strides_bytes"]],
                [cu.cuuint32_t(x) for x in m["box"]],
                [cu.cuuint32_t(x) for x in m["element_strides"]],
                cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            ),
            f"cuTensorMapEncodeTiled({describe_tensor_map(m)}, address {address:#x})",
        )
        return TensorMapArg(tmap.getPtr())

    def check_params(self, func: int, name: str, params: KernelParams) -> None:
        """Once per kernel: its parameter sizes (cuFuncGetParamInfo) must be those we pass, so a
        spec whose [[tensor_map]] list disagrees with the kernel's signature fails here, in words."""
        key = (func, tuple(params.sizes()))
        if key in self._checked_params:
            return
        cu, sizes = self.cu, []
        while len(sizes) <= len(params.values):
            err, _offset, size = cu.cuFuncGetParamInfo(func, len(sizes))
            if err == cu.CUresult.CUDA_ERROR_INVALID_VALUE:  # past the last parameter
                break
            if err != cu.CUresult.CUDA_SUCCESS:  # cannot tell (e.g. an old driver): launch unchecked
                self._checked_params.add(key)
                return
            sizes.append(size)
        if sizes != params.sizes():
            raise RuntimeError(
                f"{name} takes {len(sizes)} parameters of {sizes} bytes, but the launch passes {len(params.values)} "
                f"of {params.sizes()} bytes ({ABI_PARAMS} ABI parameters, then one 128-byte CUtensorMap per [[tensor_map]] of "
                f"the spec): the kernel's signature and the spec's [[tensor_map]] entries disagree")
        self._checked_params.add(key)

    def launch(self, func: int, name: str, grid, block, smem: int, stream: int, params: KernelParams) -> None:
        self.check_params(func, name, params)
        self.check(self.cu.cuLaunchKernel(func, *grid, *block, smem, stream, params.address, 0),
                   f"cuLaunchKernel({name}, grid {tuple(grid)}, block {tuple(block)}, smem {smem}, stream {stream:#x})")


# ---------------------------------------------------------------------------
# GPU side
# ---------------------------------------------------------------------------
def cuda_include_opts() -> tuple[str, ...]:
    cands = [os.environ.get("OPTIMIZERD_CUDA_INCLUDE", "")]
    if os.environ.get("CUDA_PATH"):
        cands.append(os.path.join(os.environ["CUDA_PATH"], "include"))
    cands += ["/usr/local/cuda/include", str(ROOT / ".deps/cuda/nvidia/cu13/include")]
    for c in cands:
        if c and os.path.exists(os.path.join(c, "cuda_bf16.h")):
            return (f"-I{c}",)
    return ()


def build_source(tpl: Template, knobs: dict, bf16: bool, mbar_fault: bool = False) -> str:
    """The source of one build: the daemon's rendering, with `#define OPTD_FAULT_MBAR_PHASE 1`
    first for the planted-fault build (--faults) of a Hopper template."""
    source = render(tpl, knobs, bf16)
    return f"#define {MBAR_FAULT_MACRO} 1\n{source}" if mbar_fault else source


@dataclass
class Kernel:
    """One planned launch of a loaded module, ready to go (Gpu.prepare)."""
    name: str
    grid: tuple
    block: tuple
    smem: int
    fn: object  # cupy RawKernel; fn.kernel.ptr is its CUfunction handle


@dataclass
class LaunchArgs:
    """The arguments of every launch of one plan on one set of buffers: cuLaunchKernel's
    kernelParams (the 17 ABI values, the strides struct by value among them, then one
    CUtensorMap per [[tensor_map]]). Every launch goes through the driver API: CuPy's
    RawKernel call cannot pass a struct by value."""
    params: KernelParams


class Gpu:
    def __init__(self) -> None:
        import cupy as cp
        import torch
        import torch.nn.functional as F

        self.cp, self.torch, self.F = cp, torch, F
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        props = torch.cuda.get_device_properties(0)
        rt = cp.cuda.runtime
        self.dev = dict(
            SMS=props.multi_processor_count,
            SMEM_OPTIN=rt.deviceGetAttribute(rt.cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
            CC=props.major * 10 + props.minor,
        )
        self.name = props.name
        self.include = cuda_include_opts()
        self.modules: dict = {}
        self.compile_s = 0.0
        self.counter = cp.zeros(1, dtype=cp.uint32)
        self._inputs: dict = {}
        self.last_errors = (0.0, 0.0, 1)
        self.timing_method = "graph"
        self.cubin_dir: Path | None = None
        # --cubins-only: a cubin missing from cubin_dir, or one the driver refuses, is an error
        # instead of an in-process compile (an A/B of two compilers must not fall back to a third).
        self.cubins_only = False
        self.cubins_loaded = 0
        self._driver: Driver | None = None

    @property
    def driver(self) -> Driver:
        """cuda.bindings, imported on first use: only templates with tensor maps need it."""
        if self._driver is None:
            self._driver = Driver()
        return self._driver

    def arch(self, tpl: Template) -> str:
        """The template's target on this GPU (sm_90, sm_90a); raises Unsupported, saying why."""
        return device_arch(tpl, self.dev["CC"])

    # -- compilation --------------------------------------------------------
    def module(self, tpl: Template, knobs: dict, bf16: bool, count: bool, mbar_fault: bool = False):
        """The loaded module of one build: the cubin from --cubin-dir when it has one, else
        compiled here with cupy.RawModule (NVRTC). mbar_fault: the planted-fault build."""
        arch = self.arch(tpl)
        used = code_knobs(tpl)
        knobs = tpl.complete(knobs)  # as render() builds it
        # The path, not rel: --time-against loads a second copy of the same template.
        key = (str(tpl.path), tuple((k, knobs[k]) for k in used), bf16, count, mbar_fault)
        if key not in self.modules:
            source = build_source(tpl, knobs, bf16, mbar_fault)
            opts = ("-std=c++17",) + self.include + (("-DOPTD_COUNT_CTAS=1",) if count else ())
            if tpl.arch_specific:
                # CuPy appends -arch=sm_<cc>; NVRTC 13 keeps the arch-specific sm_<cc>a over it.
                opts += (f"--gpu-architecture={arch}",)
            t0 = time.perf_counter()
            cubin = None
            if self.cubin_dir is not None:
                cubin = self.cubin_dir / cubin_name(source, count, arch)
            mod = None
            if cubin is not None and cubin.exists():
                try:
                    mod = self.cp.RawModule(path=str(cubin))
                    for kname in tpl.kernel_names():
                        mod.get_function(kname)
                    self.cubins_loaded += 1
                except Exception as e:  # noqa: BLE001 - e.g. a driver older than the cubin: compile here
                    if self.cubins_only:
                        raise RuntimeError(f"--cubins-only: the driver refuses {cubin} ({type(e).__name__}: {e})") from e
                    print(f"  cubin {cubin.name} not loadable ({type(e).__name__}: {e}); compiling")
                    mod = None
            elif self.cubins_only:
                raise RuntimeError(f"--cubins-only: {tpl.rel} ({combo_label(knobs)}, bf16={bf16}, count={count}) has no "
                                   f"cubin {cubin.name if cubin else '(no --cubin-dir)'} in {self.cubin_dir}: build it "
                                   f"on the CPU machine with --build-cubins")
            if mod is None:
                try:
                    mod = self.cp.RawModule(code=source, options=opts, backend="nvrtc")
                    for kname in tpl.kernel_names():
                        mod.get_function(kname)  # compiles and loads now, so errors surface here
                except Exception as e:  # noqa: BLE001 - re-raised with the way around it
                    if not tpl.arch_specific:
                        raise
                    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                    raise RuntimeError(
                        f"{tpl.rel}: in-process NVRTC compile for {arch} failed ({first}); build its cubins on the "
                        f"CPU machine (--build-cubins DIR) and pass --cubin-dir DIR here") from e
            self.compile_s += time.perf_counter() - t0
            self.modules[key] = mod
        return self.modules[key]

    # -- data ---------------------------------------------------------------
    def inputs(self, shape: Shape, dtype: str, need_ref: bool = True):
        """(q, k, v as logical torch elem tensors [B,HQ,SQ,D] / [B,HKV,SK,D], fp32 reference
        [B,HQ,SQ,D]), cached per shape and dtype. need_ref=False (timing only) skips the
        reference (None) until one is asked for. The reference is computed per KV group with
        K/V repeated for the group's query heads and the bottom-right causal mask (with the
        shape's sliding window: visible_mask)."""
        key = (shape, dtype)
        if key not in self._inputs:
            torch = self.torch
            # Seeded by the shape as written before it had a window, so unwindowed shapes keep their inputs.
            seed = repr(key) if shape.w else repr(key).replace(f", window={shape.window!r}", "")
            gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(seed.encode()))
            tdt = torch.float16 if dtype == "fp16" else torch.bfloat16
            q = torch.randn(shape.b, shape.hq, shape.sq, shape.d, device="cuda", generator=gen).to(tdt)
            k, v = (torch.randn(shape.b, shape.hkv, shape.sk, shape.d, device="cuda", generator=gen).to(tdt)
                    for _ in range(2))
            self._inputs[key] = (q, k, v, None)
        q, k, v, ref = self._inputs[key]
        if ref is None and need_ref:
            torch = self.torch
            kf = k.float().repeat_interleave(shape.group, dim=1)
            vf = v.float().repeat_interleave(shape.group, dim=1)
            mask = visible_mask(shape, torch, "cuda")
            ref = self.F.scaled_dot_product_attention(q.float(), kf, vf, attn_mask=mask)
            self._inputs[key] = (q, k, v, ref)
        return self._inputs[key]

    def view(self, shape: Shape, tensor: str, storage):
        """The logical [B, heads, rows, D] view of `tensor` inside its flat `storage`."""
        heads, rows = shape.dims_of(tensor)
        sb, sh, ss = shape.strides(tensor)
        return storage.as_strided((shape.b, heads, rows, shape.d), (sb, sh, ss, 1))

    def place(self, shape: Shape, tensor: str, logical, fill=float("nan")):
        """Flat storage laid out by the shape's strides, `logical` copied into its view, every
        other element `fill` (NaN: a kernel that reads a padded view's gaps produces NaN)."""
        storage = self.torch.full((shape.extent(tensor),), fill, device="cuda", dtype=logical.dtype)
        self.view(shape, tensor, storage).copy_(logical)
        return storage

    def buffers(self, shape: Shape, splits: int, dtype: str, fill=float("nan"), need_ref: bool = True):
        """(q, k, v, o as flat strided storage, o_part, lse, fp32 reference). lse holds
        (splits + 1) * rows words: the split LSEs (filled with `fill`), then the split
        semaphores, which the ABI requires zero before a plan's launches."""
        torch = self.torch
        q, k, v, ref = self.inputs(shape, dtype, need_ref)
        qs, ks, vs = (self.place(shape, name, x) for name, x in (("q", q), ("k", k), ("v", v)))
        o = torch.full((shape.extent("o"),), fill, device="cuda", dtype=q.dtype)
        rows = shape.b * shape.hq * shape.sq
        o_part = torch.full((max(1, splits * rows * shape.d),), fill, device="cuda", dtype=torch.float32)
        lse = torch.full((max(1, (splits + 1) * rows),), fill, device="cuda", dtype=torch.float32)
        lse[splits * rows:].zero_()
        return qs, ks, vs, o, o_part, lse, ref

    def kernel(self, mod, launch):
        """The RawKernel of one planned launch, allowed its dynamic shared memory."""
        fn = mod.get_function(launch["kernel"])
        if launch["smem"] > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = launch["smem"]
        return fn

    # -- launching: every path (check, timing and its graph, --sdpa, --faults) ----
    def prepare(self, mod, launch: dict) -> Kernel:
        return Kernel(launch["kernel"], launch["grid"], launch["block"], launch["smem"], self.kernel(mod, launch))

    def launch_args(self, shape: Shape, splits: int, launches: list[dict], q, k, v, o, o_part, lse,
                    abi: int = 3) -> LaunchArgs:
        """The arguments of these launches on these buffers (flat storage laid out by the
        shape's strides); tensor maps are encoded here, on the very q/k/v/o buffers the
        launches use (so the maps go stale with the buffers). abi: the templates' kernel ABI
        (template_abi)."""
        maps = launches[0]["tensor_maps"] if launches else []
        tensors = dict(q=q, k=k, v=v, o=o)
        values = abi_values(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), o_part.data_ptr(),
                            lse.data_ptr(), shape, splits, self.counter.data.ptr, abi)
        for m in maps:
            t = tensors[m["tensor"]]
            if t.numel() != shape.extent(m["tensor"]) or t.element_size() != ELEM_BYTES:
                raise ValueError(f"tensor map on {m['tensor']}: needs the flat storage of {shape_key(shape)}'s "
                                 f"{m['tensor']} ({shape.extent(m['tensor'])} 2-byte elements), got {t.numel()} "
                                 f"{t.dtype}")
            values.append(self.driver.encode_tensor_map(m, t.data_ptr()))
        return LaunchArgs(KernelParams(values))

    def launch(self, kernel: Kernel, args: LaunchArgs) -> None:
        """Launch on the current CuPy stream (a capturing stream records it in its graph)
        through cuLaunchKernel."""
        stream = self.cp.cuda.get_current_stream().ptr
        self.driver.launch(kernel.fn.kernel.ptr, kernel.name, kernel.grid, kernel.block, kernel.smem, stream,
                           args.params)

    # -- correctness --------------------------------------------------------
    def check(self, tpl: Template, knobs: dict, shape: Shape, dtype: str, mbar_fault: bool = False) -> tuple[bool, str]:
        torch = self.torch
        mod = self.module(tpl, knobs, dtype == "bf16", count=True, mbar_fault=mbar_fault)
        splits, launches, _ = plan(tpl, knobs, shape, self.dev)
        q, k, v, o, o_part, lse, ref = self.buffers(shape, splits, dtype)
        args = self.launch_args(shape, splits, launches, q, k, v, o, o_part, lse, template_abi(tpl))
        torch.cuda.synchronize()
        for launch in launches:
            self.counter.fill(0)
            self.launch(self.prepare(mod, launch), args)
            self.cp.cuda.Device().synchronize()
            ran, planned = int(self.counter.get()[0]), math.prod(launch["grid"])
            if ran != planned:
                return False, f"{launch['kernel']}: {ran} CTAs counted, {planned} planned"
        sem_error = semaphore_error(lse, splits, shape.b * shape.hq * shape.sq)
        if sem_error:
            return False, sem_error
        out = self.view(shape, "o", o).float()
        bad = int((~torch.isfinite(out)).sum())
        if bad:
            return False, f"{bad} non-finite outputs (splits {splits})"
        if shape.padded or shape.layout != "bhsd":
            # Everything outside O's view must still hold the fill.
            outside = o.float().clone()
            self.view(shape, "o", outside).fill_(float("nan"))
            written = int(torch.isfinite(outside).sum())
            if written:
                return False, f"{written} elements of O's buffer outside its view were written"
        err = (out - ref).abs()
        max_abs = float(err.max())
        rel_l2 = float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))
        ok = max_abs <= ATOL[dtype] and rel_l2 <= RTOL_L2
        self.last_errors = (max_abs, rel_l2, splits)
        return ok, f"max_abs {max_abs:.2e} rel_l2 {rel_l2:.2e} splits {splits}"

    # -- timing -------------------------------------------------------------
    def time_us(self, tpl: Template, knobs: dict, shape, reps: int = 20, samples: int = 50,
                keep_output: bool = False, sustain_ms: float = 0.0) -> float:
        """Median microseconds of one execution of the plan (all its launches).
        keep_output: leave O in self.last_output (for a check against SDPA). sustain_ms > 0: the
        samples run back to back for at least that long (sustained_samples), no host sync between."""
        cp = self.cp
        mod = self.module(tpl, knobs, False, count=False)
        splits, launches, _ = plan(tpl, knobs, shape, self.dev)
        q, k, v, o, o_part, lse, _ = self.buffers(shape, splits, "fp16", fill=0.0, need_ref=False)
        if keep_output:
            self.last_output = self.view(shape, "o", o)
        args = self.launch_args(shape, splits, launches, q, k, v, o, o_part, lse, template_abi(tpl))
        kernels = [self.prepare(mod, l) for l in launches]
        self.torch.cuda.synchronize()
        stream = cp.cuda.Stream(non_blocking=True)

        def run_once():
            for kernel in kernels:
                self.launch(kernel, args)

        graph = None
        with stream:
            run_once()  # warm the module before capture
            stream.synchronize()
            try:
                # A graph of `reps` back-to-back executions hides the Python launch cost.
                stream.begin_capture()
                for _ in range(reps):
                    run_once()
                graph = stream.end_capture()
                graph.upload(stream)
            except Exception:  # noqa: BLE001 - fall back to plain launches
                graph = None
                self.timing_method = "plain launches (graph capture failed)"
                try:
                    if stream.is_capturing():
                        stream.end_capture()
                except Exception:  # noqa: BLE001
                    pass

            def sample():
                if graph is not None:
                    graph.launch(stream)
                else:
                    for _ in range(reps):
                        run_once()

            for _ in range(3):
                sample()
            times = []
            if sustain_ms > 0:
                ev = [cp.cuda.Event(), cp.cuda.Event()]
                ev[0].record(stream)
                sample()
                ev[1].record(stream)
                ev[1].synchronize()
                n = sustained_samples(sustain_ms, cp.cuda.get_elapsed_time(ev[0], ev[1]) * 1000.0, samples)
                ev = [cp.cuda.Event() for _ in range(n + 1)]
                ev[0].record(stream)
                for i in range(n):
                    sample()
                    ev[i + 1].record(stream)
                ev[-1].synchronize()
                times = [cp.cuda.get_elapsed_time(a, b) * 1000.0 / reps for a, b in zip(ev, ev[1:])]
                return statistics.median(times)
            for _ in range(samples):
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(stream)
                sample()
                end.record(stream)
                end.synchronize()
                times.append(cp.cuda.get_elapsed_time(start, end) * 1000.0 / reps)
        return statistics.median(times)


# ---------------------------------------------------------------------------
# Precompiled cubins (--build-cubins here, --cubin-dir on the GPU machine)
# ---------------------------------------------------------------------------
def cubin_name(source: str, count: bool, arch: str) -> str:
    h = hashlib.sha1(source.encode()).hexdigest()[:20]
    return f"{h}-{'count' if count else 'timed'}-{arch}.cubin"


def fault_builds(tpl: Template) -> list[tuple[dict, bool]]:
    """(knobs, mbar_fault) of the --faults builds of `tpl` (fp16, check build; see
    fault_cases): a testing template's, and a real template's planted-fault build when it has
    tensor maps and uses OPTD_FAULT_MBAR_PHASE."""
    if tpl.testing:
        return [(knobs, False) for knobs in fault_combos(tpl)]
    if tpl.tensor_maps and names_mbar_fault(tpl):
        return [(knobs, True) for knobs in fault_combos(tpl)]
    return []


def build_cubins(templates: list[Template], out_dir: Path, arch: str, jobs: int, pairs=None, check: bool = True,
                 time_best: bool = False, against: list[Template] | None = None, points: str = "best") -> int:
    """Compile (CPU, NVRTC from .deps) every module a GPU run of these templates loads: check
    and timed builds of every (code-distinct) combination of the real templates (not with
    check=False: --no-check), the --faults builds, and with time_best the timed builds of
    BEST_POINTS (and of the same points in `against`: --time-against). Arch-specific templates
    are built for sm_<min_cc>a, the others for `arch`. Cubins already in out_dir (same name:
    same source, build and target) are kept."""
    from nvrtc_compile_check import Job

    out_dir.mkdir(parents=True, exist_ok=True)
    todo: dict[str, Job] = {}
    for tpl in templates:
        target = arch_targets(tpl, [arch])[0]
        builds = []  # (knobs, bf16, count, mbar_fault)
        if not tpl.testing and check:
            used = code_knobs(tpl)
            seen = set()
            for knobs in combos_for(tpl, pairs):
                ukey = tuple((k, knobs[k]) for k in used)
                if ukey not in seen:
                    seen.add(ukey)
                    builds += [(knobs, bf16, count, False) for bf16 in (False, True) for count in (False, True)]
        builds += [(knobs, False, True, mbar_fault) for knobs, mbar_fault in fault_builds(tpl)]
        for knobs, bf16, count, mbar_fault in builds:
            src = build_source(tpl, knobs, bf16, mbar_fault)
            todo[cubin_name(src, count, target)] = Job(tpl.rel, knobs, bf16, target, count, src, tpl.kernel_names())
        if tpl.arch_specific:
            print(f"  {tpl.rel}: arch-specific, built for {target} (not --arch {arch})")
    n_check = len(todo)
    timed: set[str] = set()
    if time_best:
        old = {t.rel: t for t in against or []}
        for tpl, knobs, _, own in best_points(templates, points):
            for t, kn in ((tpl, knobs), (old.get(tpl.rel), None)):
                if t is not None:
                    kn = kn or t.complete(own)
                    src = build_source(t, kn, False)
                    target = arch_targets(t, [arch])[0]
                    name = cubin_name(src, False, target)
                    timed.add(name)
                    todo[name] = Job(t.rel, kn, False, target, False, src, t.kernel_names())
    if time_best and check and n_check:
        # Session 32 spent 10 minutes of CPU here on check builds it never carried: a GPU run
        # with --time-best and without --no-check checks every combination first, so this
        # builds them too; say so before the long part starts.
        print(f"  note: {n_check} of these {len(todo)} modules are the check and fault builds of every "
              f"combination of {len(templates)} template(s), which a --time-best run without --no-check "
              f"checks first; --no-check builds only the --points set's {len(timed)} timed modules, "
              f"--template narrows the checks", flush=True)
    kept = [n for n in todo if (out_dir / n).exists()]
    for name in kept:
        del todo[name]
    t0 = time.perf_counter()
    bad = compile_cubins(todo, out_dir, jobs)
    targets = sorted({j.arch for j in todo.values()} | {n.rsplit("-", 1)[1][:-len(".cubin")] for n in kept})
    print(f"built {len(todo) - bad} cubins for {', '.join(targets) or arch} in {out_dir} "
          f"({time.perf_counter() - t0:.1f} s), {len(kept)} already there, {bad} failures")
    return 1 if bad else 0


def compile_cubins(todo: dict, out_dir: Path, jobs: int) -> int:
    """Compile `todo` (cubin file name -> nvrtc_compile_check.Job) with the NVRTC of
    OPTIMIZERD_NVRTC_LIB / .deps in `jobs` processes into out_dir; prints each failure and
    returns their count."""
    import concurrent.futures as cf
    from nvrtc_compile_check import _init_worker, default_cuda_include, default_nvrtc_lib

    out_dir.mkdir(parents=True, exist_ok=True)
    bad = 0
    with cf.ProcessPoolExecutor(jobs, initializer=_init_worker,
                                initargs=(default_nvrtc_lib(), default_cuda_include())) as pool:
        names = list(todo)
        for name, (ok, reason, cubin) in zip(names, pool.map(_cubin_job, [todo[n] for n in names])):
            if ok:
                (out_dir / name).write_bytes(cubin)
            else:
                bad += 1
                j = todo[name]
                print(f"  FAIL {j.template} {combo_label(j.knobs)} bf16={j.bf16} count={j.count_ctas} {j.arch}: "
                      f"{reason}")
    return bad


def _cubin_job(job):
    import nvrtc_compile_check as ncc

    opts = [f"--gpu-architecture={job.arch}", "-std=c++17", f"--include-path={ncc._INCLUDE}"]
    if job.count_ctas:
        opts.append("-DOPTD_COUNT_CTAS=1")
    try:
        ok, log, cubin = ncc._NVRTC.compile(job.source, job.template.replace("/", "_"), opts)
    except Exception as e:  # noqa: BLE001
        return False, f"nvrtc: {e}", b""
    return ok, "" if ok else log[-2000:], cubin


# ---------------------------------------------------------------------------
# --sdpa: templates against torch's scaled_dot_product_attention
# ---------------------------------------------------------------------------
def attn_flops(shape: Shape) -> float:
    """4 * B * HQ * D per visible (query, key) pair (causal: the unmasked part)."""
    return 4.0 * shape.b * shape.hq * shape.d * shape.visible_pairs()


def sdpa_fn(gpu: "Gpu", shape: Shape, q, k, v):
    """SDPA (default backend) on the logical q, k, v of `shape`: enable_gqa for grouped
    heads, the bottom-right causal mask when 1 < SQ < SK (is_causal when SQ == SK), and no
    mask for SQ = 1, which that mask would not hide a key of (as scripts/sdpa_baseline.py, the
    daemon's baseline: a mask tensor sends SDPA to a slower backend, 19.7 us against 13.2 at
    B 1 x SK 4096 on the H100, 2026-11-28, which no model pays for a decode step). A sliding
    window that masks something (W < SK) is a boolean [SQ, SK] mask (visible_mask), as the
    baseline passes it (SDPA has no window argument)."""
    F = gpu.F
    extra = dict(enable_gqa=True) if shape.hq != shape.hkv else {}
    if shape.causal and 0 < shape.w < shape.sk:
        mask = visible_mask(shape, gpu.torch, "cuda")
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **extra)
    if shape.causal and shape.sq == 1:
        return lambda: F.scaled_dot_product_attention(q, k, v, **extra)
    if shape.causal and shape.sq != shape.sk:
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(shape.sq, shape.sk)
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **extra)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal, **extra)


def time_torch_us(gpu: "Gpu", fn, reps: int, samples: int) -> float:
    torch = gpu.torch
    fn()
    torch.cuda.synchronize()
    for _ in range(3):
        fn()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / reps)
    return statistics.median(times)


def sdpa_compare(gpu: "Gpu", templates: list[Template], reps: int = 5, samples: int = 15) -> list[str]:
    """Times every combo of each template and SDPA; returns the closing table's lines."""
    torch, F = gpu.torch, gpu.F
    backends = [("sdpa default", None)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends += [("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)]
    except ImportError:
        sdpa_kernel = None
    table = []
    print(f"\nsdpa comparison (fp16, CUDA events, median of {samples} samples of {reps} back-to-back runs), {gpu.name}")
    for tpl in (t for t in templates if not t.testing):
        try:
            gpu.arch(tpl)
        except Unsupported as e:
            print(f"  {tpl.rel}: skipped: {e}")
            continue
        combos = tpl.knob_combos()
        per_shape: dict = {}
        for shape in SDPA_SHAPES:
            q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
            causal = shape.causal
            sd = {}
            ref_out = None
            for label, be in backends:
                def call(be=be):
                    if be is None:
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    with sdpa_kernel(be):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                try:
                    sd[label] = time_torch_us(gpu, call, reps, samples)
                    if ref_out is None:
                        ref_out = call()
                except Exception as e:  # noqa: BLE001 - a backend may not support the shape
                    sd[label] = float("nan")
                    print(f"  {label} failed on {shape_key(shape)}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            rows = []
            for knobs in combos:
                try:
                    _, launches, _ = plan(tpl, knobs, shape, gpu.dev)
                    rows.append((gpu.time_us(tpl, knobs, shape, reps=reps, samples=samples), knobs))
                except Exception as e:  # noqa: BLE001
                    rows.append((float("nan"), knobs))
                    print(f"  {tpl.name} {combo_label(knobs)} {shape_key(shape)}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120] if str(e) else ''}")
            ok_rows = [r for r in rows if r[0] == r[0]]
            if not ok_rows:
                continue
            t_best, best = min(ok_rows, key=lambda r: r[0])
            # The best combo's own output against SDPA's (fp16 vs fp16).
            diff = float("nan")
            try:
                gpu.time_us(tpl, best, shape, reps=1, samples=1, keep_output=True)
                torch.cuda.synchronize()
                if ref_out is not None:
                    diff = float((gpu.last_output.float() - ref_out.float()).abs().max())
            except Exception as e:  # noqa: BLE001
                print(f"  output check failed: {e}")
            per_shape[shape] = (rows, t_best, best, sd, diff)
        if not per_shape:
            continue
        fl = {s: attn_flops(s) for s in per_shape}
        print(f"\n== {tpl.rel}: TFLOPS per combination (fp16)")
        print(f"{'knobs':44} " + " ".join(f"{shape_key(s):>22}" for s in per_shape))
        for i, knobs in enumerate(combos):
            cells = []
            for s, (rows, *_rest) in per_shape.items():
                t = rows[i][0]
                cells.append(f"{fl[s] / t / 1e6:22.1f}" if t == t else f"{'n/a':>22}")
            print(f"{combo_label(knobs):44} " + " ".join(cells))
        default = combos[0]
        table.append(f"{tpl.name}: fp16 TFLOPS (us), {gpu.name}")
        table.append(f"{'shape':22} {'best':>14} {'default':>14} " + " ".join(f"{l:>14}" for l, _ in backends)
                     + f" {'best/dflt':>9} {'max|O-sdpa|':>11}  best knobs")
        for s, (rows, t_best, best, sd, diff) in per_shape.items():
            t_def = rows[0][0]
            cell = lambda t: f"{fl[s] / t / 1e6:6.1f} ({t:6.0f})" if t == t else f"{'n/a':>14}"
            ratio = t_best / sd["sdpa default"] if sd.get("sdpa default") == sd.get("sdpa default") else float("nan")
            table.append(f"{shape_key(s):22} {cell(t_best):>14} {cell(t_def):>14} "
                         + " ".join(f"{cell(sd[l]):>14}" for l, _ in backends)
                         + f" {1 / ratio:9.2f} {diff:11.2e}  {combo_label(best)}")
        table.append(f"'default' = first value of every knob ({combo_label(default)}); "
                     f"best/dflt = SDPA default time / best time")
    return table


# Knob values a template builds that its spec does not list yet: written and compiled, not yet
# run on a GPU, so the daemon's search never tries them; point sets may (to check and time
# them first). Each joins its spec's list once checked on the GPU.
EXPERIMENTAL_VALUES: dict = {}


def knob_values(tpl: Template, knob: str) -> list:
    """The values of `knob` a point set may give `tpl`: its spec's, and EXPERIMENTAL_VALUES."""
    return list(tpl.spec["knobs"][knob]) + EXPERIMENTAL_VALUES.get(tpl.rel, {}).get(knob, [])


def best_points(templates: list[Template], points: str = "best") -> list[tuple[Template, dict, tuple, dict]]:
    """POINT_SETS[points] (BEST_POINTS or RAGGED_POINTS) resolved against `templates` (knobs
    checked against each spec): one (template, knobs, shape, the point's own knobs) per timed row.
    The point's own knobs complete a --time-against copy with that copy's first values, so a copy
    that differs only in a knob's first value times the other value of it."""
    by_rel = {t.rel: t for t in templates}
    rows = []
    for rel, knobs, shapes in POINT_SETS[points]:
        tpl = by_rel.get(rel)
        if tpl is None:
            raise SystemExit(f"--time-best: {rel} is not among the selected templates")
        full = tpl.complete(knobs)
        if set(full) != set(tpl.spec["knobs"]) or any(v not in knob_values(tpl, k) for k, v in full.items()):
            raise SystemExit(f"--time-best: {rel} {combo_label(knobs)} is not a point of its knob space")
        rows += [(tpl, full, shape, knobs) for shape in shapes]
    return rows


def sustained_samples(sustain_ms: float, sample_us: float, minimum: int) -> int:
    """Samples of `sample_us` each (one graph replay) that, run back to back, last at least
    `sustain_ms` (and at least `minimum`): the guide's sustained timing, where a short burst runs
    at boost clocks and 200 ms back to back does not (12-18% slower on the H100, issue 19)."""
    if sustain_ms <= 0:
        return minimum
    return max(minimum, math.ceil(sustain_ms * 1000.0 / max(sample_us, 1e-3)))


def time_torch_graph_us(gpu: "Gpu", fn, reps: int, samples: int, sustain_ms: float = 0.0) -> float:
    """Median microseconds of one call of `fn`, timed as time_us times a kernel: a CUDA graph
    of `reps` back-to-back calls, CUDA events around each replay."""
    torch = gpu.torch
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(reps):
                fn()
        for _ in range(3):
            graph.replay()
        if sustain_ms > 0:  # as Gpu.time_us: back to back for sustain_ms, one sync at the end
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            ev[0].record(stream)
            graph.replay()
            ev[1].record(stream)
            ev[1].synchronize()
            n = sustained_samples(sustain_ms, ev[0].elapsed_time(ev[1]) * 1000.0, samples)
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
            ev[0].record(stream)
            for i in range(n):
                graph.replay()
                ev[i + 1].record(stream)
            ev[-1].synchronize()
            return statistics.median(a.elapsed_time(b) * 1000.0 / reps for a, b in zip(ev, ev[1:]))
    return replay_graph_us(gpu, stream, graph, reps, samples)


def replay_graph_us(gpu: "Gpu", stream, graph, reps: int, samples: int) -> float:
    """Median microseconds per call of a torch CUDA graph of `reps` calls, replayed `samples`
    times on `stream` with CUDA events around each replay."""
    torch = gpu.torch
    times = []
    with torch.cuda.stream(stream):
        for _ in range(samples):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            graph.replay()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0 / reps)
    return statistics.median(times)


@dataclass
class PairedRatio:
    median: float  # median over rounds of new / old
    p25: float
    p75: float
    won: int       # rounds where new was faster
    rounds: int


def paired_ratio(new: list[float], old: list[float]) -> PairedRatio:
    """Each round's new / old, summarised. The two are timed back to back within a round, so a
    clock change between rounds (boost, power, temperature: rounds spread 5-20% on the H100's
    long loops, docs/HOPPER.md) scales both and cancels in the round's ratio, while the two
    medians over rounds may come from different rounds, at different clocks."""
    if len(new) != len(old) or not new:
        raise ValueError(f"paired_ratio: {len(new)} new and {len(old)} old rounds")
    r = sorted(n / o for n, o in zip(new, old))
    q = statistics.quantiles(r, n=4, method="inclusive") if len(r) > 1 else [r[0]] * 3
    return PairedRatio(statistics.median(r), q[0], q[2], sum(n < o for n, o in zip(new, old)), len(r))


def time_best(gpu: "Gpu", templates: list[Template], against: list[Template] | None, rounds: int,
              points: str = "best", sustain_ms: float = 0.0) -> list[str]:
    """Times POINT_SETS[points] (fp16), SDPA default and, where it imports, FA4 on the same
    shapes, `rounds` rounds; with `against` (the same templates from another folder, e.g. an
    earlier commit) each point is also timed in that version, the two alternating first within
    a round, so both are measured at the same clocks (the table adds `paired`, the median of the
    rounds' own new/old, its quartiles and the rounds new won: paired_ratio). A graph holds
    enough launches for about 2 ms (at least 3, at most 50); each measurement is the median of
    20 replays (sustain_ms > 0: of the replays run back to back for at least that long, e.g. 200,
    the guide's sustained timing); a row gives the
    median over rounds and the rounds' spread (max / min - 1). A point over the device's shared
    memory is listed as not fitting. Where a shape has several points, a summary gives the
    fastest against SDPA, FA4 and the faster of the two. Returns the table's lines."""
    rows = best_points(templates, points)
    old = {t.rel: t for t in against or []}
    versions = ["new", "old"] if against else ["new"]
    fa4_func, fa4_note = load_fa4()
    print(f"FA4: {fa4_note}", flush=True)
    per_round = (f"median of the replays of {sustain_ms:g} ms back to back per round" if sustain_ms > 0
                 else "median of 20 replays per round")
    lines = [f"best kernels (fp16, {rounds} rounds, graph of back-to-back launches, {per_round}), {gpu.name}"]
    if against:
        lines.append(f"new = {templates[0].root}, old = {against[0].root}")
    head = f"{'shape':22} {'template':12} {'new us':>9} {'spread':>6}"
    if against:
        head += f" {'old us':>9} {'spread':>6} {'new/old':>7} {'paired':>7} {'p25..p75':>13} {'won':>5}"
    head += f" {'sdpa us':>9} {'fa4 us':>9} {'TFLOPS':>7}  knobs"
    lines.insert(1, f"sdpa = SDPA default, fa4 = {fa4_note}")
    lines.append(head)
    ratios = []
    paired_medians = []
    per_shape: dict[str, dict[str, float]] = {}
    for tpl, knobs, shape, own in rows:
        q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
        variants = {"new": tpl, "old": old.get(tpl.rel)}
        if against and variants["old"] is None:
            raise SystemExit(f"--time-against: {tpl.rel} is missing there")
        knobs_of = {"new": knobs, "old": variants["old"].complete(own) if against else None}
        try:
            probe = gpu.time_us(tpl, knobs, shape, reps=3, samples=3)
        except DoesNotFit as e:  # e.g. BLOCK_N 192 with 3 consumers at D 128: as the gate does
            lines.append(f"{shape_key(shape):22} {Path(tpl.rel).stem:12} does not fit ({e}): {combo_label(knobs)}")
            continue
        reps = max(3, min(50, round(2000.0 / max(probe, 1e-3))))
        times: dict[str, list[float]] = {name: [] for name in versions + ["sdpa"] + (["fa4"] if fa4_func else [])}
        fa4_call = fa4_fn(gpu, fa4_func, shape, q, k, v) if fa4_func else None
        for r in range(rounds):
            for name in (versions if r % 2 == 0 else versions[::-1]):
                times[name].append(gpu.time_us(variants[name], knobs_of[name], shape, reps=reps, samples=20,
                                               sustain_ms=sustain_ms))
            times["sdpa"].append(time_torch_graph_us(
                gpu, sdpa_fn(gpu, shape, q, k, v), reps, 20, sustain_ms))
            if fa4_call:
                times["fa4"].append(time_torch_graph_us(gpu, fa4_call, reps, 20, sustain_ms))
        med = {name: statistics.median(ts) for name, ts in times.items()}
        spread = {name: max(ts) / min(ts) - 1 for name, ts in times.items()}
        line = f"{shape_key(shape):22} {Path(tpl.rel).stem:12} {med['new']:9.2f} {spread['new']:6.1%}"
        if against:
            ratios.append(med["new"] / med["old"])
            pr = paired_ratio(times["new"], times["old"])
            paired_medians.append(pr.median)
            line += (f" {med['old']:9.2f} {spread['old']:6.1%} {ratios[-1]:7.3f} {pr.median:7.3f}"
                     f" {pr.p25:6.3f}..{pr.p75:5.3f} {pr.won:>2}/{pr.rounds:<2}")
        fa4_us = med.get("fa4", float("nan"))
        line += f" {med['sdpa']:9.2f} {fa4_us:9.2f} {attn_flops(shape) / med['new'] / 1e6:7.1f}  {combo_label(knobs)}"
        lines.append(line)
        print(line, flush=True)
        entry = per_shape.setdefault(shape_key(shape), {"ours": float("inf"), "rows": 0})
        entry["rows"] += 1
        if med["new"] < entry["ours"]:
            # The fastest point against the baselines timed in its own rounds: FA4 and SDPA drift
            # with the board's temperature over a run (5-10% between rows on one H100, 2026-11-27),
            # so medians over other points' rows would compare different clocks.
            entry.update(ours=med["new"], knobs=combo_label(knobs), sdpa=med["sdpa"], fa4=fa4_us,
                         p_sdpa=paired_ratio(times["sdpa"], times["new"]).median,
                         p_fa4=paired_ratio(times["fa4"], times["new"]).median if fa4_call else float("nan"))
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        lines.append(f"new/old: geometric mean {geo:.3f}, range {min(ratios):.3f} .. {max(ratios):.3f}")
        pgeo = math.exp(sum(math.log(x) for x in paired_medians) / len(paired_medians))
        lines.append(f"paired: geometric mean {pgeo:.3f} of the per-point medians of each round's new/old "
                     f"(both timed back to back in a round, so clock changes between rounds cancel); "
                     f"p25..p75 their quartiles, won: rounds where new was faster")
    if any(e["rows"] > 1 for e in per_shape.values()):
        # Several points per shape: the fastest against SDPA and FA4 as timed in its own rounds;
        # vs = the median of the rounds' baseline / ours (paired, as above).
        lines.append("")
        lines.append(f"{'shape':22} {'ours us':>9} {'sdpa us':>9} {'fa4 us':>9} {'vs sdpa':>7} {'vs fa4':>7} "
                     f"{'vs best':>7}  fastest point (baselines: its own rounds)")
        for key, e in per_shape.items():
            has_fa4 = not math.isnan(e["p_fa4"])
            best = min(e["p_sdpa"], e["p_fa4"]) if has_fa4 else e["p_sdpa"]
            vs_fa4 = f"{e['p_fa4']:6.3f}x" if has_fa4 else f"{'-':>7}"
            lines.append(f"{key:22} {e['ours']:9.2f} {e['sdpa']:9.2f} {e['fa4']:9.2f} {e['p_sdpa']:6.3f}x "
                         f"{vs_fa4} {best:6.3f}x  {e['knobs']}")
    return lines


def load_fa4():
    """(flash_attn_func, what was loaded) when FlashAttention-4 imports, else (None, why not):
    sdpa_baseline.load_fa4, the daemon's baseline's own loader."""
    from sdpa_baseline import load_fa4 as baseline_load_fa4
    func, version, why = baseline_load_fa4()
    if func is None:
        return None, f"not measured: {why}"
    return func, f"FlashAttention-4 {version} (flash_attn.cute, [B,S,H,D] copies)"


def fa4_fn(gpu: "Gpu", fa4_func, shape: Shape, q, k, v):
    """FA4 on the shape's inputs as [B,S,H,D] contiguous copies (its layout), warmed up (the
    first call JIT-compiles), ready for time_torch_graph_us; None when it refuses the shape.
    A sliding window goes as FA4's window_size = (W - 1, 0) with causal (sdpa_baseline.fa4_mask_args)."""
    from sdpa_baseline import fa4_mask_args

    bshd = [t.transpose(1, 2).contiguous() if t.dim() == 4 else t for t in (q, k, v)]
    kw = fa4_mask_args(dict(causal=shape.causal, sq=shape.sq, sk=shape.sk, window=shape.w))

    def call():
        return fa4_func(*bshd, **kw)

    try:
        for _ in range(3):
            call()
        gpu.torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a shape FA4 does not run: no column
        print(f"  FA4 refused {shape_key(shape)}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return None
    return call


# ---------------------------------------------------------------------------
# --faults: planted faults, each in a child process (a sticky error or a hung
# kernel would take the parent's context with it).
#   testing/oob_write.cu       launched once: must die with an illegal address
#   testing/infinite_loop.cu   launched once: must still run --fault-timeout s later
#   testing/*probe*.cu         not a fault: a plumbing probe that must pass the check
#   testing/contiguous_rows.cu checked on FAULT_CHECK_SHAPES' padded views: must fail
#   other testing templates    launched once: must crash or hang
#   real templates with [[tensor_map]]: rendered with OPTD_FAULT_MBAR_PHASE = 1 and
#       checked on FAULT_CHECK_SHAPES: "caught" when a check fails, it crashes or hangs.
# ---------------------------------------------------------------------------
EXIT_CHECK_FAILED = 3
EXIT_NOTHING_CHECKED = 4


@dataclass
class FaultCase:
    label: str
    tpl: Template
    mode: str  # "launch": plan FAULT_SHAPE and launch once; "check": Gpu.check on FAULT_CHECK_SHAPES
    mbar_fault: bool  # the OPTD_FAULT_MBAR_PHASE build
    expect: str  # "illegal address", "hang", "crash or hang", "pass", or "caught" (a planted fault)


def is_probe(tpl: Template) -> bool:
    """A testing template that is no fault but a plumbing probe: it must pass the check."""
    return tpl.testing and "probe" in Path(tpl.rel).name


def fault_combos(tpl: Template) -> list[dict]:
    """A probe is checked at every knob combination; a fault runs at the first (the default)."""
    return tpl.knob_combos() if is_probe(tpl) else tpl.knob_combos()[:1]


def names_mbar_fault(tpl: Template) -> bool:
    """Whether the template's code (not its comments) uses OPTD_FAULT_MBAR_PHASE."""
    return re.search(rf"\b{MBAR_FAULT_MACRO}\b", _strip_comments(tpl.text)) is not None


def fault_cases(templates: list[Template], cc: int) -> list[FaultCase]:
    cases = []
    for tpl in templates:
        if not tpl.testing and not tpl.tensor_maps:
            continue
        try:
            device_arch(tpl, cc)
        except Unsupported as e:
            print(f"  {tpl.rel:44} skipped: {e}")
            continue
        name = Path(tpl.rel).name
        if not tpl.testing:
            cases.append(FaultCase(f"{tpl.rel} + {MBAR_FAULT_MACRO}=1", tpl, "check", True, "caught"))
        elif "oob" in name:
            cases.append(FaultCase(tpl.rel, tpl, "launch", False, "illegal address"))
        elif "infinite" in name:
            cases.append(FaultCase(tpl.rel, tpl, "launch", False, "hang"))
        elif is_probe(tpl):
            cases.append(FaultCase(tpl.rel, tpl, "check", False, "pass"))
        elif "contiguous" in name:
            # Ignores the strides: right on contiguous tensors, caught on padded views.
            cases.append(FaultCase(tpl.rel, tpl, "check", False, "caught"))
        else:
            cases.append(FaultCase(tpl.rel, tpl, "launch", False, "crash or hang"))
    return cases


def fault_child(rel: str, mode: str, mbar_fault: bool, cubin_dir: str | None) -> int:
    """One fault case in this (child) process. Prints "launching" once every module is
    loaded, so the parent's run timeout leaves out compile and load time. Exit status: 0 ran
    (and, in check mode, every check passed), EXIT_CHECK_FAILED, EXIT_NOTHING_CHECKED."""
    gpu = Gpu()
    if cubin_dir:
        gpu.cubin_dir = Path(cubin_dir)
    tpl = next(t for t in load_templates() if t.rel == rel)
    combos = fault_combos(tpl)
    mods = {combo_label(kn): gpu.module(tpl, kn, False, count=True, mbar_fault=mbar_fault) for kn in combos}
    if mode == "launch":
        knobs = combos[0]
        splits, launches, _ = plan(tpl, knobs, FAULT_SHAPE, gpu.dev)
        q, k, v, o, o_part, lse, _ = gpu.buffers(FAULT_SHAPE, splits, "fp16")
        args = gpu.launch_args(FAULT_SHAPE, splits, launches, q, k, v, o, o_part, lse)
        kernels = [gpu.prepare(mods[combo_label(knobs)], launch) for launch in launches]
        gpu.torch.cuda.synchronize()
        print("launching", flush=True)
        for kernel in kernels:
            gpu.launch(kernel, args)
        gpu.cp.cuda.Device().synchronize()
        print("finished without error", flush=True)
        return 0
    print("launching", flush=True)
    checked = failed = 0
    for knobs in combos:
        shapes = FAULT_CHECK_SHAPES
        if "contiguous" in Path(rel).name:
            shapes = [replace(s, padded=True) for s in shapes]
        for shape in shapes:
            try:
                ok, msg = gpu.check(tpl, knobs, shape, "fp16", mbar_fault=mbar_fault)
            except DoesNotFit as e:
                print(f"skip {combo_label(knobs)} {shape_key(shape)}: does not fit: {e}", flush=True)
                continue
            checked += 1
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {combo_label(knobs)} {shape_key(shape)}: {msg}", flush=True)
    if not checked:
        print("no shape of FAULT_CHECK_SHAPES fits", flush=True)
        return EXIT_NOTHING_CHECKED
    print(f"{failed} of {checked} checks failed" if failed else f"all {checked} checks passed", flush=True)
    return EXIT_CHECK_FAILED if failed else 0


@dataclass
class ChildRun:
    returncode: int | None  # None: killed
    output: str  # stdout and stderr, merged
    launched: bool  # it printed "launching": its modules were loaded
    killed_in: str | None  # "start": still compiling / loading; "run": hung after launching


def run_child(cmd: list[str], start_timeout: float, run_timeout: float) -> ChildRun:
    """Runs cmd; the run timeout starts when it prints "launching", so a slow compile is never
    mistaken for a hung kernel."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    launched = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.strip() == "launching":
                launched.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + start_timeout
    while not launched.is_set() and proc.poll() is None and time.monotonic() < deadline:
        launched.wait(0.2)
    killed_in = None
    if proc.poll() is None:
        if not launched.is_set():
            killed_in = "start"
        else:
            try:
                proc.wait(run_timeout)
            except subprocess.TimeoutExpired:
                killed_in = "run"
        if killed_in:
            proc.kill()
            proc.wait()
    reader.join(10)
    return ChildRun(None if killed_in else proc.returncode, "\n".join(lines), launched.is_set(), killed_in)


def judge(case: FaultCase, run: ChildRun, start_timeout: float, run_timeout: float) -> tuple[bool, str, str]:
    """(as expected, verdict word, detail) of one fault case's child run."""
    last = next((ln for ln in reversed(run.output.splitlines()) if ln.strip()), "")
    if run.killed_in == "start":
        return False, "UNEXPECTED", f"did not launch: still compiling / loading after {start_timeout:.0f} s, killed"
    if not run.launched:
        return False, "UNEXPECTED", f"did not launch (exit {run.returncode}): {last[-200:]}"
    if run.returncode == EXIT_NOTHING_CHECKED:
        return False, "UNEXPECTED", last
    hung = run.killed_in == "run"
    passed = run.returncode == 0
    check_failed = run.returncode == EXIT_CHECK_FAILED
    crashed = not hung and not passed and not check_failed
    if hung:
        how = f"hung: still running {run_timeout:.0f} s after launching, killed"
    elif check_failed:
        first_fail = next((ln for ln in run.output.splitlines() if ln.startswith("FAIL")), last)
        how = f"check failed: {first_fail[5:]}"
    elif crashed:
        how = f"crashed (exit {run.returncode}): {last}"
    else:
        how = last
    how = how[-200:]
    if case.expect == "caught":
        if hung or check_failed or crashed:
            return True, "caught", how
        return False, "NOT caught", how
    ok = {
        "illegal address": crashed and "illegal" in run.output.lower(),
        "hang": hung,
        "crash or hang": crashed or hung,
        "pass": passed,
    }[case.expect]
    return ok, "as expected" if ok else "UNEXPECTED", f"(expected: {case.expect}) {how}"


def run_faults(templates: list[Template], cc: int, timeout: float, start_timeout: float,
               cubin_dir: str | None) -> int:
    """Runs every fault case of these templates in a child process; returns the number of
    cases that did not behave as expected (a planted fault NOT caught counts)."""
    failures = 0
    for case in fault_cases(templates, cc):
        if case.mbar_fault and not names_mbar_fault(case.tpl):
            failures += 1
            print(f"  {case.label:44} {'UNEXPECTED':12} the template never uses {MBAR_FAULT_MACRO}, "
                  f"so the fault cannot be planted")
            continue
        cmd = [sys.executable, __file__, "--fault-child", case.tpl.rel, "--fault-mode", case.mode]
        if case.mbar_fault:
            cmd.append("--fault-mbar-phase")
        if cubin_dir:
            cmd += ["--cubin-dir", cubin_dir]
        ok, word, detail = judge(case, run_child(cmd, start_timeout, timeout), start_timeout, timeout)
        failures += not ok
        print(f"  {case.label:44} {word:12} {detail}", flush=True)
    return failures


# ---------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="no GPU: render and print launch plans only")
    ap.add_argument("--template", action="append", help="only these templates (file or spec name)")
    ap.add_argument("--no-time", action="store_true", help="skip the timing table")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness checks (e.g. --sdpa only)")
    ap.add_argument("--time-template", action="append", metavar="TEMPLATE",
                    help="time every combination of this template on TIME_SHAPES, print the 3 fastest per shape")
    ap.add_argument("--faults", action="store_true",
                    help="also run the planted faults (testing templates; OPTD_FAULT_MBAR_PHASE builds of templates "
                         "with tensor maps) in child processes")
    ap.add_argument("--fault-timeout", type=float, default=20.0,
                    help="seconds a fault child may run after launching before it counts as hung (default 20)")
    ap.add_argument("--fault-start-timeout", type=float, default=600.0,
                    help="seconds a fault child may take to compile / load before it launches (default 600)")
    ap.add_argument("--fault-child", help=argparse.SUPPRESS)
    ap.add_argument("--fault-mode", choices=("launch", "check"), default="launch", help=argparse.SUPPRESS)
    ap.add_argument("--fault-mbar-phase", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--more-shapes", action="store_true", help="also check EXTRA_CHECK_SHAPES")
    ap.add_argument("--windows-only", action="store_true",
                    help="check (and --dry-run) only WINDOW_CHECK_SHAPES, on the templates with `windows = true`")
    ap.add_argument("--head-dims", metavar="D,D", type=lambda s: {int(x) for x in s.split(",")},
                    help="check only the shapes of these head dims (e.g. 96,256: a template's new head dims)")
    ap.add_argument("--time-shapes", choices=("default", "decode", "llm"), default="default",
                    help="--time-template's shapes: TIME_SHAPES (default), DECODE_TIME_SHAPES or LLM_TIME_SHAPES; "
                         "decode and llm also time SDPA (enable_gqa, bottom-right causal) and print KV TB/s")
    ap.add_argument("--pairs", action="append", metavar="TEMPLATE",
                    help="check this template on a pairwise covering set of its knob combinations")
    ap.add_argument("--sdpa", action="store_true", help="time the selected templates against SDPA (SDPA_SHAPES)")
    ap.add_argument("--time-best", action="store_true",
                    help="time BEST_POINTS (the daemon's best kernel per shape) and SDPA default, fp16")
    ap.add_argument("--time-against", metavar="DIR",
                    help="with --time-best: also time each point with the templates in DIR (another version of "
                         "kernel-templates/), interleaved with the current ones")
    ap.add_argument("--rounds", type=int, default=5, help="--time-best rounds (default 5)")
    ap.add_argument("--sustain-ms", type=float, default=0.0,
                    help="--time-best: each measurement runs its graph replays back to back for at least this "
                         "many ms (e.g. 200: sustained clocks, as a model step runs) instead of 20 synced "
                         "replays (burst clocks); default 0")
    ap.add_argument("--points", choices=sorted(POINT_SETS), default="best",
                    help="--time-best: the daemon's best kernels (best), ragged-S tails (ragged), issue 19's "
                         "medium shapes (medium), PINGPONG (pingpong), OVERLAP (overlap) or EPI_TMA (epilogue) or PACK_GQA (gqa) "
                              "or STREAM_K (streamk) or DYNAMIC (dynamic) on and off, LPT_MIB 32 and 8 (lpt), "
                              "tiles per CTA (tiles_per_cta), or sliding-window shapes (window)")
    ap.add_argument("--cubin-dir", help="load precompiled cubins (see --build-cubins) from this folder")
    ap.add_argument("--build-cubins", metavar="DIR", help="no GPU: precompile this run's modules into DIR")
    ap.add_argument("--cubins-only", action="store_true",
                    help="with --cubin-dir: every module must come from there (a missing or refused cubin is an "
                         "error, not an in-process compile): for an A/B of two compilers' cubins")
    ap.add_argument("--arch", default="sm_90",
                    help="target of --build-cubins (default sm_90); arch_specific templates: sm_<min_cc>a always")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="--build-cubins processes")
    args = ap.parse_args()

    if args.fault_child:
        return fault_child(args.fault_child, args.fault_mode, args.fault_mbar_phase, args.cubin_dir)

    templates = load_templates()
    if args.template:
        templates = [t for t in templates if t.rel in args.template or t.name in args.template
                     or Path(t.rel).name in args.template]
    against = load_templates(Path(args.time_against).resolve()) if args.time_against else None
    if args.dry_run:
        return dry_run(templates, args.windows_only)
    if args.build_cubins:
        return build_cubins(templates, Path(args.build_cubins), args.arch, args.jobs, args.pairs,
                            check=not args.no_check, time_best=args.time_best, against=against,
                            points=args.points)
    check_shapes = CHECK_SHAPES + (EXTRA_CHECK_SHAPES if args.more_shapes else [])
    if args.head_dims:
        check_shapes = [s for s in check_shapes if s.d in args.head_dims]

    t_start = time.perf_counter()
    gpu = Gpu()
    if args.cubin_dir:
        gpu.cubin_dir = Path(args.cubin_dir)
    gpu.cubins_only = args.cubins_only
    print(f"device {gpu.name}: {gpu.dev}; include {gpu.include}")
    failures = []
    n_checks = n_unfit = 0
    for tpl in (t for t in templates if not t.testing and not args.no_check):
        try:
            gpu.arch(tpl)
        except Unsupported as e:
            print(f"\n== {tpl.rel}: skipped: {e}")
            continue
        # Windowed shapes only for a template that implements the window (`windows = true`).
        wins = [s for s in window_shapes(tpl) if not args.head_dims or s.d in args.head_dims]
        tpl_shapes = ([] if args.windows_only else check_shapes) + wins
        if not tpl_shapes:
            print(f"\n== {tpl.rel}: no shapes to check (--windows-only: the template has no `windows = true`)")
            continue
        combos = combos_for(tpl, args.pairs)
        if len(combos) < len(tpl.knob_combos()):
            print(f"\n{tpl.rel}: {len(combos)} of {len(tpl.knob_combos())} combos cover every pair of knob values (--pairs)")
        print(f"\n== {tpl.rel}: {len(combos)} combos x 2 dtypes x {len(tpl_shapes)} shapes "
              f"({len(wins)} windowed; knobs in code: {code_knobs(tpl)})")
        for knobs in combos:
            for dtype in ("fp16", "bf16"):
                combo_ok, worst_abs, worst_l2, split_counts = True, 0.0, 0.0, set()
                for shape in tpl_shapes:
                    try:
                        plan(tpl, knobs, shape, gpu.dev)
                    except DoesNotFit:  # the daemon's gate rejects it too
                        n_unfit += 1
                        continue
                    except ValueError:
                        pass  # a bad plan: gpu.check raises it again, as a failure
                    n_checks += 1
                    try:
                        ok, msg = gpu.check(tpl, knobs, shape, dtype)
                    except Exception as e:  # noqa: BLE001 - compile/launch errors are failures
                        text = str(e).strip()
                        ok, msg = False, f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"
                    if ok:
                        worst_abs = max(worst_abs, gpu.last_errors[0])
                        worst_l2 = max(worst_l2, gpu.last_errors[1])
                        split_counts.add(gpu.last_errors[2])
                    else:
                        combo_ok = False
                        failures.append((tpl.rel, combo_label(knobs), dtype, shape_key(shape), msg))
                        print(f"  FAIL {combo_label(knobs):40} {dtype} {shape_key(shape):22} {msg}")
                        if "illegal" in msg.lower():
                            print("sticky CUDA error (illegal address): stopping")
                            return 1
                print(f"  {combo_label(knobs):40} {dtype}  {'ok    ' if combo_ok else 'FAILED'}"
                      f"  worst max_abs {worst_abs:.2e}  rel_l2 {worst_l2:.2e}  splits used {sorted(split_counts)}")
    print(f"\ncorrectness: {n_checks} checks, {len(failures)} failures, "
          f"{n_unfit} (combo, shape) pairs skipped as the gate does (over the device's shared memory, or a "
          f"tensor map the TMA cannot encode); "
          f"compile {gpu.compile_s:.1f} s ({gpu.cubins_loaded} modules from cubins), "
          f"elapsed {time.perf_counter() - t_start:.1f} s")
    for f in failures:
        print("  FAIL", *f)

    by_name = {t.name: t for t in templates}
    if not args.no_time and "baseline" in by_name and "kv-split" in by_name:
        base, kv = by_name["baseline"], by_name["kv-split"]
        start_knobs = dict(BLOCK_M=32, NUM_WARPS=4, MAX_SPLITS=8)  # strategies/default.toml's start
        print(f"\ntiming (fp16, median of 50 samples of 20 back-to-back runs, us per forward incl. combine), "
              f"{gpu.name}")
        print(f"{'shape':22} {'baseline':>9} {'kv start':>9} {'kv best':>9} {'speedup':>8}  best knobs (splits)")
        for shape in TIME_SHAPES:
            t_base = gpu.time_us(base, base.knob_combos()[0], shape)
            results = []
            for knobs in kv.knob_combos():
                try:
                    results.append((gpu.time_us(kv, knobs, shape), knobs))
                except Exception as e:  # noqa: BLE001
                    print(f"  timing failed for {combo_label(knobs)}: {e}")
            if not results:
                continue
            t_best, best = min(results, key=lambda r: r[0])
            t_start_cfg = next((t for t, kn in results if kn == start_knobs), float("nan"))
            splits = plan(kv, best, shape, gpu.dev)[0]
            print(f"{shape_key(shape):22} {t_base:9.1f} {t_start_cfg:9.1f} {t_best:9.1f} {t_base / t_best:7.1f}x"
                  f"  {combo_label(best)} ({splits})")
        print(f"timed with: {gpu.timing_method}; 'kv start' = {combo_label(start_knobs)}")

    for name in args.time_template or []:
        tpl = next((t for t in templates if name in (t.rel, t.name, Path(t.rel).name)), None)
        if tpl is None:
            print(f"--time-template {name}: not among the selected templates")
            continue
        try:
            gpu.arch(tpl)
        except Unsupported as e:
            print(f"--time-template {name}: skipped: {e}")
            continue
        time_shapes = {"default": TIME_SHAPES, "decode": DECODE_TIME_SHAPES, "llm": LLM_TIME_SHAPES}[args.time_shapes]
        print(f"\n{tpl.rel}: every combination on {args.time_shapes} shapes (fp16, us per forward, "
              f"{gpu.timing_method}); the 3 fastest per shape")
        for shape in time_shapes:
            if args.time_shapes != "default":
                q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
                us = time_torch_graph_us(gpu, sdpa_fn(gpu, shape, q, k, v), 20, 20)
                print(f"  {shape_key(shape):34} sdpa {us:8.2f} us  {shape.kv_bytes() / us / 1e6:5.2f} TB/s KV  "
                      f"{attn_flops(shape) / us / 1e6:6.1f} TFLOPS")
            rows = []
            for knobs in tpl.knob_combos():
                try:
                    rows.append((gpu.time_us(tpl, knobs, shape), knobs))
                except DoesNotFit:  # e.g. over the shared memory of this device
                    pass
                except Exception as e:  # noqa: BLE001
                    print(f"  timing failed for {combo_label(knobs)} {shape_key(shape)}: {e}")
            rows.sort(key=lambda r: r[0])
            for rank, (us, knobs) in enumerate(rows[:3]):
                print(f"  {shape_key(shape) if rank == 0 else '':22} {us:8.2f}  {combo_label(knobs)}")

    sdpa_table = sdpa_compare(gpu, templates) if args.sdpa else []
    if args.time_best:
        print()
        sdpa_table += time_best(gpu, templates, against, args.rounds, args.points, args.sustain_ms)

    # Last: a killed hung kernel should not disturb anything, but it runs after the timing anyway.
    fault_failures = 0
    if args.faults:
        print(f"\nplanted faults (each in a child process; hang = still running {args.fault_timeout:.0f} s "
              f"after launching):")
        fault_failures = run_faults(templates, gpu.dev["CC"], args.fault_timeout, args.fault_start_timeout,
                                    args.cubin_dir)
    print(f"\ntotal {time.perf_counter() - t_start:.1f} s")
    if sdpa_table:
        print()
        print("\n".join(sdpa_table))
    return 1 if failures or fault_failures else 0


if __name__ == "__main__":
    sys.exit(main())
