#!/usr/bin/env python3
"""Does a decode kernel's HBM bandwidth depend on how hot the GPU has run (issue 17)? The daemon's
LLM benchmark times B 8 x SK 4096 decode ~1.7% slower than scripts/decode_cold.py does on the same
kernel (47.24 against 46.4 us; SDPA 52.0 against 50.8), after minutes of prefill candidates; the
kernels' SASS is the same in bf16 and fp16. This times the LLM run's B 8 x SK 4096 winner and SDPA
default cold (decode_cold's harness) with the GPU idle, then right after a load phase (bf16 GEMMs
and device-to-device copies, back to back for --load-s seconds), then again after --cool-s idle
seconds, printing nvidia-smi's GPU and memory temperatures, SM and memory clocks and power beside
every measurement.

    python3 scripts/decode_thermal.py OUT.json [--load-s 60] [--cool-s 60] [--rounds 3]
"""
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, "scripts")
import decode_cold as DC  # noqa: E402

SHAPE = DC.gqa(8, 32, 8, 1, 4096, 128, True)
POINT = dict(BLOCK_N=16, CLUSTER=2, COMBINE=2, M_TILES=1, NUM_WARPS=4, STAGES=4, WARP_LOADS=0)
SMI = "temperature.gpu,temperature.memory,clocks.sm,clocks.mem,power.draw,clocks_event_reasons.active"


def smi() -> str:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={SMI}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        out = f"nvidia-smi failed: {e}"
    return out


def measure(phase: str, rounds: int, rows: list):
    kv = 2 * SHAPE.b * SHAPE.hkv * SHAPE.sk * SHAPE.d * 2
    for r in range(rounds):
        before = smi()
        ours = DC.time_cold_us(DC.cluster, POINT, SHAPE)
        sdpa = DC.sdpa_cold_us(SHAPE)
        after = smi()
        rows.append(dict(phase=phase, round=r, ours_us=ours, sdpa_us=sdpa, smi_before=before, smi_after=after))
        print(f"{phase:<12} round {r}: ours {ours:7.2f} us ({kv / ours / 1e6:.3f} TB/s)  SDPA {sdpa:7.2f} us  "
              f"ratio {sdpa / ours:.3f} | {before} -> {after}", flush=True)


def load(seconds: float):
    """bf16 GEMMs and 1 GB device-to-device copies, back to back, for `seconds`."""
    torch = DC.torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(1 << 29, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    t0, n = time.time(), 0
    while time.time() - t0 < seconds:
        for _ in range(4):
            torch.mm(a, b)
            dst.copy_(src)
        torch.cuda.synchronize()
        n += 1
    print(f"load: {n * 4} GEMMs of 8192^3 and {n * 4} copies of 1 GB in {time.time() - t0:.0f} s | {smi()}", flush=True)
    del a, b, src, dst
    torch.cuda.empty_cache()


def main():
    arg = lambda name, default: float(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default  # noqa: E731
    load_s, cool_s, rounds = arg("--load-s", 60.0), arg("--cool-s", 60.0), int(arg("--rounds", 3))
    DC.init()
    rows = []
    measure("idle", rounds, rows)
    load(load_s)
    measure("after load", rounds, rows)
    time.sleep(cool_s)
    measure(f"{cool_s:.0f} s later", rounds, rows)
    med = {p: (statistics.median(r["ours_us"] for r in rows if r["phase"] == p),
               statistics.median(r["sdpa_us"] for r in rows if r["phase"] == p))
           for p in dict.fromkeys(r["phase"] for r in rows)}
    print("\nmedians (ours us, SDPA us, ours vs idle):")
    idle = med["idle"][0]
    for p, (o, s) in med.items():
        print(f"  {p:<12} {o:7.2f}  {s:7.2f}  {o / idle:.3f}")
    Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
