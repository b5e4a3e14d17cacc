#!/usr/bin/env python3
"""A non-portable thread-block cluster of 16 for decode-cluster (issue 17 experiment; the template
keeps CLUSTER <= 8): how many clusters of 8 and 16 fit at once (cuOccupancyMaxActiveClusters), a
check of CLUSTER = 16 builds (the template's limit lifted in the rendered source, the function
given CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED), and their time against cluster 8.

    python3 scripts/decode_cluster16.py
"""
import sys, time
sys.path.insert(0, "scripts")
import check_templates_gpu as C
from nvrtc_compile_check import combo_label, load_templates
from cuda.bindings import driver as cu
gqa = C.gqa
_orig = C.build_source
C.build_source = lambda *a, **k: _orig(*a, **k).replace("#if CLUSTER < 1 || CLUSTER > 8", "#if CLUSTER < 1 || CLUSTER > 16")
ATTR = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
_kernel = C.Gpu.kernel
def kernel(self, mod, launch):
    fn = _kernel(self, mod, launch)
    err = cu.cuFuncSetAttribute(fn.kernel.ptr, ATTR, 1)[0]
    if int(err) != 0:
        print("  setattr", err, flush=True)
    return fn
C.Gpu.kernel = kernel
tpl = [t for t in load_templates() if t.rel == "decode_cluster.cu"][0]
gpu = C.Gpu()
import cupy as cp
m = cp.RawModule(code='extern "C" __global__ void k(float* p) { extern __shared__ float s[]; if (p) p[threadIdx.x] = s[threadIdx.x]; }')
h = m.get_function("k").kernel.ptr
print(cu.cuFuncSetAttribute(h, ATTR, 1)[0], cu.cuFuncSetAttribute(h, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 220 * 1024)[0])
for Cn in (8, 16):
    for kb in (100, 160, 220):
        cfg = cu.CUlaunchConfig(); cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = Cn * 16, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 128, 1, 1; cfg.sharedMemBytes = kb * 1024
        a = cu.CUlaunchAttribute(); a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = Cn, 1, 1
        cfg.attrs = [a]; cfg.numAttrs = 1
        err, n = cu.cuOccupancyMaxActiveClusters(h, cfg)
        print(f"cluster {Cn} smem {kb} KB: {n} clusters at once ({err})", flush=True)
pts = [dict(BLOCK_N=16, NUM_WARPS=4, STAGES=3, CLUSTER=8, COMBINE=1), dict(BLOCK_N=16, NUM_WARPS=8, STAGES=3, CLUSTER=8, COMBINE=0)] + \
      [dict(BLOCK_N=b, NUM_WARPS=w, STAGES=s, CLUSTER=16, COMBINE=0) for (b, w, s) in [(16, 4, 2), (16, 4, 3), (32, 2, 2), (16, 8, 2), (16, 8, 3)]]
t0 = time.time()
for kn in pts:
    if kn["CLUSTER"] != 16:
        continue
    for shape in [gqa(1, 32, 8, 1, 4000, 128, True, "bshd"), gqa(2, 8, 1, 4, 999, 128, True, padded=True)]:
        for dt in ("bf16",):
            try:
                ok, msg = gpu.check(tpl, kn, shape, dt)
            except Exception as e:
                ok, msg = False, f"{type(e).__name__}: {e}"
            print("check", combo_label(kn), C.shape_key(shape), ok, msg, flush=True)
for shape in [gqa(1, 32, 8, 1, 1024, 128, False), gqa(1, 32, 8, 1, 4096, 128, False), gqa(8, 32, 1, 1, 4096, 128, False), gqa(1, 32, 8, 1, 16384, 128, False)]:
    q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
    sdpa = C.time_torch_graph_us(gpu, C.sdpa_fn(gpu, shape, q, k, v), 10, 15)
    row = []
    for kn in pts:
        try:
            us = gpu.time_us(tpl, kn, shape, reps=10, samples=15)
            row.append(f"{combo_label(kn)}: {us:.2f}")
        except Exception as e:
            row.append(f"{combo_label(kn)}: {type(e).__name__} {str(e)[:80]}")
    print(f"{C.shape_key(shape)} sdpa {sdpa:.2f}\n   " + "\n   ".join(row), flush=True)
print(f"{time.time() - t0:.0f} s")
