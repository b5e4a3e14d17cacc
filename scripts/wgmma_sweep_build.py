#!/usr/bin/env python3
"""Build wgmma_tma.cu variants for sm_90a on this (CPU) machine, for scripts/wgmma_sweep.py.

    python3 scripts/wgmma_sweep_build.py '[{"BLOCK_N":176,"STAGES":2,"CONSUMERS":2,"PINGPONG":1,"OVERLAP":1,"PERSISTENT":1}]'

Writes .dev/cubins/v<i>-<fp16|bf16>-<timed|count>.cubin and variants.json (the count build
has -DOPTD_COUNT_CTAS=1). A variant with "FAULT": 1 is built with the planted fault
OPTD_FAULT_MBAR_PHASE (consumers skip the wait for the K tiles). Carry .dev to the GPU machine.
Prints ptxas spill lines and C75xx (wgmma serialization) notes of the fp16 timed builds.
"""
import sys, json
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import nvrtc_compile_check as ncc
from pathlib import Path
from concurrent.futures import ProcessPoolExecutor
out = Path(__file__).resolve().parent.parent / ".dev" / "cubins"
out.mkdir(parents=True, exist_ok=True)
def job(a):
    i, kn, bf16, count = a
    t = {t.rel: t for t in ncc.load_templates()}["wgmma_tma.cu"]
    nv = ncc.Nvrtc(ncc.default_nvrtc_lib())
    kn = dict(kn); fault = kn.pop("FAULT", 0)
    src = ncc.render(t, kn, bf16)
    if fault: src = "#define OPTD_FAULT_MBAR_PHASE 1\n" + src
    opts = ["--gpu-architecture=sm_90a", "-std=c++17", f"--include-path={ncc.default_cuda_include()}", "-Xptxas", "-v"]
    if count: opts.append("-DOPTD_COUNT_CTAS=1")
    ok, log, cubin = nv.compile(src, "wt.cu", opts)
    name = f"v{i}-{'bf16' if bf16 else 'fp16'}-{'count' if count else 'timed'}.cubin"
    if ok: (out / name).write_bytes(cubin)
    spill = [l.strip() for l in log.splitlines() if "spill" in l or "C75" in l]
    return name, ok, (spill[:2] if ok else log[-1500:])
if __name__ == "__main__":
    for f in out.glob("*"): f.unlink()
    variants = json.loads(sys.argv[1])
    jobs = [(i, kn, bf16, count) for i, kn in enumerate(variants) for bf16 in (False, True) for count in (False, True)]
    with ProcessPoolExecutor(2) as ex:
        for name, ok, info in ex.map(job, jobs):
            if not ok or "timed" in name and "fp16" in name: print(name, "ok" if ok else "FAIL", info)
    json.dump([{k: v for k, v in kn.items() if k != "FAULT"} for kn in variants], open(out / "variants.json", "w"))
