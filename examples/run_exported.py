#!/usr/bin/env python3
"""Load kernels exported by `optimizerd export --out DIR` with CuPy and check them
against PyTorch SDPA.

    python3 examples/run_exported.py DIR [--extra-s 17,100]

For every kernel in DIR/manifest.json and every shape it is the best for (plus the same
shape at the extra sequence lengths, to show the launch formulas work for any S), the
launch geometry is computed from the manifest's formulas (Jinja2 expressions over
B, H, S, D, CAUSAL, SMS, ...), the kernels run in order on fresh randn inputs, and the
output is compared with torch's scaled_dot_product_attention in fp32. Needs cupy and torch.
"""
import argparse
import json
import math
import os
import sys

import cupy as cp
import jinja2
import torch


def evaluator(env_vars):
    env = jinja2.Environment()
    env.globals.update(cdiv=lambda a, b: -(-a // b), min=min, max=max)

    def ev(expr):
        v = env.compile_expression(expr)(**env_vars)
        return int(v) if not isinstance(v, bool) else v
    return ev


def launches_for(kernel, shape, device):
    props = device
    vars_ = dict(kernel["params"])
    vars_.update(B=shape["b"], H=shape["h"], S=shape["s"], D=shape["d"], CAUSAL=int(shape["causal"]),
                 ELEM_BYTES=2, SMS=props["sms"], SMEM_OPTIN=props["smem_optin"], CC=props["cc"])
    ev = evaluator(vars_)
    for name, expr in kernel["derived"]:
        vars_[name] = ev(expr)
        ev = evaluator(vars_)
    out = []
    for l in kernel["launches"]:
        if l.get("when") and not ev(l["when"]):
            continue
        out.append({"kernel": l["kernel"].replace("{D}", str(shape["d"])),
                    "grid": tuple(ev(g) for g in l["grid"]), "block": tuple(ev(b) for b in l["block"]),
                    "smem": ev(l["dyn_smem"])})
    return vars_.get("splits", 1), out


def run_one(module, kernel, shape, device):
    dtype = torch.bfloat16 if kernel["dtype"] == "bf16" else torch.float16
    b, h, s, d, causal = shape["b"], shape["h"], shape["s"], shape["d"], bool(shape["causal"])
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    splits, launches = launches_for(kernel, shape, device)
    o_part = torch.empty(max(1, splits * b * h * s * d), device="cuda", dtype=torch.float32)
    lse = torch.empty(max(1, splits * b * h * s), device="cuda", dtype=torch.float32)
    counter = torch.zeros(1, device="cuda", dtype=torch.int32)
    ptr = lambda t: cp.uint64(t.data_ptr())  # device pointers are 8-byte kernel arguments
    args = (ptr(q), ptr(k), ptr(v), ptr(o), ptr(o_part), ptr(lse),
            cp.int32(b), cp.int32(h), cp.int32(s), cp.int32(splits), cp.float32(1.0 / math.sqrt(d)),
            cp.int32(int(causal)), ptr(counter))
    fns = []
    for l in launches:
        fn = module.get_function(l["kernel"])
        if l["smem"] > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = l["smem"]
        fns.append((fn, l))

    def go():
        for fn, l in fns:
            fn(l["grid"], l["block"], args, shared_mem=l["smem"])
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
        times.append(start.elapsed_time(end) * 100.0)  # us per call, CuPy launch overhead included
    times.sort()
    return float(err.max()), unwritten, times[len(times) // 2], len(launches)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--extra-s", default="17,100")
    args = ap.parse_args()
    manifest = json.load(open(os.path.join(args.dir, "manifest.json")))
    p = torch.cuda.get_device_properties(0)
    device = {"sms": p.multi_processor_count, "cc": p.major * 10 + p.minor,
              "smem_optin": getattr(p, "shared_memory_per_block_optin", 232448)}
    extra = [int(x) for x in args.extra_s.split(",") if x]
    failures = 0
    print(f"{'kernel':<22} {'shape':<26} {'launches':>8} {'max_abs':>9} {'unwritten':>9} {'eager us':>9}")
    for kernel in manifest["kernels"]:
        src = open(os.path.join(args.dir, kernel["file"])).read()
        module = cp.RawModule(code=src, options=("-std=c++17",), backend="nvrtc")
        for entry in kernel["shapes"]:
            base = entry["shape"]
            for s in [base["s"]] + extra:
                shape = dict(base, s=s)
                max_abs, unwritten, us, n = run_one(module, kernel, shape, device)
                ok = unwritten == 0 and max_abs <= 2e-2
                failures += not ok
                key = f"b{shape['b']}h{shape['h']}s{s}d{shape['d']}{'-causal' if shape['causal'] else ''}"
                print(f"{kernel['file']:<22} {key:<26} {n:>8} {max_abs:>9.2e} {unwritten:>9} {us:>9.2f}{'' if ok else '  FAIL'}")
    print("all exported kernels match SDPA" if failures == 0 else f"{failures} FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
