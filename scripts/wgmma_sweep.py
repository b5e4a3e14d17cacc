#!/usr/bin/env python3
"""Sweep wgmma_tma.cu variants on a Hopper GPU (the kernel author's loop; the daemon and
scripts/check_templates_gpu.py are the production paths).

    python3 scripts/wgmma_sweep.py all|check|time [big]   # big: also check two large causal shapes
    python3 scripts/wgmma_sweep.py profile I B,H,S,D,CAUSAL   # 3 launches of variant I, for ncu

Loads .dev/cubins built by scripts/wgmma_sweep_build.py (no compiler needed there), encodes
the q/k/v tensor maps with cuTensorMapEncodeTiled (cuda.bindings) in the daemon's 4-D
convention and launches through the driver API.
  check: every variant x fp16/bf16 x ragged/causal shapes against fp32 SDPA, O poisoned with
         NaN, CTAs counted by the check build; prints failures and a count.
  time:  fp16, CUDA-graph replay of 10 launches, median of 30 samples, next to SDPA's cuDNN
         and flash backends timed the same way in the same process; TFLOPS = 4 B H S^2 D / t,
         halved for causal.
"""
import ctypes, json, math, os, statistics, sys, time
from pathlib import Path
import torch, torch.nn.functional as F
from cuda.bindings import driver as cu

torch.backends.cuda.matmul.allow_tf32 = False
D_ = Path(__file__).resolve().parent.parent / ".dev" / "cubins"
variants = json.load(open(D_ / "variants.json"))
torch.cuda.init(); torch.zeros(1, device="cuda")
def ck(r):
    err = r[0] if isinstance(r, tuple) else r
    if err != cu.CUresult.CUDA_SUCCESS: raise RuntimeError(str(err))
    return r[1] if isinstance(r, tuple) and len(r) == 2 else r[1:] if isinstance(r, tuple) else None
mods = {}
def fn(i, dt, count, d):
    key = (i, dt, count)
    if key not in mods:
        mods[key] = ck(cu.cuModuleLoadData((D_ / f"v{i}-{dt}-{'count' if count else 'timed'}.cubin").read_bytes()))
    return ck(cu.cuModuleGetFunction(mods[key], f"optd_fwd_d{d}".encode()))

def tmap(t, rows):
    b, h, s, d = t.shape
    P = 64
    dims = [cu.cuuint64_t(x) for x in (P, s, d // P, b * h)]
    strides = [cu.cuuint64_t(x) for x in (d * 2, P * 2, s * d * 2)]
    box = [cu.cuuint32_t(x) for x in (P, rows, d // P, 1)]
    es = [cu.cuuint32_t(1)] * 4
    return ck(cu.cuTensorMapEncodeTiled(cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, t.data_ptr(), dims, strides, box, es,
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B, cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))

class SkipShape(Exception):
    pass

class Launch:
    def __init__(self, kn, f, q, k, v, o, causal, counter):
        b, h, s, d = q.shape
        C, BN, ST = kn["CONSUMERS"], kn["BLOCK_N"], kn["STAGES"]
        self.grid = (math.ceil(s / (64 * C)), b * h, 1)
        if kn.get("PERSISTENT"): self.grid = (min(self.grid[0] * b * h, 132), 1, 1)
        self.block = (128 * (C + 1), 1, 1)
        self.smem = 1024 + 2 * d * (64 * C + 2 * ST * BN)
        if self.smem > 232448 - 128: raise SkipShape(f"smem {self.smem}")
        ck(cu.cuFuncSetAttribute(f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem))
        self.f = f
        self.maps = [tmap(q, 64), tmap(k, BN), tmap(v, BN)]
        self.vals = [ctypes.c_uint64(q.data_ptr()), ctypes.c_uint64(k.data_ptr()), ctypes.c_uint64(v.data_ptr()), ctypes.c_uint64(o.data_ptr()),
                     ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_int32(b), ctypes.c_int32(h), ctypes.c_int32(s), ctypes.c_int32(1),
                     ctypes.c_float(1 / math.sqrt(d)), ctypes.c_int32(int(causal)), ctypes.c_uint64(counter)]
        ptrs = [ctypes.addressof(x) for x in self.vals] + [m.getPtr() for m in self.maps]
        self.params = (ctypes.c_void_p * len(ptrs))(*ptrs)
    def __call__(self, stream=0):
        ck(cu.cuLaunchKernel(self.f, *self.grid, *self.block, self.smem, stream, ctypes.addressof(self.params), 0))

counter = torch.zeros(1, dtype=torch.int32, device="cuda")
SHAPES = [(1,1,1,64,False),(1,1,17,64,True),(1,1,100,128,True),(1,1,128,64,False),(2,8,128,64,False),(1,2,1000,64,True),(1,1,4097,128,False),
          (4,16,1024,64,True),(3,5,1000,64,True),(2,7,555,128,False),(1,1,65,64,True),(2,3,333,64,True),(1,2,1000,128,True),(1,1,4097,64,True),(1,2,4097,128,True),(1,1,1,128,True),(1,3,100,64,False)]
BIG = [(4,16,4096,64,False),(4,16,4096,64,True),(2,16,8192,128,False),(2,16,8192,128,True)]
mode = sys.argv[1] if len(sys.argv) > 1 else "all"
def check(i, kn, shape, dt):
    b, h, s, d, causal = shape
    tdt = torch.float16 if dt == "fp16" else torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(hash((shape, dt)) & 0xffff)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=g).to(tdt) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    counter.zero_()
    L = Launch(kn, fn(i, dt, True, d), q, k, v, o, causal, counter.data_ptr())
    L(); torch.cuda.synchronize()
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    ran = int(counter.item()); planned = L.grid[0] * L.grid[1]
    bad = int((~torch.isfinite(o.float())).sum())
    err = float((o.float() - ref).abs().max()) if bad == 0 else float("nan")
    ok = ran == planned and bad == 0 and err <= (2e-2 if dt == "fp16" else 6e-2)
    return ok, f"ctas {ran}/{planned} nonfinite {bad} max_abs {err:.2e}"

def gtime(fn_, reps=10, samples=30):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn_(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(reps): fn_()
    for _ in range(3): g.replay()
    ts = []
    for _ in range(samples):
        a, b_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b_.record(); b_.synchronize(); ts.append(a.elapsed_time(b_) * 1000 / reps)
    return statistics.median(ts)

def time_variant(i, kn, shape):
    b, h, s, d, causal = shape
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
    o = torch.empty_like(q)
    L = Launch(kn, fn(i, "fp16", False, d), q, k, v, o, causal, 0)
    us = gtime(lambda: L(torch.cuda.current_stream().cuda_stream))
    fl = 4 * b * h * s * s * d / (2 if causal else 1)
    return us, fl / us / 1e6

fails = 0; nchk = 0
if mode in ("all", "check"):
    for i, kn in enumerate(variants):
        for dt in ("fp16", "bf16"):
            for shape in SHAPES + ([BIG[1], BIG[3]] if len(sys.argv) > 2 else []):
                try:
                    ok, msg = check(i, kn, shape, dt)
                except SkipShape:
                    continue
                except Exception as e:
                    ok, msg = False, f"EXC {e}"
                nchk += 1
                if not ok:
                    fails += 1
                    print(f"FAIL v{i} {kn} {dt} {shape}: {msg}", flush=True)
    print(f"correctness: {nchk} checks, {fails} failures", flush=True)
rows = []
if mode in ("all", "time"):
    sd = {}
    for shape in BIG:
        b, h, s, d, causal = shape
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
        from torch.nn.attention import sdpa_kernel, SDPBackend
        for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
            with sdpa_kernel(be):
                us = gtime(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            fl = 4 * b * h * s * s * d / (2 if causal else 1)
            sd[(shape, be.name)] = (us, fl / us / 1e6)
    for i, kn in enumerate(variants):
        for shape in BIG:
            try:
                us, tf = time_variant(i, kn, shape)
            except SkipShape:
                continue
            except Exception as e:
                print("time fail", i, shape, e); continue
            rows.append((i, kn, shape, us, tf, sd[(shape, "CUDNN_ATTENTION")][1], sd[(shape, "FLASH_ATTENTION")][1]))
    print("variant | shape | us | TFLOPS | cudnn TFLOPS | flash TFLOPS | x cudnn")
    for i, kn, shape, us, tf, tc, tfl in rows:
        print(f"v{i} {json.dumps(kn)} | {shape} | {us:.1f} | {tf:.1f} | {tc:.1f} | {tfl:.1f} | {tf/tc:.2f}x")

if mode == "profile":
    # one variant (argv[2]) on one shape (argv[3] = "b,h,s,d,causal"), launched 3 times for ncu
    i = int(sys.argv[2]); b, h, s, d, c = (int(x) for x in sys.argv[3].split(","))
    kn = variants[i]
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
    o = torch.empty_like(q)
    L = Launch(kn, fn(i, "fp16", False, d), q, k, v, o, bool(c), 0)
    for _ in range(3): L()
    torch.cuda.synchronize(); print("profiled", kn, (b, h, s, d, c))

if mode == "burst":
    # Does the length of a timed burst change the answer (clocks under sustained load)?
    # Variant argv[2] and SDPA cuDNN on the large shapes, graphs of 2 and of 20 launches.
    from torch.nn.attention import sdpa_kernel, SDPBackend
    i = int(sys.argv[2]); kn = variants[i]
    print("shape | launches per graph | ours us | cudnn us | ratio")
    for shape in BIG:
        b, h, s, d, causal = shape
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
        o = torch.empty_like(q)
        L = Launch(kn, fn(i, "fp16", False, d), q, k, v, o, causal, 0)
        for reps in (2, 20, 2):
            ours = gtime(lambda: L(torch.cuda.current_stream().cuda_stream), reps=reps)
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                ref = gtime(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), reps=reps)
            print(f"{shape} | {reps} | {ours:.1f} | {ref:.1f} | {ref / ours:.3f}x", flush=True)
