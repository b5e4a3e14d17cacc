"""Which kernel runs a call: the exact kernel tuned for its shape, else the best kernel
of the same shape class whose launch formulas cover it, else SDPA — decided from the
manifest alone (no torch, no GPU), once per call signature; the C++ launcher caches the
decision.

Classes are the daemon's (src/strategy/open.rs `classify`): decode shapes (SQ <= 16) form
`decode-d{D}`; the others `compute-d{D}[-causal]` when they have at least two 128-row
query tiles per SM, else `latency-d{D}[-causal]`. A kernel serves another shape of its
class because every launch quantity is a formula of the shape (the manifest's `derived`
and `launches`) and the kernels address memory through strides (ABI v2).

Sliding windows (kernel ABI v3, manifest format 3): a call with a window W (causal only; row
i at position p = i + SK - SQ sees keys p - W < j <= p) runs only on a kernel whose entry says
`"windows": true`, tuned for a shape with a window too; a window that masks nothing (W >= SK)
is no window. A kernel with `"windows": false` is never given a windowed call.
"""
import ast
import json
import math
from types import SimpleNamespace
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

DECODE_MAX_SQ = 16
DTYPES = {0: "fp16", 1: "bf16"}
TENSORS = {"q": 0, "k": 1, "v": 2, "o": 3}
PATH_CODES = {"fallback": 0, "exact": 1, "class": 2}
L2_CODES = {"none": 0, "64B": 1, "128B": 2, "256B": 3}
ABI_PARAMS = 17  # kernel ABI v3: ..., softmax_scale, causal, window, strides, cta_counter
MANIFEST_FORMAT = 3  # = the kernel ABI the manifest's kernels take
# Driver limits a launch must respect (grid y/z, threads per block).
MAX_GRID_X, MAX_GRID_YZ, MAX_THREADS = 2**31 - 1, 65535, 1024


class ManifestError(Exception):
    """The manifest cannot be used: says the file, the key and what to do."""


@dataclass(frozen=True)
class Gpu:
    name: str
    cc: int  # e.g. 90
    sms: int
    smem_optin: int


@dataclass(frozen=True)
class Call:
    """One call's signature, as the launcher sees it (the key it caches plans under)."""
    dtype: str  # "fp16", "bf16" or another torch dtype's name
    device: int
    causal: bool
    layout: str  # "bhsd" | "bshd"
    b: int
    hq: int
    hkv: int
    sq: int
    sk: int
    d: int
    strides: Tuple[int, ...]  # q_b q_h q_s k_b k_h k_s v_b v_h v_s (elements)
    aligned: bool = True  # every data pointer 16-byte aligned
    unit_last: bool = True  # last dim contiguous in q, k and v
    needs_grad: bool = False
    window: int = 0  # sliding window (causal only): keys each row sees at most; 0 none

    @property
    def eff_window(self) -> int:
        """The window as the kernels need it: 0 where it masks nothing (W >= SK)."""
        return effective_window(self.window, self.sk)

    KEY_LEN = 24

    @classmethod
    def from_key(cls, key: List[int]) -> "Call":
        """The launcher's int64 key (csrc/launcher.cpp `Key`)."""
        if len(key) != cls.KEY_LEN:
            raise ValueError(f"call key of {len(key)} values, expected {cls.KEY_LEN}")
        return cls(dtype=DTYPES.get(key[0], "other"), device=key[1], causal=bool(key[2]),
                   layout="bshd" if key[3] else "bhsd", b=key[4], hq=key[5], hkv=key[6], sq=key[7], sk=key[8],
                   d=key[9], strides=tuple(key[10:19]), aligned=bool(key[19]), unit_last=bool(key[20]),
                   needs_grad=bool(key[21]), window=key[22])

    @property
    def shape_key(self) -> str:
        """The daemon's shape key (spec/protocol.rs `Shape::key`)."""
        heads = f"h{self.hq}" if self.hq == self.hkv else f"hq{self.hq}hkv{self.hkv}"
        rows = f"s{self.sq}" if self.sq == self.sk else f"sq{self.sq}sk{self.sk}"
        return (f"b{self.b}{heads}{rows}d{self.d}" + ("-causal" if self.causal else "")
                + (f"-w{self.window}" if self.window else "") + f"-{self.dtype}"
                + ("-bshd" if self.layout == "bshd" else ""))

    def o_strides(self) -> Tuple[int, int, int]:
        """(batch, head, row) strides of the o the launcher allocates: contiguous in the layout."""
        if self.layout == "bhsd":
            return self.hq * self.sq * self.d, self.sq * self.d, self.d
        return self.sq * self.hq * self.d, self.d, self.hq * self.d


def effective_window(window: Optional[int], sk: int) -> int:
    """A window of W keys masks something only where W < SK (row i's first key is
    max(0, i + SK - SQ - W + 1), and no row's position exceeds SK - 1): else it is no window."""
    w = int(window or 0)
    return w if 0 < w < sk else 0


def shape_class(b: int, hq: int, sq: int, d: int, causal: bool, sms: int) -> str:
    if sq <= DECODE_MAX_SQ:
        return f"decode-d{d}"
    tiles = b * hq * -(-sq // 128)
    bound = "compute" if tiles >= 2 * sms else "latency"
    return f"{bound}-d{d}" + ("-causal" if causal else "")


def arch_runs_on(arch: Optional[str], arch_specific: bool, cc: int) -> Optional[str]:
    """None when a cubin for `arch` loads on a GPU of compute capability `cc`, else why not."""
    if not arch or not arch.startswith("sm_"):
        return f"the manifest records no arch ({arch!r})"
    digits = arch[3:].rstrip("af")
    if not digits.isdigit():
        return f"unknown arch {arch!r}"
    want = int(digits)
    if arch_specific or arch.endswith("a"):
        if cc != want:
            return f"compiled for {arch}, which runs only on compute capability {want // 10}.{want % 10}; this GPU is sm_{cc}"
        return None
    # A cubin runs on later minor revisions of its major version only.
    if cc // 10 != want // 10 or cc < want:
        return f"compiled for {arch}; this GPU is sm_{cc} (a cubin runs only on its own major version)"
    return None


class Formulas:
    """The manifest's expressions (minijinja in the daemon): arithmetic, `//`, comparisons,
    `and`/`or`/`not`, `x if c else y`, cdiv/min/max, `strides.q_s`. That subset is also Python,
    so each formula is compiled once to Python bytecode after its syntax tree is checked to hold
    only those constructs (a new shape is resolved in microseconds: a decode loop over a growing
    KV cache meets a new shape every token). Anything outside the subset goes through Jinja2."""

    _ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.Name,
                ast.Load, ast.Constant, ast.Attribute, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod,
                ast.USub, ast.UAdd, ast.Not, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt,
                ast.GtE)
    _FUNCS = {"cdiv": lambda a, b: -(-a // b), "min": min, "max": max}

    def __init__(self):
        self._compiled: Dict[str, object] = {}
        self._jinja = None

    def _compile(self, expr: str):
        try:
            tree = ast.parse(expr, mode="eval")
        except SyntaxError:
            tree = None
        if tree is not None and all(self._python_safe(n) for n in ast.walk(tree)):
            code = compile(tree, "<manifest formula>", "eval")
            return lambda env: eval(code, {"__builtins__": {}}, dict(self._FUNCS, **env))  # noqa: S307 - checked tree
        if self._jinja is None:
            import jinja2

            self._jinja = jinja2.Environment()
            self._jinja.globals.update(self._FUNCS)
        fn = self._jinja.compile_expression(expr, undefined_to_none=False)
        return lambda env: fn(**env)

    def _python_safe(self, node) -> bool:
        if not isinstance(node, self._ALLOWED):
            return False
        if isinstance(node, ast.Call):  # only cdiv/min/max, positional
            return isinstance(node.func, ast.Name) and node.func.id in self._FUNCS and not node.keywords
        if isinstance(node, ast.Attribute):  # only strides.<name>
            return isinstance(node.value, ast.Name) and node.value.id == "strides" and not node.attr.startswith("_")
        if isinstance(node, ast.Name):
            return not node.id.startswith("_")
        return True

    def eval(self, expr, env) -> int:
        if not isinstance(expr, str):
            return int(expr)
        fn = self._compiled.get(expr)
        if fn is None:
            fn = self._compiled[expr] = self._compile(expr)
        try:
            value = fn(env)
        except NameError as e:
            raise ValueError(f"{expr!r}: {e}") from None
        if isinstance(value, bool):
            return int(value)
        if value is None or (isinstance(value, float) and value != int(value)):
            raise ValueError(f"{expr!r} = {value!r} is not an integer")
        return int(value)


@dataclass
class Launch:
    kernel: str  # function name in the cubin
    grid: Tuple[int, int, int]
    block: Tuple[int, int, int]
    smem: int


@dataclass
class Decision:
    path: str  # "exact" | "class" | "fallback"
    reason: str
    kernel: Optional[dict] = None  # the manifest entry
    splits: int = 1
    launches: List[Launch] = field(default_factory=list)
    maps: List[dict] = field(default_factory=list)  # resolved tensor maps

    def summary(self) -> dict:
        return {"path": self.path, "kernel": self.kernel["file"] if self.kernel else None, "reason": self.reason}


class Dispatcher:
    def __init__(self, manifest: dict, folder: str, always_kernels: bool = False):
        self.manifest = manifest
        self.always_kernels = always_kernels
        self.folder = folder
        self.formulas = Formulas()
        self.kernels = manifest["kernels"]

    @classmethod
    def load(cls, folder: str, always_kernels: bool = False) -> "Dispatcher":
        path = os.path.join(folder, "manifest.json")
        try:
            with open(path, encoding="utf-8") as f:
                manifest = json.load(f)
        except FileNotFoundError:
            raise ManifestError(f"{path} does not exist: this package was not written by `optimizerd export --python`, "
                                "or its kernels folder was removed; export it again") from None
        except json.JSONDecodeError as e:
            raise ManifestError(f"{path} is not JSON ({e}); export the package again") from None
        if manifest.get("format") != MANIFEST_FORMAT:
            raise ManifestError(f"{path}: `format` is {manifest.get('format')!r}; this runtime launches kernel ABI "
                                f"v{MANIFEST_FORMAT} (format {MANIFEST_FORMAT}) manifests: export the package again "
                                "with this optimizerd (its runtime and its kernels come from one export)")
        for i, k in enumerate(manifest.get("kernels") or []):
            for key in ("file", "dtype", "params", "derived", "launches", "shapes", "windows"):
                if key not in k:
                    raise ManifestError(f"{path}: kernels[{i}] has no `{key}`; export the package again")
        if not manifest.get("kernels"):
            raise ManifestError(f"{path} lists no kernels: the run had no correct kernel to export")
        return cls(manifest, folder, always_kernels)

    # -- policy -------------------------------------------------------------
    def decide(self, call: Call, gpu: Gpu) -> Decision:
        refusal = self._refusal(call)
        if refusal:
            return Decision("fallback", refusal)
        cls_name = shape_class(call.b, call.hq, call.sq, call.d, call.causal, gpu.sms)
        window = call.eff_window
        exact, near, why_not = [], [], []
        for k in self.kernels:
            if k["dtype"] != call.dtype:
                continue
            for s in k["shapes"]:
                sh = _shape(s["shape"])
                if sh["d"] != call.d:
                    continue
                if window and not k.get("windows"):  # never given a windowed call: say so where it would fit
                    if shape_class(sh["b"], sh["hq"], sh["sq"], sh["d"], sh["causal"], gpu.sms) == cls_name:
                        why_not.append(f"{k['file']}: its template does not implement sliding windows "
                                       "(\"windows\": false)")
                    continue
                # Windowed calls match shapes tuned with a window, the others shapes without.
                if bool(window) != bool(effective_window(sh["window"], sh["sk"])):
                    continue
                dims = (sh["b"], sh["hq"], sh["hkv"], sh["sq"], sh["sk"], sh["causal"],
                        effective_window(sh["window"], sh["sk"]))
                if dims == (call.b, call.hq, call.hkv, call.sq, call.sk, call.causal, window):
                    # The same shape tuned in the other layout is still this shape's kernel (it
                    # addresses memory through strides); one tuned in the call's layout goes first.
                    exact.append((sh["layout"] != call.layout, k, s))
                elif shape_class(sh["b"], sh["hq"], sh["sq"], sh["d"], sh["causal"], gpu.sms) == cls_name:
                    near.append((_distance(sh, call), k, s))
        near.sort(key=lambda x: x[0])
        exact.sort(key=lambda x: x[0])
        tried = [("exact", k, s) for _, k, s in exact] + [("class", k, s) for _, k, s in near]
        for path, k, tuned in tried:
            decision, why = self._plan(path, k, call, gpu, cls_name, _shape(tuned["shape"])["layout"])
            if decision:
                slower = sdpa_was_faster(tuned)
                if slower and not self.always_kernels:
                    where = "on this shape" if path == "exact" else f"on the nearest tuned shape {tuned['key']}"
                    return Decision("fallback", f"SDPA was faster {where} in the run's closing comparison ({slower}); "
                                    "OPTIMIZERD_ALWAYS_KERNELS=1 runs the kernel anyway")
                return decision
            why_not.append(f"{k['file']}: {why}")
        if why_not:
            return Decision("fallback", f"no exported kernel of class {cls_name} covers {call.shape_key}: "
                            + "; ".join(dict.fromkeys(why_not)))
        tuned = sorted({shape_class(_shape(s["shape"])["b"], _shape(s["shape"])["hq"], _shape(s["shape"])["sq"],
                                    _shape(s["shape"])["d"], _shape(s["shape"])["causal"], gpu.sms)
                        + (" windowed" if effective_window(_shape(s["shape"])["window"], _shape(s["shape"])["sk"])
                           else "") + f" {k['dtype']}"
                        for k in self.kernels for s in k["shapes"]})
        return Decision("fallback", f"no exported kernel for class {cls_name}{' windowed' if window else ''} {call.dtype} "
                        f"(this package has: {', '.join(tuned)}); add the shape to the workload and tune it")

    def _refusal(self, call: Call) -> Optional[str]:
        if call.dtype not in ("fp16", "bf16"):
            return f"dtype {call.dtype}: the exported kernels are fp16/bf16"
        if call.needs_grad:
            return "inputs require grad: the exported kernels are forward-only (SDPA runs, with autograd)"
        if not call.unit_last:
            return "q, k or v has a last-dim stride other than 1: the kernels read rows as contiguous vectors"
        if not call.aligned:
            return "a data pointer is not 16-byte aligned: the kernels load rows in 16-byte vectors"
        if any(s % 8 for s in call.strides):
            return f"strides {call.strides} are not all multiples of 8 elements (16-byte aligned rows)"
        if call.hq % call.hkv:
            return f"{call.hq} query heads are not a multiple of {call.hkv} key/value heads"
        if call.sq > call.sk:
            return f"SQ {call.sq} > SK {call.sk}: the kernels take the query rows as the last SQ of the keys"
        if call.window < 0 or (call.window and not call.causal):
            return f"window {call.window}: a sliding window is at least 1 key, and only with causal"
        return None

    def _plan(self, path: str, k: dict, call: Call, gpu: Gpu, cls_name: str, tuned_layout: Optional[str] = None):
        """(Decision, None) when kernel `k` can run `call` on `gpu`, else (None, why not)."""
        why = arch_runs_on(k.get("arch"), bool(k.get("arch_specific")), gpu.cc)
        if why:
            return None, why
        if k.get("min_cc") and gpu.cc < k["min_cc"]:
            return None, f"needs compute capability >= {k['min_cc']}"
        if k.get("max_sq") is not None and call.sq > k["max_sq"]:
            return None, f"its template is for SQ <= {k['max_sq']}"
        if call.eff_window and not k.get("windows"):
            return None, "its template does not implement sliding windows (\"windows\": false)"
        if not k.get("cubin"):
            return None, "the manifest names no cubin (exported without --python)"
        env = dict(k["params"])
        env.update(B=call.b, HQ=call.hq, HKV=call.hkv, G=call.hq // call.hkv, SQ=call.sq, SK=call.sk, D=call.d,
                   CAUSAL=int(call.causal), WINDOW=call.eff_window, BSHD=int(call.layout == "bshd"), ELEM_BYTES=2,
                   SMS=gpu.sms,
                   SMEM_OPTIN=gpu.smem_optin, CC=gpu.cc)
        try:
            for name, expr in k["derived"]:
                env[name] = self.formulas.eval(expr, env)
            for r in k.get("refuse", []):  # the template's [[refuse]]: cannot run this shape
                if self.formulas.eval(r["when"], env):
                    return None, f"the kernel cannot run this shape ({r['when']}): {r['why']}"
            launches = []
            for l in k["launches"]:
                if l.get("when") and not self.formulas.eval(l["when"], env):
                    continue
                launch = Launch(kernel=l["kernel"].replace("{D}", str(call.d)),
                                grid=tuple(self.formulas.eval(x, env) for x in l["grid"]),
                                block=tuple(self.formulas.eval(x, env) for x in l["block"]),
                                smem=self.formulas.eval(l["dyn_smem"], env))
                problem = _launch_problem(launch, gpu)
                if problem:
                    return None, problem
                launches.append(launch)
            maps = self._maps(k, call, env)
        except (ValueError, ZeroDivisionError, TypeError, ArithmeticError) as e:
            return None, f"its formulas do not evaluate for {call.shape_key}: {e}"
        except Exception as e:  # jinja2's own errors (undefined names, syntax)
            return None, f"its formulas do not evaluate for {call.shape_key}: {type(e).__name__}: {e}"
        if not launches:
            return None, "no launch applies (every `when` is false)"
        reason = (("tuned for this shape" + (f" (in {tuned_layout})" if tuned_layout != call.layout else ""))
                  if path == "exact"
                  else f"tuned for {', '.join(s['key'] for s in k['shapes'])} (class {cls_name})")
        return Decision(path, reason, k, int(env.get("splits", 1)), launches, maps), None

    def _maps(self, k: dict, call: Call, env: dict) -> List[dict]:
        if not k.get("tensor_maps"):
            return []
        ob, oh, os_ = call.o_strides()
        st = call.strides
        strides = dict(q_b=st[0], q_h=st[1], q_s=st[2], k_b=st[3], k_h=st[4], k_s=st[5], v_b=st[6], v_h=st[7],
                       v_s=st[8], o_b=ob, o_h=oh, o_s=os_)
        env = dict(env, strides=SimpleNamespace(**strides))
        out = []
        for i, m in enumerate(sorted(k["tensor_maps"], key=lambda m: m["param_index"])):
            if m["param_index"] != ABI_PARAMS + i:
                raise ValueError(f"tensor map param_index {m['param_index']}, expected {ABI_PARAMS + i}")
            for key, want in (("data_type", "uint16"), ("interleave", "none"), ("oob_fill", "none"), ("rank", 5)):
                if m.get(key) != want:
                    raise ValueError(f"tensor map {m['tensor']}: {key} = {m.get(key)!r}, this launcher encodes {want!r}")
            r = dict(tensor=TENSORS[m["tensor"]], dims=[self.formulas.eval(x, env) for x in m["dims"]],
                     strides_bytes=[self.formulas.eval(x, env) for x in m["strides_bytes"]],
                     box=[self.formulas.eval(x, env) for x in m["box"]], element_strides=list(m["element_strides"]),
                     # bytes, or a formula of D where the template's swizzle depends on the head dim
                     swizzle=int(self.formulas.eval(m["swizzle_bytes"], env) if isinstance(m["swizzle_bytes"], str)
                                 else m["swizzle_bytes"]),
                     l2=L2_CODES[m["l2_promotion"]])
            # cuTensorMapEncodeTiled's rules: global strides multiples of 16 bytes, boxes of at most 256.
            if any(s % 16 for s in r["strides_bytes"]) or any(not 0 < b <= 256 for b in r["box"]):
                raise ValueError(f"tensor map {m['tensor']}: strides {r['strides_bytes']} / box {r['box']} not encodable")
            out.append(r)
        return out


def sdpa_was_faster(tuned: dict) -> Optional[str]:
    """When the run's closing comparison (the best kernel timed before and after SDPA, same
    clocks) had SDPA's default faster on this tuned shape: the two times, else None."""
    c = tuned.get("closing") or {}
    ours, sdpa = c.get("ours_us"), c.get("sdpa_default_us")
    if ours is None or sdpa is None or sdpa >= ours:
        return None
    return f"{sdpa:.2f} us {c.get('sdpa_picked') or 'SDPA'} vs {ours:.2f} us"


def _shape(s: dict) -> dict:
    """A manifest shape (v1 `{b,h,s}` or v2) as b, hq, hkv, sq, sk, d, causal, layout, window
    (0: none; `"window": W` is present only on a windowed shape)."""
    if "h" in s:
        return dict(b=s["b"], hq=s["h"], hkv=s["h"], sq=s["s"], sk=s["s"], d=s["d"], causal=bool(s["causal"]),
                    layout="bhsd", window=int(s.get("window") or 0))
    return dict(b=s["b"], hq=s["hq"], hkv=s["hkv"], sq=s["sq"], sk=s["sk"], d=s["d"], causal=bool(s["causal"]),
                layout=s.get("layout", "bhsd"), window=int(s.get("window") or 0))


def _distance(sh: dict, call: Call) -> float:
    """How far a tuned shape is from the call: the same dims in the other layout first,
    then the nearest in work (B*HQ*SQ), key length, group size and window, on a log scale."""
    lg = lambda a, b: abs(math.log2(max(a, 1)) - math.log2(max(b, 1)))  # noqa: E731
    return (lg(sh["b"] * sh["hq"] * sh["sq"], call.b * call.hq * call.sq) + lg(sh["sk"], call.sk)
            + 0.5 * lg(sh["hq"] // sh["hkv"], call.hq // call.hkv) + 0.25 * (sh["layout"] != call.layout)
            + 0.5 * lg(effective_window(sh["window"], sh["sk"]), call.eff_window))


def _launch_problem(l: Launch, gpu: Gpu) -> Optional[str]:
    if min(l.grid) < 1 or min(l.block) < 1:
        return f"{l.kernel}: empty grid {l.grid} / block {l.block}"
    if l.grid[0] > MAX_GRID_X or max(l.grid[1:]) > MAX_GRID_YZ:
        return f"{l.kernel}: grid {l.grid} exceeds the launch limits"
    if l.block[0] * l.block[1] * l.block[2] > MAX_THREADS:
        return f"{l.kernel}: block {l.block} has more than {MAX_THREADS} threads"
    if l.smem > gpu.smem_optin:
        return f"{l.kernel}: {l.smem} bytes of shared memory > the GPU's {gpu.smem_optin}"
    return None


def encode_plan(decision: Decision, kernel_ids: List[int], call: Call) -> List[int]:
    """The int64 plan the launcher decodes (csrc/launcher.cpp `decode_plan`)."""
    if decision.path == "fallback":
        return [0]
    splits = decision.splits
    rows = call.b * call.hq * call.sq
    # lse_partial: the split LSEs, then one split semaphore word per row (kernel ABI v2).
    out = [PATH_CODES[decision.path], splits, splits * rows * call.d, (splits + 1) * rows,
           len(decision.launches), len(decision.maps)]
    for kid, l in zip(kernel_ids, decision.launches):
        out += [kid, *l.grid, *l.block, l.smem]
    for m in decision.maps:
        out += [m["tensor"], *m["dims"], *m["strides_bytes"], *m["box"], *m["element_strides"], m["swizzle"], m["l2"],
                0, 0, 0, 0]
    return out
