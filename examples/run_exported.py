#!/usr/bin/env python3
"""Load kernels exported by `optimizerd export --out DIR` with CuPy and check them
against PyTorch SDPA.

    python3 examples/run_exported.py DIR [--extra-s 17,100]

For every kernel in DIR/manifest.json and every shape it is the best for (plus the same
shape at the extra key lengths, to show the launch formulas work for any length), the
launch geometry is computed from the manifest's formulas (Jinja2 expressions over the
shape, the device and the knobs), the kernels run in order on fresh randn inputs, and the
output is compared with torch's scaled_dot_product_attention in fp32. Needs cupy, torch,
jinja2 and cuda-bindings (pip install cuda-bindings).

Every manifest format loads:
  - format 3 (kernel ABI v3): format 2's arguments with `int window` after `causal`, 17 in
    all; a shape may carry `"window": W` (causal only: row i, at position p = i + SK - SQ, sees
    keys p - W < j <= p; Hugging Face's sliding_window = W), formulas may read WINDOW (0: none),
    and each kernel says `"windows": true|false`, whether its template implements the window.
    A windowed shape is checked against SDPA with the window's mask, also at the extra key
    lengths (where the window is then wider than SK on the short ones, which masks nothing);
    a windowed shape is never run on a kernel whose entry says "windows": false (refused, with
    the reason).
  - format 2 (kernel ABI v2): 16 arguments `(q, k, v, o, o_partial, lse_partial, batch,
    heads_q, heads_kv, seq_q, seq_k, n_splits, softmax_scale, causal, strides, cta_counter)`;
    shapes {b, hq, hkv, sq, sk, d, causal, dtype, layout}; formulas over B, HQ, HKV, G, SQ,
    SK, D, CAUSAL, BSHD; `strides` is a struct of 12 int64 element strides (batch, head, row
    of q, k, v, o) passed by value, so every launch goes through the driver API's
    cuLaunchKernel. Grouped-query heads (query head h reads KV head h / (HQ / HKV)),
    bottom-right causal (row i sees keys <= i + SK - SQ), either layout. Each exported
    shape also runs once on padded views (rows 64 elements further apart than contiguous):
    the strides are all a kernel may assume.
  - format 1 (kernel ABI v1, older exports): 13 arguments `(.., batch, heads, seq_len,
    n_splits, softmax_scale, causal, cta_counter)`, [B,H,S,D] contiguous, formulas over B, H,
    S, D; launched with CuPy's RawKernel call unless the kernel has tensor maps.

Kernels of Hopper templates differ in two ways, both said by the manifest:
  - `arch` (e.g. "sm_90a"): the NVRTC target they are compiled for. An arch-specific
    target (ending in "a") runs only on a GPU of exactly that compute capability; on
    another GPU such a kernel is skipped, with the reason printed.
  - `tensor_maps`: after the ABI arguments the kernel takes one CUtensorMap (128 bytes,
    by value) per map, in `param_index` order. Each is encoded with cuTensorMapEncodeTiled
    over the q/k/v/o tensor it names, for the shape being run: from the manifest's resolved
    entry for an exported shape in its contiguous layout (column "maps": manifest), else
    from the kernel's tensor_maps formulas (column "maps": formulas; format 2's formulas
    read the strides of the view being launched as strides.q_s and so on).
"""
import argparse
import ctypes
import json
import math
import os
import sys

import jinja2
import torch

try:
    import cupy as cp
except ImportError:  # the manifest's formulas still evaluate without it (tests on a CPU); main() says what to install
    cp = None

ATOL = {"fp16": 2e-2, "bf16": 6e-2}
PAD = 64  # extra elements per row of the padded view (format 2)


class Abi:
    """What differs between manifest formats: the argument count, the names formulas use,
    and how a stored shape reads."""

    PARAMS = {1: 13, 2: 16, 3: 17}

    def __init__(self, fmt):
        if fmt not in self.PARAMS:
            sys.exit(f"manifest format {fmt}: this loader knows formats 1, 2 and 3")
        self.format = fmt
        self.params = self.PARAMS[fmt]

    def shape(self, s):
        """A manifest shape as a dict with b, hq, hkv, sq, sk, d, causal, layout, window (0: none)."""
        if self.format == 1 or "h" in s:
            return dict(b=s["b"], hq=s["h"], hkv=s["h"], sq=s["s"], sk=s["s"], d=s["d"], causal=bool(s["causal"]),
                        layout="bhsd", window=0)
        window = int(s.get("window") or 0)
        if window and (self.format < 3 or not s["causal"]):
            raise ValueError(f"shape {s}: a window needs format 3 and a causal shape")
        return dict(b=s["b"], hq=s["hq"], hkv=s["hkv"], sq=s["sq"], sk=s["sk"], d=s["d"], causal=bool(s["causal"]),
                    layout=s.get("layout", "bhsd"), window=window)

    def formula_vars(self, shape):
        if self.format == 1:
            return dict(B=shape["b"], H=shape["hq"], S=shape["sq"], D=shape["d"], CAUSAL=int(shape["causal"]))
        out = dict(B=shape["b"], HQ=shape["hq"], HKV=shape["hkv"], G=shape["hq"] // shape["hkv"], SQ=shape["sq"],
                   SK=shape["sk"], D=shape["d"], CAUSAL=int(shape["causal"]), BSHD=int(shape["layout"] == "bshd"))
        if self.format >= 3:
            out["WINDOW"] = int(shape.get("window") or 0)
        return out

    def refusal(self, kernel, shape):
        """Why `kernel` must not run `shape`, or None: a windowed shape on a kernel whose
        template does not implement windows (format 3's `"windows": false`)."""
        if shape.get("window") and not kernel.get("windows"):
            return (f"window {shape['window']}: {kernel['file']}'s template does not implement sliding windows "
                    "(\"windows\": false in the manifest)")
        return None

    def args(self, ptrs, shape, splits, scale, strides, counter):
        """The ABI's arguments as ctypes values, in order: 6 pointers, the shape's ints (format 1:
        batch, heads, seq_len; else batch, heads_q, heads_kv, seq_q, seq_k), n_splits,
        softmax_scale, causal, format 3's window, format 2+'s strides struct, the CTA counter."""
        values = [ctypes.c_uint64(p) for p in ptrs]
        if self.format == 1:
            values += [ctypes.c_int32(shape["b"]), ctypes.c_int32(shape["hq"]), ctypes.c_int32(shape["sq"])]
        else:
            values += [ctypes.c_int32(shape[x]) for x in ("b", "hq", "hkv", "sq", "sk")]
        values += [ctypes.c_int32(splits), ctypes.c_float(scale), ctypes.c_int32(int(shape["causal"]))]
        if self.format >= 3:
            values.append(ctypes.c_int32(int(shape.get("window") or 0)))
        if self.format >= 2:
            values.append(strides)
        values.append(ctypes.c_uint64(counter))
        assert len(values) == self.params, (len(values), self.params)
        return values


def strides_of(shape, tensor, pad):
    """Element strides (batch, head, row) of q/k/v/o in the shape's layout, rows `pad` longer."""
    heads, rows = (shape["hq"], shape["sq"]) if tensor in "qo" else (shape["hkv"], shape["sk"])
    d = shape["d"]
    if shape["layout"] == "bhsd":
        return heads * rows * (d + pad), rows * (d + pad), d + pad
    return rows * (heads * d + pad), d, heads * d + pad


def key_of(shape):
    heads = f"h{shape['hq']}" if shape["hq"] == shape["hkv"] else f"hq{shape['hq']}hkv{shape['hkv']}"
    rows = f"s{shape['sq']}" if shape["sq"] == shape["sk"] else f"sq{shape['sq']}sk{shape['sk']}"
    return (f"b{shape['b']}{heads}{rows}d{shape['d']}" + ("-causal" if shape["causal"] else "")
            + (f"-w{shape['window']}" if shape.get("window") else "")
            + ("-bshd" if shape["layout"] == "bshd" else ""))


def reference_mask(shape, device="cpu"):
    """[SQ, SK] booleans (True: seen) of the shape's causal mask, bottom-right (row i at position
    p = i + SK - SQ sees keys j <= p), with its sliding window (also j > p - W); None when not
    causal."""
    if not shape["causal"]:
        return None
    sq, sk, w = shape["sq"], shape["sk"], int(shape.get("window") or 0)
    p = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    mask = j <= p
    if w:
        mask &= j > p - w
    return mask


def evaluator(env_vars):
    env = jinja2.Environment()
    env.globals.update(cdiv=lambda a, b: -(-a // b), min=min, max=max)

    def ev(expr):
        if not isinstance(expr, str):  # a number already
            return int(expr)
        v = env.compile_expression(expr)(**env_vars)
        if isinstance(v, bool):
            return v
        if v != int(v):
            raise ValueError(f"{expr!r} = {v} is not an integer (with {env_vars})")
        return int(v)
    return ev


def launches_for(abi, kernel, shape, device):
    """(n_splits, launches, variables): the kernel's launches for `shape`, and the variables
    (knobs, shape, device, derived values) its formulas are evaluated with."""
    vars_ = dict(kernel["params"])
    vars_.update(abi.formula_vars(shape), ELEM_BYTES=2, SMS=device["sms"], SMEM_OPTIN=device["smem_optin"],
                 CC=device["cc"])
    for name, expr in kernel["derived"]:
        vars_[name] = evaluator(vars_)(expr)
    ev = evaluator(vars_)
    out = []
    for l in kernel["launches"]:
        if l.get("when") and not ev(l["when"]):
            continue
        out.append({"kernel": l["kernel"].replace("{D}", str(shape["d"])),
                    "grid": tuple(ev(g) for g in l["grid"]), "block": tuple(ev(b) for b in l["block"]),
                    "smem": ev(l["dyn_smem"])})
    return vars_.get("splits", 1), out, vars_


# ---------------------------------------------------------------------------
# TMA tensor maps and driver-API launches (kernels with `tensor_maps`)
# ---------------------------------------------------------------------------
def tensor_maps_for(abi, kernel, entry, shape, vars_, strides, exported_view):
    """(maps, where from): the kernel's tensor maps for `shape` with numbers: the manifest's
    resolved entry when this is the exported shape in its contiguous view, else the
    kernel's formulas (format 2: over `strides`, the view being launched)."""
    if not kernel.get("tensor_maps"):
        return [], "-"
    if exported_view and entry.get("tensor_maps"):
        maps, source = entry["tensor_maps"], "manifest"
    else:
        ev = evaluator(dict(vars_, strides=strides))
        maps = [dict(m, dims=[ev(x) for x in m["dims"]], strides_bytes=[ev(x) for x in m["strides_bytes"]],
                     box=[ev(x) for x in m["box"]], swizzle_bytes=ev(m["swizzle_bytes"]))
                for m in kernel["tensor_maps"]]
        source = "formulas"
    maps = sorted(maps, key=lambda m: m["param_index"])
    if [m["param_index"] for m in maps] != list(range(abi.params, abi.params + len(maps))):
        raise ValueError(f"tensor map param_index {[m['param_index'] for m in maps]}: expected {abi.params}, ...")
    return maps, source


class Driver:
    """The CUDA driver API calls for kernels with tensor maps (cuda-bindings), each checked."""

    def __init__(self):
        try:
            from cuda.bindings import driver
        except ImportError:
            sys.exit("this export has kernels with TMA tensor maps, which are encoded and launched through the "
                     "CUDA driver API: pip install cuda-bindings")
        self.cu = driver

    def check(self, result, what):
        err, *values = result if isinstance(result, tuple) else (result,)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            name = (self.cu.cuGetErrorName(err)[1] or b"?").decode()
            raise RuntimeError(f"{what} failed: {name}")
        return values[0] if len(values) == 1 else values

    def encode(self, m, address):
        """cuTensorMapEncodeTiled for one manifest map over the tensor at `address`. Returns its
        128 bytes in 64-byte aligned host memory, ready to be a kernel parameter."""
        cu = self.cu

        def pick(field, table):
            if m[field] not in table:
                raise ValueError(f"tensor map {m['tensor']}: {field} = {m[field]!r}, expected one of {list(table)}")
            return table[m[field]]

        T, S, I = cu.CUtensorMapDataType, cu.CUtensorMapSwizzle, cu.CUtensorMapInterleave
        L2, OOB = cu.CUtensorMapL2promotion, cu.CUtensorMapFloatOOBfill
        tmap = self.check(cu.cuTensorMapEncodeTiled(
            pick("data_type", {"uint16": T.CU_TENSOR_MAP_DATA_TYPE_UINT16}),
            m["rank"], address,
            [cu.cuuint64_t(x) for x in m["dims"]],
            [cu.cuuint64_t(x) for x in m["strides_bytes"]],
            [cu.cuuint32_t(x) for x in m["box"]],
            [cu.cuuint32_t(x) for x in m["element_strides"]],
            pick("interleave", {"none": I.CU_TENSOR_MAP_INTERLEAVE_NONE}),
            pick("swizzle_bytes", {32: S.CU_TENSOR_MAP_SWIZZLE_32B, 64: S.CU_TENSOR_MAP_SWIZZLE_64B,
                                   128: S.CU_TENSOR_MAP_SWIZZLE_128B}),
            pick("l2_promotion", {"none": L2.CU_TENSOR_MAP_L2_PROMOTION_NONE, "64B": L2.CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
                                  "128B": L2.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                  "256B": L2.CU_TENSOR_MAP_L2_PROMOTION_L2_256B}),
            pick("oob_fill", {"none": OOB.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE}),
        ), f"cuTensorMapEncodeTiled({m['tensor']}: dims {m['dims']}, strides {m['strides_bytes']}, box {m['box']})")
        storage = (ctypes.c_ubyte * (128 + 64))()  # a CUtensorMap is 128 bytes, 64-byte aligned
        aligned = ctypes.addressof(storage) + (-ctypes.addressof(storage)) % 64
        ctypes.memmove(aligned, tmap.getPtr(), 128)
        return storage, aligned

    def launch(self, fn, l, stream, kernel_params):
        """cuLaunchKernel of CuPy kernel `fn`; kernel_params: address of a void*[] with one
        pointer per kernel parameter, to that parameter's value."""
        self.check(self.cu.cuLaunchKernel(fn.kernel.ptr, *l["grid"], *l["block"], l["smem"], stream,
                                          kernel_params, 0), f"cuLaunchKernel({l['kernel']})")


class Strides(ctypes.Structure):
    """Format 2's `struct optd_strides`, passed by value."""
    _fields_ = [(f"{t}_{x}", ctypes.c_int64) for t in "qkvo" for x in "bhs"]


class Prepared:
    """A kernel made ready to launch on one shape: `go()` launches it on the current stream
    (so a CUDA graph can capture it); q, k, v are the logical inputs, o the output's view in
    `of`, its storage (NaN-poisoned before the first launch)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def prepare(abi, module, kernel, entry, shape, device, driver, pad=0, exported_view=False):
    """Fresh randn inputs for `shape` (laid out in its layout, rows `pad` elements longer), the
    kernel's launches and arguments, nothing launched yet."""
    dtype = torch.bfloat16 if kernel["dtype"] == "bf16" else torch.float16
    b, hq, hkv, sq, sk, d = (shape[x] for x in ("b", "hq", "hkv", "sq", "sk", "d"))
    causal = shape["causal"]
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
    st = {t: strides_of(shape, t, pad) for t in "qkvo"}

    def storage(t, logical, fill=float("nan")):
        heads, rows = (hq, sq) if t in "qo" else (hkv, sk)
        sb, sh, ss = st[t]
        flat = torch.full(((b - 1) * sb + (heads - 1) * sh + (rows - 1) * ss + d,), fill, device="cuda", dtype=dtype)
        view = flat.as_strided((b, heads, rows, d), (sb, sh, ss, 1))
        if logical is not None:
            view.copy_(logical)
        return flat, view

    (qf, _), (kf, _), (vf, _) = storage("q", q), storage("k", k), storage("v", v)
    of, o = storage("o", None)
    splits, launches, vars_ = launches_for(abi, kernel, shape, device)
    o_part = torch.empty(max(1, splits * b * hq * sq * d), device="cuda", dtype=torch.float32)
    # (n_splits + 1) * B*HQ*SQ words: the split LSEs, then the split semaphores, which must be
    # zero before the first launch (the kernels leave them zero); zeros for the whole buffer.
    lse = torch.zeros(max(1, (splits + 1) * b * hq * sq), device="cuda", dtype=torch.float32)
    counter = torch.zeros(1, device="cuda", dtype=torch.int32)
    fns = []
    for l in launches:
        fn = module.get_function(l["kernel"])
        if l["smem"] > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = l["smem"]
        fns.append((fn, l))
    names = dict(q_b=st["q"][0], q_h=st["q"][1], q_s=st["q"][2], k_b=st["k"][0], k_h=st["k"][1], k_s=st["k"][2],
                 v_b=st["v"][0], v_h=st["v"][1], v_s=st["v"][2], o_b=st["o"][0], o_h=st["o"][1], o_s=st["o"][2])
    maps, maps_from = tensor_maps_for(abi, kernel, entry, shape, vars_, names, exported_view)

    scale = 1.0 / math.sqrt(d)
    if abi.format == 1 and not maps:  # CuPy passes the 13 ABI v1 arguments itself
        ptr = lambda t: cp.uint64(t.data_ptr())  # device pointers are 8-byte kernel arguments
        args = (ptr(qf), ptr(kf), ptr(vf), ptr(of), ptr(o_part), ptr(lse),
                cp.int32(b), cp.int32(hq), cp.int32(sq), cp.int32(splits), cp.float32(scale),
                cp.int32(int(causal)), ptr(counter))

        def go():
            for fn, l in fns:
                fn(l["grid"], l["block"], args, shared_mem=l["smem"])
    else:  # the driver API: kernelParams[i] points at the value of parameter i
        values = abi.args([t.data_ptr() for t in (qf, kf, vf, of, o_part, lse)], shape, splits, scale,
                          Strides(**names) if abi.format >= 2 else None, counter.data_ptr())
        pointers = [ctypes.addressof(x) for x in values]
        tensors = {"q": qf, "k": kf, "v": vf, "o": of}
        for m in maps:
            storage_, address = driver.encode(m, tensors[m["tensor"]].data_ptr())
            values.append(storage_)  # keeps the 128 bytes alive
            pointers.append(address)
        kernel_params = (ctypes.c_void_p * len(pointers))(*pointers)

        def go():
            stream = torch.cuda.current_stream().cuda_stream
            for fn, l in fns:
                driver.launch(fn, l, stream, ctypes.addressof(kernel_params))

    return Prepared(go=go, q=q, k=k, v=v, o=o, of=of, launches=launches, maps_from=maps_from,
                    keep=(values if abi.format >= 2 or maps else None, qf, kf, vf, o_part, lse, counter))


def run_one(abi, module, kernel, entry, shape, device, driver, pad=0, exported_view=False):
    """Run the kernel on `shape` (tensors laid out in its layout, rows `pad` elements longer)
    and compare with SDPA in fp32. Returns (max_abs, unwritten, written outside O's view,
    eager us, launches, where the maps came from)."""
    p = prepare(abi, module, kernel, entry, shape, device, driver, pad, exported_view)
    go, q, k, v, o, of = p.go, p.q, p.k, p.v, p.o, p.of
    hq, hkv, sq, sk, causal = (shape[x] for x in ("hq", "hkv", "sq", "sk", "causal"))
    go()
    torch.cuda.synchronize()
    kr = k.float().repeat_interleave(hq // hkv, dim=1)
    vr = v.float().repeat_interleave(hq // hkv, dim=1)
    mask = reference_mask(shape, "cuda")  # bottom-right causal, and the sliding window where the shape has one
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), kr, vr, attn_mask=mask)
    err = (o.float() - ref).abs()
    unwritten = int(torch.isnan(o).sum())
    outside = of.float().clone()
    outside.as_strided(o.shape, o.stride()).fill_(float("nan"))
    written_outside = int(torch.isfinite(outside).sum())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        for _ in range(10):
            go()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 100.0)  # us per call, Python launch overhead included
    times.sort()
    # Checked again after those 200 launches, O poisoned first: a kernel that keeps state between
    # calls (a work counter, split semaphores: the ABI's "zero at launch, left zero") and fails to
    # reset it runs correctly once and then wrong.
    of.fill_(float("nan"))
    go()
    torch.cuda.synchronize()
    err_again = float((o.float() - ref).abs().max())
    unwritten = max(unwritten, int(torch.isnan(o).sum()))
    return max(float(err.max()), err_again), unwritten, written_outside, times[len(times) // 2], len(p.launches), p.maps_from


class NotRunnableHere(Exception):
    pass


def crt_include_dir():
    """A CUDA include folder holding crt/mma.h, or None. <mma.h> (the WMMA API the wmma
    template's kernels use) includes "crt/mma.h"; CuPy's own include folder may be the nvidia pip
    package's, which has mma.h but not crt/ (CuPy for CUDA 13 from pip, 2026-11-29: "cannot open
    source file crt/mma.h"). Looked for in CUDA_HOME, CUDA_PATH, the nvidia pip packages beside
    torch, /usr/local/cuda."""
    candidates = [os.path.join(os.environ[v], "include") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    site = os.path.dirname(os.path.dirname(torch.__file__))
    nvidia = os.path.join(site, "nvidia")
    if os.path.isdir(nvidia):
        candidates += [os.path.join(nvidia, sub, "include") for sub in sorted(os.listdir(nvidia))]
    candidates.append("/usr/local/cuda/include")
    return next((c for c in candidates if os.path.isfile(os.path.join(c, "crt", "mma.h"))), None)


def compile_options(kernel, device):
    """NVRTC options for the kernel's manifest `arch`; raises NotRunnableHere (the reason) when
    the kernel cannot run on this GPU. A plain arch (sm_90) is compiled for this GPU (CuPy picks it);
    an arch-specific one (sm_90a) only on a GPU of exactly that compute capability. CuPy appends
    its own -arch=sm_<cc>; NVRTC keeps the arch-specific sm_<cc>a over it."""
    options = ("-std=c++17",)
    crt = crt_include_dir()
    if crt:
        options += (f"--include-path={crt}",)
    arch = kernel.get("arch") or ""
    if kernel.get("arch_specific") or arch.endswith("a"):
        if not (arch.startswith("sm_") and arch.endswith("a") and arch[3:-1].isdigit()):
            raise NotRunnableHere(f"arch-specific kernel with arch {arch!r} in the manifest (expected e.g. sm_90a)")
        if int(arch[3:-1]) != device["cc"]:
            raise NotRunnableHere(f"compiled for {arch}, which runs only on compute capability "
                               f"{arch[3:-2]}.{arch[-2]}; this GPU is sm_{device['cc']}")
        options += (f"--gpu-architecture={arch}",)
    return options


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--extra-s", default="17,100",
                    help="also run each shape at these key lengths (SQ follows when SQ == SK)")
    args = ap.parse_args()
    if cp is None:
        sys.exit("this loader compiles the exported sources with CuPy's NVRTC: pip install cupy-cuda13x")
    manifest = json.load(open(os.path.join(args.dir, "manifest.json")))
    abi = Abi(manifest.get("format", 1))
    p = torch.cuda.get_device_properties(0)
    device = {"sms": p.multi_processor_count, "cc": p.major * 10 + p.minor,
              "smem_optin": getattr(p, "shared_memory_per_block_optin", 232448)}
    need_driver = abi.format >= 2 or any(k.get("tensor_maps") for k in manifest["kernels"])
    driver = Driver() if need_driver else None
    extra = [int(x) for x in args.extra_s.split(",") if x]
    failures = skipped = 0
    print(f"manifest format {abi.format}")
    print(f"{'kernel':<22} {'shape':<40} {'view':>6} {'launches':>8} {'maps':>8} {'max_abs':>9} {'unwritten':>9} "
          f"{'eager us':>9}")
    for kernel in manifest["kernels"]:
        src = open(os.path.join(args.dir, kernel["file"])).read()
        try:
            options = compile_options(kernel, device)
        except NotRunnableHere as e:
            print(f"{kernel['file']:<22} skipped: {e}")
            skipped += 1
            continue
        try:
            module = cp.RawModule(code=src, options=options, backend="nvrtc")
            for entry in kernel["shapes"]:
                for l in launches_for(abi, kernel, abi.shape(entry["shape"]), device)[1]:
                    module.get_function(l["kernel"])  # compiles and loads now, so errors show here
        except Exception as e:  # noqa: BLE001 - reported, and the next kernel runs
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            print(f"{kernel['file']:<22} FAIL: does not compile with {' '.join(options)}: {reason}")
            failures += 1
            continue
        for entry in kernel["shapes"]:
            base = abi.shape(entry["shape"])
            why = abi.refusal(kernel, base)
            if why:
                print(f"{kernel['file']:<22} {key_of(base):<40} refused: {why}")
                failures += 1  # the export paired a windowed shape with a kernel that ignores the window
                continue
            runs = [(base, 0, True)]
            if abi.format >= 2:
                runs.append((base, PAD, False))  # the same shape on padded (non-contiguous) views
            for sk in extra:
                sq = sk if base["sq"] == base["sk"] else min(base["sq"], sk)
                runs.append((dict(base, sq=sq, sk=sk), 0, False))
            for shape, pad, exported_view in runs:
                max_abs, unwritten, outside, us, n, maps_from = run_one(abi, module, kernel, entry, shape, device,
                                                                         driver, pad, exported_view)
                ok = unwritten == 0 and outside == 0 and max_abs <= ATOL.get(kernel["dtype"], 2e-2)
                failures += not ok
                print(f"{kernel['file']:<22} {key_of(shape):<40} {'padded' if pad else 'dense':>6} {n:>8} "
                      f"{maps_from:>8} {max_abs:>9.2e} {unwritten:>9} {us:>9.2f}"
                      + ("" if ok else f"  FAIL{f' ({outside} written outside O)' if outside else ''}"))
    print(("all exported kernels match SDPA" if failures == 0 else f"{failures} FAILED")
          + (f" ({skipped} kernels skipped: not runnable on this GPU)" if skipped else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
