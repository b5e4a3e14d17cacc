#!/usr/bin/env python3
"""Load kernels exported by `optimizerd export --out DIR` with CuPy and check them
against PyTorch SDPA.

    python3 examples/run_exported.py DIR [--extra-s 17,100]

For every kernel in DIR/manifest.json and every shape it is the best for (plus the same
shape at the extra sequence lengths, to show the launch formulas work for any S), the
launch geometry is computed from the manifest's formulas (Jinja2 expressions over
B, H, S, D, CAUSAL, SMS, ...), the kernels run in order on fresh randn inputs, and the
output is compared with torch's scaled_dot_product_attention in fp32. Needs cupy and torch.

Kernels of Hopper templates differ in two ways, both said by the manifest:
  - `arch` (e.g. "sm_90a"): the NVRTC target they are compiled for. An arch-specific
    target (ending in "a") runs only on a GPU of exactly that compute capability; on
    another GPU such a kernel is skipped, with the reason printed.
  - `tensor_maps`: after the 13 ABI arguments the kernel takes one CUtensorMap (128 bytes,
    by value) per map, in `param_index` order. Each is encoded with cuTensorMapEncodeTiled
    over the q/k/v/o tensor it names, for the shape being run:
      * an exported shape: from that shape's resolved entry in the manifest
        (column "maps": manifest);
      * the extra sequence lengths, which the manifest does not list: from the kernel's
        tensor_maps formulas (the fixed convention dims {P, S, D/P, B*H}, byte strides
        {2D, 2P, 2SD}, box {P, box_rows, D/P, 1}, P = swizzle_bytes / 2, written as
        expressions of B, H, S, D and the knobs), evaluated like the launch formulas
        (column "maps": formulas).
    CuPy's RawKernel call cannot pass a 128-byte struct, so these kernels are launched with
    the CUDA driver API's cuLaunchKernel, from cuda-bindings (pip install cuda-bindings).
"""
import argparse
import ctypes
import json
import math
import os
import sys

import cupy as cp
import jinja2
import torch

ABI_PARAMS = 13  # q k v o o_partial lse_partial batch heads seq_len n_splits softmax_scale causal cta_counter
ATOL = {"fp16": 2e-2, "bf16": 6e-2}


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


def launches_for(kernel, shape, device):
    """(n_splits, launches, variables): the kernel's launches for `shape`, and the variables
    (knobs, shape, device, derived values) its formulas are evaluated with."""
    vars_ = dict(kernel["params"])
    vars_.update(B=shape["b"], H=shape["h"], S=shape["s"], D=shape["d"], CAUSAL=int(shape["causal"]),
                 ELEM_BYTES=2, SMS=device["sms"], SMEM_OPTIN=device["smem_optin"], CC=device["cc"])
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
def same_shape(a, b):
    return all(a[k] == b[k] for k in ("b", "h", "s", "d")) and bool(a["causal"]) == bool(b["causal"])


def tensor_maps_for(kernel, entry, shape, vars_):
    """(maps, where from): the kernel's tensor maps for `shape`, with numbers: the manifest's
    resolved entry when `shape` is the exported shape `entry`, else the kernel's formulas."""
    if not kernel.get("tensor_maps"):
        return [], "-"
    if same_shape(entry["shape"], shape) and entry.get("tensor_maps"):
        maps, source = entry["tensor_maps"], "manifest"
    else:
        ev = evaluator(vars_)
        maps = [dict(m, dims=[ev(x) for x in m["dims"]], strides_bytes=[ev(x) for x in m["strides_bytes"]],
                     box=[ev(x) for x in m["box"]]) for m in kernel["tensor_maps"]]
        source = "formulas"
    maps = sorted(maps, key=lambda m: m["param_index"])
    if [m["param_index"] for m in maps] != list(range(ABI_PARAMS, ABI_PARAMS + len(maps))):
        raise ValueError(f"tensor map param_index {[m['param_index'] for m in maps]}: expected 13, 14, ...")
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


def run_one(module, kernel, entry, shape, device, driver):
    dtype = torch.bfloat16 if kernel["dtype"] == "bf16" else torch.float16
    b, h, s, d, causal = shape["b"], shape["h"], shape["s"], shape["d"], bool(shape["causal"])
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    splits, launches, vars_ = launches_for(kernel, shape, device)
    o_part = torch.empty(max(1, splits * b * h * s * d), device="cuda", dtype=torch.float32)
    lse = torch.empty(max(1, splits * b * h * s), device="cuda", dtype=torch.float32)
    counter = torch.zeros(1, device="cuda", dtype=torch.int32)
    fns = []
    for l in launches:
        fn = module.get_function(l["kernel"])
        if l["smem"] > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = l["smem"]
        fns.append((fn, l))
    maps, maps_from = tensor_maps_for(kernel, entry, shape, vars_)

    if not maps:  # CuPy passes the 13 ABI arguments itself
        ptr = lambda t: cp.uint64(t.data_ptr())  # device pointers are 8-byte kernel arguments
        args = (ptr(q), ptr(k), ptr(v), ptr(o), ptr(o_part), ptr(lse),
                cp.int32(b), cp.int32(h), cp.int32(s), cp.int32(splits), cp.float32(1.0 / math.sqrt(d)),
                cp.int32(int(causal)), ptr(counter))

        def go():
            for fn, l in fns:
                fn(l["grid"], l["block"], args, shared_mem=l["smem"])
    else:  # the driver API: kernelParams[i] points at the value of parameter i
        values = [ctypes.c_uint64(t.data_ptr()) for t in (q, k, v, o, o_part, lse)] + [
            ctypes.c_int32(b), ctypes.c_int32(h), ctypes.c_int32(s), ctypes.c_int32(splits),
            ctypes.c_float(1.0 / math.sqrt(d)), ctypes.c_int32(int(causal)), ctypes.c_uint64(counter.data_ptr())]
        pointers = [ctypes.addressof(x) for x in values]
        tensors = {"q": q, "k": k, "v": v, "o": o}
        for m in maps:  # q, k, v, o are contiguous [B, H, S, D]: the maps' convention
            storage, address = driver.encode(m, tensors[m["tensor"]].data_ptr())
            values.append(storage)  # keeps the 128 bytes alive
            pointers.append(address)
        kernel_params = (ctypes.c_void_p * len(pointers))(*pointers)

        def go():
            stream = torch.cuda.current_stream().cuda_stream
            for fn, l in fns:
                driver.launch(fn, l, stream, ctypes.addressof(kernel_params))

    go()
    torch.cuda.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    err = (o.float() - ref).abs()
    unwritten = int(torch.isnan(o).sum())
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
    return float(err.max()), unwritten, times[len(times) // 2], len(launches), maps_from


class NotRunnableHere(Exception):
    pass


def compile_options(kernel, device):
    """NVRTC options for the kernel's manifest `arch`; raises NotRunnableHere (the reason) when
    the kernel cannot run on this GPU. A plain arch (sm_90) is compiled for this GPU (CuPy picks it);
    an arch-specific one (sm_90a) only on a GPU of exactly that compute capability. CuPy appends
    its own -arch=sm_<cc>; NVRTC keeps the arch-specific sm_<cc>a over it."""
    options = ("-std=c++17",)
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
    ap.add_argument("--extra-s", default="17,100")
    args = ap.parse_args()
    manifest = json.load(open(os.path.join(args.dir, "manifest.json")))
    p = torch.cuda.get_device_properties(0)
    device = {"sms": p.multi_processor_count, "cc": p.major * 10 + p.minor,
              "smem_optin": getattr(p, "shared_memory_per_block_optin", 232448)}
    driver = Driver() if any(k.get("tensor_maps") for k in manifest["kernels"]) else None
    extra = [int(x) for x in args.extra_s.split(",") if x]
    failures = skipped = 0
    print(f"{'kernel':<22} {'shape':<26} {'launches':>8} {'maps':>8} {'max_abs':>9} {'unwritten':>9} {'eager us':>9}")
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
                for l in launches_for(kernel, entry["shape"], device)[1]:
                    module.get_function(l["kernel"])  # compiles and loads now, so errors show here
        except Exception as e:  # noqa: BLE001 - reported, and the next kernel runs
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            print(f"{kernel['file']:<22} FAIL: does not compile with {' '.join(options)}: {reason}")
            failures += 1
            continue
        for entry in kernel["shapes"]:
            base = entry["shape"]
            for s in [base["s"]] + extra:
                shape = dict(base, s=s)
                max_abs, unwritten, us, n, maps_from = run_one(module, kernel, entry, shape, device, driver)
                ok = unwritten == 0 and max_abs <= ATOL.get(kernel["dtype"], 2e-2)
                failures += not ok
                key = f"b{shape['b']}h{shape['h']}s{s}d{shape['d']}{'-causal' if shape['causal'] else ''}"
                print(f"{kernel['file']:<22} {key:<26} {n:>8} {maps_from:>8} {max_abs:>9.2e} {unwritten:>9} "
                      f"{us:>9.2f}{'' if ok else '  FAIL'}")
    print(("all exported kernels match SDPA" if failures == 0 else f"{failures} FAILED")
          + (f" ({skipped} kernels skipped: not runnable on this GPU)" if skipped else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
