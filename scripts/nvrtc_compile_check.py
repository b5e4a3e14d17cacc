#!/usr/bin/env python3
"""Compile every optimizerd kernel template with NVRTC, on the CPU, no GPU needed.

For each template under kernel-templates/ (common/ excluded) this renders the
source as the daemon does (src/pipeline/render.rs) -- one `#define KNOB value`
line per knob, `#define OPTD_BF16 0|1`, `#define OPTD_SMEM_BYTES_<ROLE>_D<d>
bytes` per launch role and head dim the template lists (`head_dims`) (the spec's smem formula at that head dim, see
layout_smem()), followed by the template with its local `#include "common/..."`
lines replaced by those files' text -- for every
combination of the knob values in the template's `optimizerd:spec` block, both
element types, each target architecture, and with and without
-DOPTD_COUNT_CTAS=1 (the daemon's check build). Each is compiled to a cubin,
which must contain every exported kernel the spec launches
(optd_<role>_d<d> for each head dim of the template's `head_dims`).

Templates with `arch_specific = true` (Hopper: wgmma, setmaxnreg, TMA) are
compiled only for their arch-specific target sm_<min_cc>a (e.g. sm_90a), whatever
--arch says: that is the only target they build for and the only one the daemon
uses for them (see arch_targets()).

Prints a table of failures and exits 1 if there is any; with --resources also
prints registers / spills / static shared memory per kernel (sm_90 or sm_90a, fp16,
timed build).

NVRTC comes from .deps/ (scripts/setup.sh installs it); override with
OPTIMIZERD_NVRTC_LIB (path to libnvrtc.so.*) and OPTIMIZERD_CUDA_INCLUDE.

The rendering and spec helpers here are also imported by
scripts/check_templates_gpu.py.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import itertools
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = ROOT / "kernel-templates"
COMMON_INCLUDE = "common/optd.cuh"
INCLUDE_LINE = f'#include "{COMMON_INCLUDE}"'
HEAD_DIMS = (64, 96, 128, 256)  # src/spec/config.rs HEAD_DIMS; each template builds those its spec lists
DEFAULT_ARCHS = ("sm_80", "sm_89", "sm_90")
# Kernel ABI v3: q k v o o_partial lse_partial batch heads_q heads_kv seq_q seq_k n_splits softmax_scale causal
# window strides cta_counter (window: the sliding window's keys, 0 = none; .dev/window-contract.md)
ABI_PARAMS = 17
TENSOR_NAMES = ("q", "k", "v", "o")
TMA_SWIZZLES = (32, 64, 128)

_SPEC_RE = re.compile(r"/\*\s*optimizerd:spec[ \t]*\n(.*?)\*/", re.S)


# ---------------------------------------------------------------------------
# Templates: spec, knob combinations, rendering (shared with the GPU checker)
# ---------------------------------------------------------------------------
@dataclass
class Template:
    path: Path
    rel: str  # path relative to kernel-templates/, e.g. "testing/oob_write.cu"
    text: str
    spec: dict

    @property
    def name(self) -> str:
        return self.spec["template"]["name"]

    @property
    def root(self) -> Path:
        """The kernel-templates folder this template was loaded from (its common/ is inlined)."""
        return self.path.parents[len(Path(self.rel).parts) - 1]

    @property
    def testing(self) -> bool:
        return bool(self.spec["template"].get("testing", False))

    @property
    def min_cc(self) -> int:
        return int(self.spec["template"].get("min_cc", 0))

    @property
    def arch_specific(self) -> bool:
        """Compiled for sm_<min_cc>a (e.g. sm_90a); runs only where cc == min_cc."""
        return bool(self.spec["template"].get("arch_specific", False))

    @property
    def windows(self) -> bool:
        """`windows = true` under [template]: the kernels implement the sliding window (the
        ABI's `window`); a template without it is never given a windowed shape."""
        return bool(self.spec["template"].get("windows", False))

    @property
    def head_dims(self) -> tuple[int, ...]:
        """The head dims the template's kernels are written for (`head_dims` under
        [template]; absent: 64 and 128, as src/spec/template.rs reads it)."""
        return tuple(self.spec["template"].get("head_dims", (64, 128)))

    @property
    def tensor_maps(self) -> list[dict]:
        """The spec's [[tensor_map]] entries (tensor, box_rows, swizzle), in kernel-parameter
        order: map i is parameter ABI_PARAMS + i of every launch."""
        return self.spec.get("tensor_map", [])

    def complete(self, knobs: dict[str, int]) -> dict[str, int]:
        """`knobs` with every knob it leaves out at its first value, as a strategy stage's
        `start` does: a point written before a knob existed (the scripts' fixed points)
        still names a whole build."""
        return {**knobs, **{k: vals[0] for k, vals in self.spec.get("knobs", {}).items() if k not in knobs}}

    def knob_combos(self) -> list[dict[str, int]]:
        """Every combination of knob values, in declared order (last knob fastest)."""
        knobs = self.spec.get("knobs", {})
        names = list(knobs)
        return [dict(zip(names, vals)) for vals in itertools.product(*(knobs[n] for n in names))]

    def kernel_names(self) -> list[str]:
        """Exported kernels the spec launches, e.g. optd_fwd_d64, optd_fwd_d128: one per
        head dim the template lists."""
        out = []
        for launch in self.spec["launch"]:
            for d in self.head_dims:
                name = f"optd_{launch['kernel']}_d{d}"
                if name not in out:
                    out.append(name)
        return out


def parse_spec(text: str, where: str = "<template>") -> dict:
    m = _SPEC_RE.search(text)
    if not m:
        raise ValueError(f"{where}: no /* optimizerd:spec ... */ block")
    spec = tomllib.loads(m.group(1))
    for key in ("template", "knobs", "derived", "launch"):
        if key not in spec:
            raise ValueError(f"{where}: spec has no [{key}]")
    if "splits" not in spec["derived"]:
        raise ValueError(f"{where}: [derived] must define `splits`")
    for i, r in enumerate(spec.get("refuse", [])):
        if set(r) != {"when", "why"} or not all(isinstance(r[k], str) and r[k].strip() for k in r):
            raise ValueError(f"{where}: [[refuse]] #{i} must have exactly `when` (a formula) and `why` (words), both strings")
    for knob, values in spec["knobs"].items():
        if not values or not all(isinstance(v, int) for v in values):
            raise ValueError(f"{where}: knob {knob} must be a non-empty list of integers")
    meta = spec["template"]
    if "windows" in meta and not isinstance(meta["windows"], bool):
        raise ValueError(f"{where}: windows = {meta['windows']!r}; it is true or false")
    if meta.get("arch_specific", False) and not (isinstance(meta.get("min_cc"), int) and meta["min_cc"] > 0):
        raise ValueError(f"{where}: arch_specific = true needs min_cc (e.g. 90: the target is sm_90a)")
    for i, tm in enumerate(spec.get("tensor_map", [])):
        what = f"{where}: [[tensor_map]] #{i}"
        unknown = set(tm) - {"tensor", "box_rows", "box_panels", "swizzle"}
        if unknown:
            raise ValueError(f"{what}: unknown keys {sorted(unknown)} (allowed: tensor, box_rows, box_panels, swizzle)")
        if tm.get("tensor") not in TENSOR_NAMES:
            raise ValueError(f"{what}: tensor = {tm.get('tensor')!r}; allowed: {', '.join(TENSOR_NAMES)}")
        for key in ("box_rows", "box_panels"):
            if (key == "box_rows" or key in tm) and (not isinstance(tm.get(key), (int, str)) or isinstance(tm.get(key), bool)):
                raise ValueError(f"{what}: {key} must be a formula string or an integer")
        # An integer is checked here; a formula (one swizzle per head dim) per shape.
        sw = tm.get("swizzle")
        if not (isinstance(sw, str) or (isinstance(sw, int) and not isinstance(sw, bool) and sw in TMA_SWIZZLES)):
            raise ValueError(f"{what}: swizzle = {sw!r} bytes; allowed: 32, 64, 128, or a formula giving one of them")
    return spec


def load_templates(root: Path = TEMPLATES_DIR) -> list[Template]:
    out = []
    for path in sorted(root.rglob("*.cu")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("common/"):
            continue
        text = path.read_text()
        out.append(Template(path, rel, text, parse_spec(text, rel)))
    return out


# ---------------------------------------------------------------------------
# Spec expressions. They are minijinja expressions restricted to arithmetic,
# comparisons, and/or, `a if c else b` and cdiv/min/max calls, which is also
# valid Python with the same meaning (`//` floors in both), so Python's eval
# with no builtins evaluates them (check_templates_gpu.py cross-checks jinja2).
# ---------------------------------------------------------------------------
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


FUNCS = {"cdiv": cdiv, "min": min, "max": max}
_ALLOWED = re.compile(r"^[\w\s+\-*/%<>=!(),.]*$")


def eval_expr(expr: str, ctx: dict):
    """A spec expression's value; NameError where it reads a name `ctx` lacks."""
    if not _ALLOWED.match(expr):
        raise ValueError(f"unexpected characters in expression {expr!r}")
    return eval(expr, {"__builtins__": {}, **FUNCS}, dict(ctx))  # noqa: S307 - spec text only


def layout_smem(tpl: Template, knobs: dict[str, int], d: int) -> list[tuple[str, int | str]]:
    """Template::layout_smem (src/spec/template.rs): per launch role, the spec's smem formula
    over the knobs, D and ELEM_BYTES alone (and the derived values computable from them), or
    why it has no such value (it reads the shape or the device)."""
    ctx = dict(knobs, D=d, ELEM_BYTES=2)
    for name, expr in tpl.spec["derived"].items():
        try:
            ctx[name] = eval_expr(str(expr), ctx)
        except (NameError, ArithmeticError):
            pass  # needs the shape (m_blocks, splits)
    out: dict[str, int | str] = {}
    for launch in tpl.spec["launch"]:
        smem = str(launch.get("smem", "0"))
        try:
            v = eval_expr(smem, ctx)
            value = int(v) if not isinstance(v, bool) and float(v).is_integer() else f"smem {smem!r} gave {v!r}"
        except (NameError, ArithmeticError) as e:
            value = f"smem {smem!r} has no value from the knobs and D alone ({e})"
        role = launch["kernel"]
        if role in out and out[role] != value:
            value = f"the launches of role `{role}` declare different smem formulas"
        out[role] = value
    return list(out.items())


def smem_defines(tpl: Template, knobs: dict[str, int]) -> str:
    """`#define OPTD_SMEM_BYTES_<ROLE>_D<d> bytes` per role and head dim, as the daemon's
    renderer writes them (a comment where the formula has no value per head dim)."""
    lines = []
    for d in HEAD_DIMS:
        if d not in tpl.head_dims:  # common/optd.cuh: -1, which no layout equals
            lines += [f"#define OPTD_SMEM_BYTES_{role.upper()}_D{d} OPTD_NOT_A_HEAD_DIM\n"
                      for role, _ in layout_smem(tpl, knobs, d)]
            continue
        for role, value in layout_smem(tpl, knobs, d):
            name = f"OPTD_SMEM_BYTES_{role.upper()}_D{d}"
            lines.append(f"#define {name} {value}\n" if isinstance(value, int) else f"// {name} not defined: {value}\n")
    return "".join(lines)


def render(tpl: Template, knobs: dict[str, int], bf16: bool, root: Path | None = None) -> str:
    """The daemon's rendering: defines, then the template with its local includes inlined
    (from `root`, by default the folder the template was loaded from)."""
    root = tpl.root if root is None else root
    if sum(1 for ln in tpl.text.splitlines() if ln.strip() == INCLUDE_LINE) != 1:
        raise ValueError(f"{tpl.rel}: expected exactly one line `{INCLUDE_LINE}`")
    knobs = tpl.complete(knobs)
    header = "".join(f"#define {k} {v}\n" for k, v in knobs.items())
    header += f"#define OPTD_BF16 {1 if bf16 else 0}\n"
    header += smem_defines(tpl, knobs)
    return header + _inline_includes(tpl.text, root, 0)


def _inline_includes(text: str, root: Path, depth: int) -> str:
    """`#include "x"` lines replaced by root/x (recursively, 4 levels), as src/pipeline/render.rs
    does; the headers' include guards keep a header included twice from being defined twice."""
    out = []
    for line in text.splitlines(keepends=True):
        m = re.match(r'\s*#\s*include\s*"([^"]+)"\s*$', line)
        if m and depth < 4:
            out.append(_inline_includes((root / m.group(1)).read_text(), root, depth + 1))
            if not out[-1].endswith("\n"):
                out.append("\n")
        else:
            out.append(line)
    return "".join(out)


def combo_label(knobs: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in knobs.items())


# ---------------------------------------------------------------------------
# Targets: plain sm_XY, or sm_XYa for arch-specific templates
# ---------------------------------------------------------------------------
class Unsupported(Exception):
    """The template cannot run on this GPU; str(e) says why."""


def specific_arch(tpl: Template) -> str | None:
    """`sm_<min_cc>a` (e.g. sm_90a) for an arch-specific template, else None."""
    return f"sm_{tpl.min_cc}a" if tpl.arch_specific else None


def arch_targets(tpl: Template, archs: list[str]) -> list[str]:
    """The targets a CPU compile of `tpl` uses: its arch-specific target alone, or `archs`."""
    return [specific_arch(tpl)] if tpl.arch_specific else list(archs)


def device_arch(tpl: Template, cc: int) -> str:
    """The NVRTC target of `tpl` on a GPU of compute capability `cc` (90 for 9.0), as the
    daemon chooses it (src/spec/template.rs, Meta::target_arch); raises Unsupported with the
    reason when the template cannot run there."""
    if tpl.arch_specific:
        if cc != tpl.min_cc:
            raise Unsupported(
                f"{tpl.name} is arch-specific ({specific_arch(tpl)}): its cubin runs only on compute "
                f"capability {tpl.min_cc // 10}.{tpl.min_cc % 10} exactly, and this GPU is sm_{cc}")
        return specific_arch(tpl)
    if cc < tpl.min_cc:
        raise Unsupported(f"{tpl.name} needs compute capability {tpl.min_cc} and this GPU has {cc}")
    return f"sm_{cc}"


# ---------------------------------------------------------------------------
# NVRTC through ctypes
# ---------------------------------------------------------------------------
def default_nvrtc_lib() -> str:
    return os.environ.get(
        "OPTIMIZERD_NVRTC_LIB", str(ROOT / ".deps/cuda/nvidia/cu13/lib/libnvrtc.so.13")
    )


def default_cuda_include() -> str:
    return os.environ.get("OPTIMIZERD_CUDA_INCLUDE", str(ROOT / ".deps/cuda/nvidia/cu13/include"))


class Nvrtc:
    def __init__(self, lib_path: str):
        # libnvrtc dlopens libnvrtc-builtins by soname; outside LD_LIBRARY_PATH it is
        # only found if already loaded, so load the one beside it first.
        for builtins in sorted(Path(lib_path).parent.glob("libnvrtc-builtins.so.*")):
            if ".alt." not in builtins.name:
                ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
                break
        self.lib = ctypes.CDLL(lib_path)
        L = self.lib
        L.nvrtcGetErrorString.restype = ctypes.c_char_p
        L.nvrtcCreateProgram.argtypes = [
            ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
            ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
        ]
        L.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        L.nvrtcGetProgramLogSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        L.nvrtcGetProgramLog.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        L.nvrtcGetCUBINSize.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        L.nvrtcGetCUBIN.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        L.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        return major.value, minor.value

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def compile(self, source: str, name: str, options: list[str]) -> tuple[bool, str, bytes]:
        """Returns (ok, log, cubin)."""
        prog = ctypes.c_void_p()
        self._check(
            self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
            "nvrtcCreateProgram",
        )
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            rc = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace")
            if rc != 0:
                return False, log or self.lib.nvrtcGetErrorString(rc).decode(), b""
            self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            cubin = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            return True, log, cubin.raw
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


# ---------------------------------------------------------------------------
# ptxas -v parsing (resources per kernel)
# ---------------------------------------------------------------------------
_FUNC_RE = re.compile(r"Function properties for (\w+)")
_SPILL_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def parse_resources(log: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    cur = None
    for line in log.splitlines():
        if m := _FUNC_RE.search(line):
            cur = m.group(1)
            out.setdefault(cur, {})
        elif cur and (m := _SPILL_RE.search(line)):
            out[cur].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        elif cur and (m := _REGS_RE.search(line)):
            sm = _SMEM_RE.search(line)
            out[cur].update(regs=int(m.group(1)), smem=int(sm.group(1)) if sm else 0)
    return out


# ---------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------
@dataclass
class Job:
    template: str  # rel path
    knobs: dict
    bf16: bool
    arch: str
    count_ctas: bool
    source: str
    expect: list


@dataclass
class Result:
    job: Job
    ok: bool
    reason: str
    log: str
    seconds: float
    resources: dict


_NVRTC: Nvrtc | None = None
_INCLUDE = ""


def _init_worker(lib: str, include: str) -> None:
    global _NVRTC, _INCLUDE
    _NVRTC = Nvrtc(lib)
    _INCLUDE = include


def _run_job(job: Job) -> Result:
    assert _NVRTC is not None
    opts = [f"--gpu-architecture={job.arch}", "-std=c++17", f"--include-path={_INCLUDE}", "--ptxas-options=-v"]
    if job.count_ctas:
        opts.append("-DOPTD_COUNT_CTAS=1")
    t0 = time.perf_counter()
    try:
        ok, log, cubin = _NVRTC.compile(job.source, job.template.replace("/", "_"), opts)
    except Exception as e:  # noqa: BLE001 - reported as a failure
        return Result(job, False, f"nvrtc: {e}", "", time.perf_counter() - t0, {})
    dt = time.perf_counter() - t0
    if not ok:
        return Result(job, False, "compile error", log, dt, {})
    missing = [k for k in job.expect if (k.encode() + b"\0") not in cubin]
    if missing:
        return Result(job, False, "missing kernels: " + ", ".join(missing), log, dt, {})
    return Result(job, True, "", log, dt, parse_resources(log))


def build_jobs(templates: list[Template], archs: list[str]) -> list[Job]:
    jobs = []
    for tpl in templates:
        expect = tpl.kernel_names()
        for knobs in tpl.knob_combos():
            for bf16 in (False, True):
                src = render(tpl, knobs, bf16)
                for arch in arch_targets(tpl, archs):
                    for count in (False, True):
                        jobs.append(Job(tpl.rel, knobs, bf16, arch, count, src, expect))
    return jobs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", action="append",
                    help="target(s), default sm_80, sm_89, sm_90; arch_specific templates: sm_<min_cc>a only")
    ap.add_argument("--template", action="append", help="only these templates (file or spec name)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--resources", action="store_true",
                    help="print registers/spills/smem (sm_90 or sm_90a, fp16)")
    ap.add_argument("--show-log", action="store_true", help="print NVRTC logs of failures in full")
    args = ap.parse_args()

    lib, include = default_nvrtc_lib(), default_cuda_include()
    if not Path(lib).exists():
        print(f"libnvrtc not found at {lib}: run scripts/setup.sh or set OPTIMIZERD_NVRTC_LIB", file=sys.stderr)
        return 2
    templates = load_templates()
    if args.template:
        templates = [t for t in templates if t.rel in args.template or t.name in args.template
                     or Path(t.rel).name in args.template]
    archs = args.arch or list(DEFAULT_ARCHS)
    jobs = build_jobs(templates, archs)
    print(f"NVRTC {'.'.join(map(str, Nvrtc(lib).version()))} ({lib})")
    print(f"{len(templates)} templates, {len(jobs)} compiles, archs {' '.join(archs)}, {args.jobs} jobs")
    for tpl in templates:
        if tpl.arch_specific:
            print(f"  {tpl.rel}: arch-specific, compiled for {specific_arch(tpl)} only")

    t0 = time.perf_counter()
    results: list[Result] = []
    with cf.ProcessPoolExecutor(args.jobs, initializer=_init_worker, initargs=(lib, include)) as pool:
        for res in pool.map(_run_job, jobs, chunksize=2):
            results.append(res)
    wall = time.perf_counter() - t0

    # Summary per template.
    print()
    print(f"{'template':28} {'combos':>6} {'compiles':>8} {'failed':>6} {'mean s':>7}")
    for tpl in templates:
        rs = [r for r in results if r.job.template == tpl.rel]
        nf = sum(not r.ok for r in rs)
        mean = sum(r.seconds for r in rs) / max(1, len(rs))
        print(f"{tpl.rel:28} {len(tpl.knob_combos()):>6} {len(rs):>8} {nf:>6} {mean:>7.2f}")
    print(f"wall {wall:.1f} s")

    if args.resources:
        print()
        print(f"{'template':22} {'knobs':40} {'kernel':18} {'regs':>4} {'spill':>5} {'smem':>6}")
        for r in results:
            j = r.job
            if r.ok and j.arch in ("sm_90", "sm_90a") and not j.bf16 and not j.count_ctas:
                for kname, res in sorted(r.resources.items()):
                    spill = res.get("spill_st", 0) + res.get("spill_ld", 0)
                    print(f"{j.template:22} {combo_label(j.knobs):40} {kname:18} "
                          f"{res.get('regs', -1):>4} {spill:>5} {res.get('smem', -1):>6}")

    spills = [
        (r, k) for r in results if r.ok for k, res in r.resources.items()
        if res.get("spill_st", 0) or res.get("spill_ld", 0)
    ]
    if spills:
        print(f"\nnote: {len(spills)} kernel builds spill registers (not a failure), e.g. "
              f"{spills[0][0].job.template} {combo_label(spills[0][0].job.knobs)} {spills[0][1]} {spills[0][0].job.arch}")

    failures = [r for r in results if not r.ok]
    if not failures:
        print("\nall compiles passed")
        return 0
    print(f"\n{len(failures)} FAILURES")
    print(f"{'template':24} {'knobs':40} {'dtype':5} {'arch':6} {'count':5} reason")
    for r in failures:
        j = r.job
        print(f"{j.template:24} {combo_label(j.knobs):40} {'bf16' if j.bf16 else 'fp16':5} "
              f"{j.arch:6} {int(j.count_ctas):5} {r.reason}")
    shown = failures if args.show_log else failures[:1]
    for r in shown:
        err = [ln for ln in r.log.splitlines() if "ptxas info" not in ln and ln.strip()]
        print(f"\n--- log: {r.job.template} {combo_label(r.job.knobs)} {r.job.arch} ---")
        print("\n".join(err[:40]))
    return 1


if __name__ == "__main__":
    sys.exit(main())
