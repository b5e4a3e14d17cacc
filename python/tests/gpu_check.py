#!/usr/bin/env python3
"""GPU check of an installed package written by `optimizerd export --python` (run on the
device; CPU tests are test_package.py):

  1. correctness: every exported shape, in both layouts and on a padded (non-contiguous)
     view, and unseen shapes (other B / S of each class, an odd SK) against an fp32 SDPA
     reference with fresh randn inputs, output poisoned (NaN) first; the path each took;
     every causal shape also with a sliding window of a third of its keys (a kernel with
     "windows": true, or SDPA with the window's mask: never a kernel without windows), and
     windowed shapes (manifest format 3's "window") at their own window;
  2. a CUDA-graph capture and replay of a call, on a non-default stream;
  3. torch.compile(fullgraph=True) (Inductor) of a module calling it;
  4. the eager call overhead (host time per call, tight loop) against SDPA's on small
     shapes, where the kernels run in 2-3 us and the host decides the latency.

    python3 python/tests/gpu_check.py --package optimizerd_kernels [--json out.json]
Prints a table per part and exits 1 if any correctness check fails.
"""
import argparse
import importlib
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

ATOL = {torch.float16: 2e-2, torch.bfloat16: 4e-2}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def shape_of(s):
    if "h" in s:
        return dict(b=s["b"], hq=s["h"], hkv=s["h"], sq=s["s"], sk=s["s"], d=s["d"], causal=bool(s["causal"]),
                    layout="bhsd", dtype=s.get("dtype", "fp16"), window=0)
    return dict(b=s["b"], hq=s["hq"], hkv=s["hkv"], sq=s["sq"], sk=s["sk"], d=s["d"], causal=bool(s["causal"]),
                layout=s.get("layout", "bhsd"), dtype=s.get("dtype", "fp16"), window=int(s.get("window") or 0))


def tensors(sh, pad=0):
    """q, k, v in the shape's layout (rows `pad` elements apart beyond contiguous), and the
    same as [B,H,S,D] views for the reference."""
    dt = DTYPES[sh["dtype"]]

    def make(h, s):
        if sh["layout"] == "bhsd":
            base = torch.randn(sh["b"], h, s, sh["d"] + pad, device="cuda", dtype=dt)[..., :sh["d"]]
            return base, base
        base = torch.randn(sh["b"], s, h, sh["d"] + pad, device="cuda", dtype=dt)[..., :sh["d"]]
        return base, base.transpose(1, 2)

    (q, qh), (k, kh), (v, vh) = make(sh["hq"], sh["sq"]), make(sh["hkv"], sh["sk"]), make(sh["hkv"], sh["sk"])
    return (q, k, v), (qh, kh, vh)


def reference(qh, kh, vh, causal, window=0):
    """fp32 SDPA, bottom-right causal; with a sliding window, row i (position p = i + Sk - Sq)
    sees keys p - window < j <= p."""
    g = qh.shape[1] // kh.shape[1]
    kr, vr = kh.float().repeat_interleave(g, 1), vh.float().repeat_interleave(g, 1)
    mask = None
    if causal:
        sq, sk = qh.shape[2], kh.shape[2]
        ones = torch.ones(sq, sk, dtype=torch.bool, device="cuda")
        mask = ones.tril(sk - sq)
        if window:
            mask &= ones.triu(sk - sq - window + 1)
    return F.scaled_dot_product_attention(qh.float(), kr, vr, attn_mask=mask)


def key_of(sh):
    heads = f"h{sh['hq']}" if sh["hq"] == sh["hkv"] else f"hq{sh['hq']}hkv{sh['hkv']}"
    rows = f"s{sh['sq']}" if sh["sq"] == sh["sk"] else f"sq{sh['sq']}sk{sh['sk']}"
    return (f"b{sh['b']}{heads}{rows}d{sh['d']}" + ("-causal" if sh["causal"] else "")
            + (f"-w{sh['window']}" if sh.get("window") else "") + f"-{sh['dtype']}-{sh['layout']}")


def correctness(pkg, manifest):
    rows, failures = [], 0
    seen = set()
    cases = []
    for k in manifest["kernels"]:
        for s in k["shapes"]:
            sh = shape_of(s["shape"])
            other = "bshd" if sh["layout"] == "bhsd" else "bhsd"
            cases += [("tuned", sh, 0), ("tuned, other layout", dict(sh, layout=other), 0), ("tuned, padded", sh, 64)]
            # Unseen shapes of the class: half the batch, an odd key length.
            if sh["sq"] == sh["sk"]:
                n = max(17, sh["sq"] // 2 + 3)
                cases.append(("unseen", dict(sh, b=max(1, sh["b"] // 2), sq=n, sk=n), 0))
            else:
                cases.append(("unseen", dict(sh, b=max(1, sh["b"] // 2), sk=sh["sk"] // 2 + 5), 0))
            if sh["causal"] and not sh["window"]:  # a window on a shape tuned without one
                cases.append(("windowed", dict(sh, window=max(1, sh["sk"] // 3)), 0))
    cases.append(("unseen class", dict(b=1, hq=6, hkv=3, sq=40, sk=40, d=80, causal=False, layout="bhsd",
                                       dtype="bf16"), 0))
    cases.append(("fp32 input", dict(b=1, hq=4, hkv=4, sq=64, sk=64, d=64, causal=True, layout="bhsd",
                                     dtype="bf16", fp32=True), 0))
    for what, sh, pad in cases:
        tag = (what, key_of(sh), pad)
        if tag in seen:
            continue
        seen.add(tag)
        torch.manual_seed(len(seen))
        (q, k, v), (qh, kh, vh) = tensors(sh, pad)
        if sh.get("fp32"):
            q, k, v, qh, kh, vh = (t.float() for t in (q, k, v, qh, kh, vh))
        w = sh.get("window", 0)
        route = pkg.explain(q, k, v, causal=sh["causal"], layout=sh["layout"], window=w)
        o = pkg.attention(q, k, v, causal=sh["causal"], layout=sh["layout"], window=w)
        oh = o if sh["layout"] == "bhsd" else o.transpose(1, 2)
        ref = reference(qh, kh, vh, sh["causal"], w)
        # A windowed call must never run a kernel whose template does not implement windows.
        entry = next((kk for kk in manifest["kernels"] if kk["file"] == route["kernel"]), None)
        wrong = bool(w and entry is not None and not entry.get("windows"))
        if wrong:
            route = dict(route, reason=f"WRONG: {route['kernel']} has \"windows\": false; {route['reason']}")
        err = (oh.float() - ref).abs().max().item()
        tol = ATOL.get(q.dtype, 1e-4)
        ok = math.isfinite(err) and err <= tol and o.is_contiguous() and not wrong
        failures += not ok
        rows.append(dict(case=what, shape=key_of(sh) + (f" pad{pad}" if pad else ""), path=route["path"],
                         kernel=route["kernel"], max_abs=err, ok=ok, reason=route["reason"]))
    return rows, failures


def graphs_and_streams(pkg, sh):
    (q, k, v), (qh, kh, vh) = tensors(sh)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # a non-default stream (and the warm-up that resolves the plan)
        side = pkg.attention(q, k, v, causal=sh["causal"], layout=sh["layout"])
    torch.cuda.current_stream().wait_stream(stream)
    side_h = side if sh["layout"] == "bhsd" else side.transpose(1, 2)
    side_err = (side_h.float() - reference(qh, kh, vh, sh["causal"])).abs().max().item()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pkg.attention(q, k, v, causal=sh["causal"], layout=sh["layout"])
    for t in (q, k, v):  # fresh inputs in place: the replay must read them
        t.copy_(torch.randn_like(t))
    ref = reference(*(tensors_as_bhsd(t, sh["layout"]) for t in (q, k, v)), sh["causal"])
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    oh = out if sh["layout"] == "bhsd" else out.transpose(1, 2)
    return side_err, (oh.float() - ref).abs().max().item()


def tensors_as_bhsd(t, layout):
    return t if layout == "bhsd" else t.transpose(1, 2)


def compiled(pkg, sh):
    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            return pkg.attention(q * 1.0, k, v, causal=sh["causal"], layout=sh["layout"]).float().sum(-1)

    (q, k, v), _ = tensors(sh)
    block = Block()
    fn = torch.compile(block, fullgraph=True)
    got = fn(q, k, v)
    want = block(q, k, v)
    return (got - want).abs().max().item()


def overhead(pkg, shapes, n=200):
    """Host microseconds per eager call: the time to enqueue n calls (no sync inside; the
    GPU queue holds them), best of 7 — what the host adds to every call whatever the GPU
    time — ours vs SDPA's default on the same tensors."""
    rows = []
    for sh in shapes:
        (q, k, v), (qh, kh, vh) = tensors(sh)
        gqa = sh["hq"] != sh["hkv"]
        calls = {
            "optimizerd": lambda: pkg.attention(q, k, v, causal=sh["causal"], layout=sh["layout"]),
            "op direct": lambda: OP(q, k, v, sh["causal"], None, sh["layout"]),
            "sdpa": lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=sh["causal"], enable_gqa=gqa),
        }
        row = dict(shape=key_of(sh), path=pkg.explain(q, k, v, causal=sh["causal"], layout=sh["layout"])["path"])
        for name, fn in calls.items():
            for _ in range(50):
                fn()
            best = float("inf")
            for _ in range(7):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                best = min(best, (time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
            row[name] = best
        rows.append(row)
    return rows


def main():
    global OP
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--package", default="optimizerd_kernels")
    ap.add_argument("--json")
    args = ap.parse_args()
    # Check every exported kernel, also on shapes where SDPA won the run's closing comparison
    # (the package would run SDPA there).
    os.environ.setdefault("OPTIMIZERD_ALWAYS_KERNELS", "1")
    pkg = importlib.import_module(args.package)
    OP = getattr(torch.ops, args.package).attention.default
    info = pkg.info()
    print(f"package {info['package']} from run {info['run']} ({info['gpu']}); launcher: {info['launcher']} "
          f"{info['launcher_error'] or ''}")
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    manifest = pkg._op.dispatcher().manifest
    rows, failures = correctness(pkg, manifest)
    print("\n## correctness (fp32 SDPA reference, fresh randn)")
    print(f"{'case':<20} {'shape':<52} {'path':<9} {'kernel':<26} {'max_abs':>9}  ok")
    for r in rows:
        print(f"{r['case']:<20} {r['shape']:<52} {r['path']:<9} {str(r['kernel']):<26} {r['max_abs']:>9.2e}  "
              f"{'ok' if r['ok'] else 'FAIL'}" + (f"  ({r['reason'][:90]})" if r["path"] == "fallback" else ""))
    first = shape_of(manifest["kernels"][0]["shapes"][0]["shape"])
    s_err, g_err = graphs_and_streams(pkg, first)
    c_err = compiled(pkg, first)
    print(f"\n## a call on a non-default stream: max_abs {s_err:.2e}")
    print(f"## CUDA graph (captured after that warm-up, replayed on fresh inputs): max_abs {g_err:.2e}")
    print(f"## torch.compile(fullgraph=True, inductor) vs eager: max_abs {c_err:.2e}")
    graph_ok = max(s_err, g_err) <= ATOL[DTYPES[first["dtype"]]]
    compile_ok = c_err <= 1e-2 * max(1, first["d"])
    small = [dict(b=1, hq=8, hkv=8, sq=128, sk=128, d=64, causal=False, layout="bhsd", dtype="bf16"),
             dict(b=1, hq=32, hkv=8, sq=1, sk=1024, d=128, causal=False, layout="bhsd", dtype="bf16")]
    small += [first]
    over = overhead(pkg, small)
    print("\n## eager host overhead: us per call to enqueue 200 calls (no sync), best of 7")
    print(f"{'shape':<52} {'path':<9} {'attention()':>12} {'torch.ops':>10} {'sdpa':>8}")
    for r in over:
        print(f"{r['shape']:<52} {r['path']:<9} {r['optimizerd']:>12.2f} {r['op direct']:>10.2f} {r['sdpa']:>8.2f}")
    stats = pkg.stats()
    print(f"\ncalls per path: exact {stats['exact']}, class {stats['class']}, fallback {stats['fallback']}")
    ok = failures == 0 and graph_ok and compile_ok
    print(("PASS" if ok else f"FAIL ({failures} correctness failures, graph ok {graph_ok}, compile ok {compile_ok})"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(correctness=rows, stream_max_abs=s_err, graph_max_abs=g_err, compile_max_abs=c_err, overhead=over,
                           stats=stats, info=info), f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
