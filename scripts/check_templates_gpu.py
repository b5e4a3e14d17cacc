#!/usr/bin/env python3
"""Check optimizerd's kernel templates on a real GPU, without the Rust daemon.

Needs python3 with torch and cupy (cupy-cuda13x). For every non-testing
template under kernel-templates/ and every knob combination, fp16 and bf16:

  1. render the source as the daemon does (scripts/nvrtc_compile_check.py),
     compile the check build (-DOPTD_COUNT_CTAS=1) with cupy.RawModule (NVRTC);
  2. per shape, evaluate the spec's [derived] names and [[launch]] grid / block /
     smem / when expressions, fill O (and the fp32 partial buffers) with NaN,
     launch every planned kernel with the shared ABI, and check
       - each launch's CTA counter equals its grid size,
       - no NaN / inf is left in O,
       - max |O - ref| <= atol (2e-2 fp16, 6e-2 bf16) and rel. L2 <= 1e-2,
     against torch's scaled_dot_product_attention in fp32 on the same inputs;
  3. time the baseline against every kv-split combination (timed build, fp16,
     CUDA graphs of back-to-back launches, median of 50 samples) and print a
     table.

Knobs that the kernel code never names (kv-split's MAX_SPLITS only enters the
launch formulas) cannot change the compiled code, so one module is compiled per
combination of the knobs it does name and shared by the others.

  --dry-run   no GPU: render every template and print every launch plan
              (SMS=132, H100 values), cross-checking the expression evaluator
              against jinja2 when it is installed.
  --faults    also run the testing templates, each in a child process: the
              out-of-bounds writer must fail with an illegal address, the
              infinite loop must still be running after --fault-timeout s.
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
              (check and timed builds, fp16 and bf16) with NVRTC on this
              machine (.deps, as scripts/nvrtc_compile_check.py) for --arch
              (default sm_90) into DIR; a GPU run given --cubin-dir DIR loads
              those instead of compiling (any module missing there is compiled
              as usual), which saves the device machine the compile time.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import re
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvrtc_compile_check import (  # noqa: E402
    HEAD_DIMS, ROOT, TEMPLATES_DIR, Template, combo_label, load_templates, render,
)

# (B, H, S, D, causal)
CHECK_SHAPES = [
    (1, 1, 1, 64, False), (1, 1, 17, 64, True), (1, 1, 32, 64, False),
    (1, 1, 100, 128, True), (1, 1, 128, 64, False), (2, 8, 128, 64, False),
    (1, 2, 1000, 64, True), (1, 1, 4097, 128, False), (4, 16, 1024, 64, True),
]
TIME_SHAPES = [
    (1, 1, 128, 64, False), (1, 1, 256, 64, False), (1, 1, 512, 64, False), (2, 8, 128, 64, False),
    (4, 16, 1024, 64, True),
]
# --more-shapes: ragged S around the tile sizes, causal and not, both head dims.
EXTRA_CHECK_SHAPES = [
    (1, 1, 1, 128, True), (1, 1, 17, 128, False), (1, 3, 100, 64, False), (1, 1, 64, 128, True),
    (1, 1, 65, 64, True), (2, 3, 333, 64, True), (1, 1, 1000, 128, False), (1, 2, 1000, 128, True),
    (1, 1, 4097, 64, True), (1, 2, 4097, 128, True),
]
# --sdpa: (B, H, S, D, causal)
SDPA_SHAPES = [
    (4, 16, 4096, 64, False), (4, 16, 4096, 64, True), (2, 16, 8192, 128, False), (2, 16, 8192, 128, True),
]
ATOL = {"fp16": 2e-2, "bf16": 6e-2}
RTOL_L2 = 1e-2
H100 = dict(SMS=132, SMEM_OPTIN=232448, CC=90)


# ---------------------------------------------------------------------------
# Spec expressions. They are minijinja expressions restricted to arithmetic,
# comparisons, and/or, `a if c else b` and cdiv/min/max calls, which is also
# valid Python with the same meaning (`//` floors in both), so Python's eval
# with no builtins evaluates them; jinja2, when present, is cross-checked.
# ---------------------------------------------------------------------------
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


_FUNCS = {"cdiv": cdiv, "min": min, "max": max}
_ALLOWED = re.compile(r"^[\w\s+\-*/%<>=!(),.]*$")


class Evaluator:
    def __init__(self) -> None:
        try:
            import jinja2
            self.env = jinja2.Environment()
            self.env.globals.update(_FUNCS)
        except ImportError:
            self.env = None
        self._cache: dict[str, object] = {}

    def __call__(self, expr: str, ctx: dict) -> int:
        if not _ALLOWED.match(expr):
            raise ValueError(f"unexpected characters in expression {expr!r}")
        value = eval(expr, {"__builtins__": {}, **_FUNCS}, dict(ctx))  # noqa: S307 - spec text only
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


def plan(tpl: Template, knobs: dict, shape, dev: dict) -> tuple[int, list[dict], dict]:
    """(n_splits, launches, context) for one shape; launches carry name/grid/block/smem."""
    b, h, s, d, causal = shape
    ctx = dict(knobs, B=b, H=h, S=s, D=d, CAUSAL=int(causal), ELEM_BYTES=2, **dev)
    for name, expr in tpl.spec["derived"].items():
        ctx[name] = EVAL(str(expr), ctx)
    splits = ctx["splits"]
    if splits < 1:
        raise ValueError(f"splits = {splits} < 1")
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
            raise ValueError(f"launch {launch['kernel']} wants {smem} B of shared memory")
        launches.append(dict(kernel=f"optd_{launch['kernel']}_d{d}", grid=tuple(grid), block=tuple(block), smem=smem))
    return splits, launches, ctx


def shape_key(shape) -> str:
    b, h, s, d, causal = shape
    return f"b{b}h{h}s{s}d{d}" + ("-causal" if causal else "")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def code_knobs(tpl: Template) -> list[str]:
    """Knobs the code (not the comments or spec) mentions: only these can change a build."""
    common = "".join(p.read_text() for p in sorted((TEMPLATES_DIR / "common").glob("*.cuh")))
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


def dry_run(templates: list[Template]) -> int:
    bad = 0
    for tpl in templates:
        used = code_knobs(tpl)
        print(f"== {tpl.rel} ({tpl.name}{', testing' if tpl.testing else ''}); knobs in code: {used}")
        for knobs in tpl.knob_combos():
            for bf16 in (False, True):
                render(tpl, knobs, bf16)
            for shape in CHECK_SHAPES + TIME_SHAPES:
                try:
                    splits, launches, _ = plan(tpl, knobs, shape, H100)
                except Exception as e:  # noqa: BLE001
                    if "of shared memory" in str(e):  # does not fit: the gate rejects it
                        print(f"  {combo_label(knobs):40} {shape_key(shape):22} does not fit: {e}")
                        continue
                    bad += 1
                    print(f"  {combo_label(knobs):40} {shape_key(shape):22} ERROR {e}")
                    continue
                desc = "; ".join(f"{l['kernel']} {l['grid']}x{l['block'][0]} smem {l['smem']}" for l in launches)
                print(f"  {combo_label(knobs):40} {shape_key(shape):22} splits {splits:2}  {desc}")
    print(f"\ndry run: {'jinja2 cross-checked' if EVAL.env else 'jinja2 not installed'}, {bad} errors")
    return 1 if bad else 0


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
        self.cubins_loaded = 0

    # -- compilation --------------------------------------------------------
    def module(self, tpl: Template, knobs: dict, bf16: bool, count: bool):
        used = code_knobs(tpl)
        key = (tpl.rel, tuple((k, knobs[k]) for k in used), bf16, count)
        if key not in self.modules:
            opts = ("-std=c++17",) + self.include + (("-DOPTD_COUNT_CTAS=1",) if count else ())
            t0 = time.perf_counter()
            cubin = None
            if self.cubin_dir is not None:
                cubin = self.cubin_dir / cubin_name(render(tpl, knobs, bf16), count, f"sm_{self.dev['CC']}")
            mod = None
            if cubin is not None and cubin.exists():
                try:
                    mod = self.cp.RawModule(path=str(cubin))
                    for kname in tpl.kernel_names():
                        mod.get_function(kname)
                    self.cubins_loaded += 1
                except Exception as e:  # noqa: BLE001 - e.g. a driver older than the cubin: compile here
                    print(f"  cubin {cubin.name} not loadable ({type(e).__name__}: {e}); compiling")
                    mod = None
            if mod is None:
                mod = self.cp.RawModule(code=render(tpl, knobs, bf16), options=opts, backend="nvrtc")
            for kname in tpl.kernel_names():
                mod.get_function(kname)  # compiles and loads now, so errors surface here
            self.compile_s += time.perf_counter() - t0
            self.modules[key] = mod
        return self.modules[key]

    # -- data ---------------------------------------------------------------
    def inputs(self, shape, dtype: str, need_ref: bool = True):
        """(q, k, v as torch elem tensors, fp32 reference), cached per shape and dtype.
        need_ref=False (timing only) skips the reference (None) until one is asked for."""
        key = (shape, dtype)
        if key not in self._inputs:
            torch = self.torch
            b, h, s, d, causal = shape
            gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(repr(key).encode()))
            tdt = torch.float16 if dtype == "fp16" else torch.bfloat16
            q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=gen).to(tdt) for _ in range(3))
            self._inputs[key] = (q, k, v, None)
        q, k, v, ref = self._inputs[key]
        if ref is None and need_ref:
            causal = shape[4]
            ref = self.F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            self._inputs[key] = (q, k, v, ref)
        return self._inputs[key]

    def as_cp(self, t):
        # cupy has no bfloat16: hand it the raw 16-bit storage, only the pointer matters.
        return self.cp.asarray(t.view(self.torch.int16)) if t.element_size() == 2 else self.cp.asarray(t)

    def buffers(self, shape, splits: int, dtype: str, fill=float("nan"), need_ref: bool = True):
        torch = self.torch
        b, h, s, d, _ = shape
        q, k, v, ref = self.inputs(shape, dtype, need_ref)
        o = torch.full_like(q, fill)
        o_part = torch.full((max(1, splits * b * h * s * d),), fill, device="cuda", dtype=torch.float32)
        lse = torch.full((max(1, splits * b * h * s),), fill, device="cuda", dtype=torch.float32)
        return q, k, v, o, o_part, lse, ref

    def args(self, shape, splits, q, k, v, o, o_part, lse):
        import numpy as np

        b, h, s, d, causal = shape
        return (
            self.as_cp(q), self.as_cp(k), self.as_cp(v), self.as_cp(o), self.cp.asarray(o_part),
            self.cp.asarray(lse), np.int32(b), np.int32(h), np.int32(s), np.int32(splits),
            np.float32(1.0 / math.sqrt(d)), np.int32(int(causal)), self.counter,
        )

    def kernel(self, mod, launch):
        fn = mod.get_function(launch["kernel"])
        if launch["smem"] > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = launch["smem"]
        return fn

    # -- correctness --------------------------------------------------------
    def check(self, tpl: Template, knobs: dict, shape, dtype: str) -> tuple[bool, str]:
        torch = self.torch
        mod = self.module(tpl, knobs, dtype == "bf16", count=True)
        splits, launches, _ = plan(tpl, knobs, shape, self.dev)
        q, k, v, o, o_part, lse, ref = self.buffers(shape, splits, dtype)
        args = self.args(shape, splits, q, k, v, o, o_part, lse)
        torch.cuda.synchronize()
        for launch in launches:
            self.counter.fill(0)
            self.kernel(mod, launch)(launch["grid"], launch["block"], args, shared_mem=launch["smem"])
            self.cp.cuda.Device().synchronize()
            ran, planned = int(self.counter.get()[0]), math.prod(launch["grid"])
            if ran != planned:
                return False, f"{launch['kernel']}: {ran} CTAs counted, {planned} planned"
        out = o.float()
        bad = int((~torch.isfinite(out)).sum())
        if bad:
            return False, f"{bad} non-finite outputs (splits {splits})"
        err = (out - ref).abs()
        max_abs = float(err.max())
        rel_l2 = float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30))
        ok = max_abs <= ATOL[dtype] and rel_l2 <= RTOL_L2
        self.last_errors = (max_abs, rel_l2, splits)
        return ok, f"max_abs {max_abs:.2e} rel_l2 {rel_l2:.2e} splits {splits}"

    # -- timing -------------------------------------------------------------
    def time_us(self, tpl: Template, knobs: dict, shape, reps: int = 20, samples: int = 50,
                keep_output: bool = False) -> float:
        """Median microseconds of one execution of the plan (all its launches).
        keep_output: leave O in self.last_output (for a check against SDPA)."""
        cp = self.cp
        mod = self.module(tpl, knobs, False, count=False)
        splits, launches, _ = plan(tpl, knobs, shape, self.dev)
        q, k, v, o, o_part, lse, _ = self.buffers(shape, splits, "fp16", fill=0.0, need_ref=False)
        if keep_output:
            self.last_output = o
        args = self.args(shape, splits, q, k, v, o, o_part, lse)
        fns = [(self.kernel(mod, l), l) for l in launches]
        self.torch.cuda.synchronize()
        stream = cp.cuda.Stream(non_blocking=True)

        def run_once():
            for fn, l in fns:
                fn(l["grid"], l["block"], args, shared_mem=l["smem"])

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


def build_cubins(templates: list[Template], out_dir: Path, arch: str, jobs: int, pairs=None) -> int:
    """Compile (CPU, NVRTC from .deps) every module a GPU run of these templates loads."""
    import concurrent.futures as cf
    from nvrtc_compile_check import Job, _init_worker, _run_job, default_cuda_include, default_nvrtc_lib

    out_dir.mkdir(parents=True, exist_ok=True)
    todo: dict[str, Job] = {}
    for tpl in templates:
        used = code_knobs(tpl)
        seen = set()
        for knobs in combos_for(tpl, pairs):
            ukey = tuple((k, knobs[k]) for k in used)
            if ukey in seen:
                continue
            seen.add(ukey)
            for bf16 in (False, True):
                src = render(tpl, knobs, bf16)
                for count in (False, True):
                    todo[cubin_name(src, count, arch)] = Job(tpl.rel, knobs, bf16, arch, count, src, tpl.kernel_names())
    lib, include = default_nvrtc_lib(), default_cuda_include()
    bad = 0
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(jobs, initializer=_init_worker, initargs=(lib, include)) as pool:
        names = list(todo)
        for name, res in zip(names, pool.map(_cubin_job, [todo[n] for n in names])):
            ok, reason, cubin = res
            if ok:
                (out_dir / name).write_bytes(cubin)
            else:
                bad += 1
                j = todo[name]
                print(f"  FAIL {j.template} {combo_label(j.knobs)} bf16={j.bf16} count={j.count_ctas}: {reason}")
    print(f"built {len(todo) - bad} cubins for {arch} in {out_dir} ({time.perf_counter() - t0:.1f} s), {bad} failures")
    return 1 if bad else 0


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
def attn_flops(shape) -> float:
    b, h, s, d, causal = shape
    f = 4.0 * b * h * s * s * d
    return f / 2 if causal else f


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
        combos = tpl.knob_combos()
        per_shape: dict = {}
        for shape in SDPA_SHAPES:
            q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
            causal = shape[4]
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


# ---------------------------------------------------------------------------
# Fault templates, each in a child process (a sticky error or a hung kernel
# would take the parent's context with it).
# ---------------------------------------------------------------------------
def fault_child(rel: str) -> None:
    gpu = Gpu()
    tpl = next(t for t in load_templates() if t.rel == rel)
    knobs = tpl.knob_combos()[0]
    shape = (1, 1, 128, 64, False)
    mod = gpu.module(tpl, knobs, False, count=True)
    splits, launches, _ = plan(tpl, knobs, shape, gpu.dev)
    q, k, v, o, o_part, lse, _ = gpu.buffers(shape, splits, "fp16")
    args = gpu.args(shape, splits, q, k, v, o, o_part, lse)
    gpu.torch.cuda.synchronize()
    print("launching", flush=True)
    for launch in launches:
        gpu.kernel(mod, launch)(launch["grid"], launch["block"], args, shared_mem=launch["smem"])
    gpu.cp.cuda.Device().synchronize()
    print("finished without error", flush=True)


def run_faults(templates: list[Template], timeout: float) -> int:
    failures = 0
    for tpl in (t for t in templates if t.testing):
        cmd = [sys.executable, __file__, "--fault-child", tpl.rel]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            out = (p.stdout + p.stderr).strip().splitlines()
            last = out[-1] if out else ""
            hung, crashed = False, p.returncode != 0 and "launching" in p.stdout
            illegal = "illegal" in (p.stdout + p.stderr).lower()
        except subprocess.TimeoutExpired:
            hung, crashed, illegal, last = True, False, False, f"still running after {timeout:.0f} s, killed"
        if "oob" in tpl.rel:
            ok = crashed and illegal
        elif "infinite" in tpl.rel:
            ok = hung
        else:
            ok = crashed or hung
        failures += not ok
        print(f"  {tpl.rel:28} {'as expected' if ok else 'UNEXPECTED':12} {last[-150:]}")
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
    ap.add_argument("--faults", action="store_true", help="also run the testing templates in child processes")
    ap.add_argument("--fault-timeout", type=float, default=20.0)
    ap.add_argument("--fault-child", help=argparse.SUPPRESS)
    ap.add_argument("--more-shapes", action="store_true", help="also check EXTRA_CHECK_SHAPES")
    ap.add_argument("--pairs", action="append", metavar="TEMPLATE",
                    help="check this template on a pairwise covering set of its knob combinations")
    ap.add_argument("--sdpa", action="store_true", help="time the selected templates against SDPA (SDPA_SHAPES)")
    ap.add_argument("--cubin-dir", help="load precompiled cubins (see --build-cubins) from this folder")
    ap.add_argument("--build-cubins", metavar="DIR", help="no GPU: precompile this run's modules into DIR")
    ap.add_argument("--arch", default="sm_90", help="target of --build-cubins (default sm_90)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="--build-cubins processes")
    args = ap.parse_args()

    if args.fault_child:
        fault_child(args.fault_child)
        return 0

    templates = load_templates()
    if args.template:
        templates = [t for t in templates if t.rel in args.template or t.name in args.template
                     or Path(t.rel).name in args.template]
    if args.dry_run:
        return dry_run(templates)
    if args.build_cubins:
        return build_cubins([t for t in templates if not t.testing], Path(args.build_cubins), args.arch, args.jobs,
                            args.pairs)
    check_shapes = CHECK_SHAPES + (EXTRA_CHECK_SHAPES if args.more_shapes else [])

    t_start = time.perf_counter()
    gpu = Gpu()
    if args.cubin_dir:
        gpu.cubin_dir = Path(args.cubin_dir)
    print(f"device {gpu.name}: {gpu.dev}; include {gpu.include}")
    failures = []
    n_checks = n_unfit = 0
    for tpl in (t for t in templates if not t.testing and not args.no_check):
        combos = combos_for(tpl, args.pairs)
        if len(combos) < len(tpl.knob_combos()):
            print(f"\n{tpl.rel}: {len(combos)} of {len(tpl.knob_combos())} combos cover every pair of knob values (--pairs)")
        print(f"\n== {tpl.rel}: {len(combos)} combos x 2 dtypes x {len(check_shapes)} shapes "
              f"(knobs in code: {code_knobs(tpl)})")
        for knobs in combos:
            for dtype in ("fp16", "bf16"):
                combo_ok, worst_abs, worst_l2, split_counts = True, 0.0, 0.0, set()
                for shape in check_shapes:
                    n_checks += 1
                    try:
                        plan(tpl, knobs, shape, gpu.dev)
                    except ValueError as e:
                        if "of shared memory" in str(e):  # the daemon's gate rejects it too
                            n_checks -= 1
                            n_unfit += 1
                            continue
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
          f"{n_unfit} (combo, shape) pairs skipped: over the device's shared memory, as the gate does; "
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
        print(f"\n{tpl.rel}: every combination on TIME_SHAPES (fp16, us per forward, {gpu.timing_method}); "
              f"the 3 fastest per shape")
        for shape in TIME_SHAPES:
            rows = []
            for knobs in tpl.knob_combos():
                try:
                    rows.append((gpu.time_us(tpl, knobs, shape), knobs))
                except Exception as e:  # noqa: BLE001 - e.g. over the shared memory of this device
                    if "of shared memory" not in str(e):
                        print(f"  timing failed for {combo_label(knobs)} {shape_key(shape)}: {e}")
            rows.sort(key=lambda r: r[0])
            for rank, (us, knobs) in enumerate(rows[:3]):
                print(f"  {shape_key(shape) if rank == 0 else '':22} {us:8.2f}  {combo_label(knobs)}")

    sdpa_table = sdpa_compare(gpu, templates) if args.sdpa else []

    # Last: a killed hung kernel should not disturb anything, but it runs after the timing anyway.
    fault_failures = 0
    if args.faults:
        print("\nfault templates:")
        fault_failures = run_faults(templates, args.fault_timeout)
    print(f"\ntotal {time.perf_counter() - t_start:.1f} s")
    if sdpa_table:
        print()
        print("\n".join(sdpa_table))
    return 1 if failures or fault_failures else 0


if __name__ == "__main__":
    sys.exit(main())
