#!/usr/bin/env python3
"""Clock, power and energy per call of our kernels, FA4 and SDPA under sustained load (GPU machine).

Issue 19 judges kernels under sustained timing (>= 200 ms back to back), where the H100 leaves its
boost clock. Whether a kernel then runs into the board's power limit, and how much energy one call
takes, decides how much of a burst-timed gain survives: two builds with the same instructions in
a different order (e.g. two ptxas versions) draw the same energy per call, so under a power cap they
run at the same speed even where the burst timing separates them.

For each point of a check_templates_gpu.py point set (`--points`, default `large`) and each of
ours / FA4 (where flash_attn.cute imports) / SDPA default, the call runs back to back for
`--seconds` (a CUDA graph of back-to-back calls, replayed) while `nvidia-smi` samples the SM clock,
the board power and the clock-limit reasons every 50 ms. Per run, over its last 75%:

    us/call (median replay), SM MHz and W (medians; the MHz are nvidia-smi's sampled clock, which
    under a power cap need not be the effective one: not cycles per call), mJ/call = W x us/call, and the clock-limit
    reasons seen (nvidia-smi's bitmask: 0x4 software power cap, 0x8 hardware slowdown,
    0x20 software thermal, 0x40 hardware thermal, 0x80 hardware power brake; 0x1 idle)

Rows alternate ours / FA4 / SDPA `--rounds` times (clock drift hits each alike). Needs the cubins of
the point set as check_templates_gpu.py --time-best does (--cubin-dir, built on the CPU machine).

    python3 scripts/power_probe.py --cubin-dir .dev/ctg [--points large] [--seconds 2] [--rounds 2]
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_templates_gpu as C  # noqa: E402
from nvrtc_compile_check import combo_label  # noqa: E402

FIELDS = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active"


def parse_samples(text: str) -> list[tuple[float, float, float, int]]:
    """nvidia-smi CSV lines (FIELDS, noheader, nounits) -> (epoch seconds, MHz, W, reasons)."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            t = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((t, float(parts[1]), float(parts[2]), int(parts[3], 16)))
        except ValueError:
            continue  # a header, "[N/A]" or a torn line
    return out


def window(samples, start: float, end: float, skip: float = 0.25):
    """Medians of (MHz, W) and the OR of the reasons over [start + skip (end - start), end]."""
    lo = start + skip * (end - start)
    sel = [s for s in samples if lo <= s[0] <= end]
    if not sel:
        return float("nan"), float("nan"), 0, 0
    reasons = 0
    for s in sel:
        reasons |= s[3]
    return statistics.median(s[1] for s in sel), statistics.median(s[2] for s in sel), reasons, len(sel)


class PowerSampler:
    """nvidia-smi sampling FIELDS every 50 ms in the background while the `with` block runs (it
    starts 0.5 s before the block's first statement and stops 0.2 s after its last); .samples:
    parse_samples's reading of them, after the block. Drivers before 535 name the limit
    reasons `clocks_throttle_reasons`: that spelling is taken when the first fails. `smi`: the
    command (a test puts a stand-in there)."""

    def __init__(self, smi: str = "nvidia-smi") -> None:
        self.smi = smi
        self.samples: list[tuple[float, float, float, int]] = []

    def __enter__(self) -> "PowerSampler":
        fields = FIELDS
        if subprocess.run([self.smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                          capture_output=True).returncode != 0:
            fields = FIELDS.replace("clocks_event_reasons", "clocks_throttle_reasons")
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
        self.proc = subprocess.Popen([self.smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "50"],
                                     stdout=self.log, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> bool:
        time.sleep(0.2)
        self.proc.terminate()
        self.proc.wait(timeout=5)
        self.log.close()
        self.samples = parse_samples(Path(self.log.name).read_text())
        Path(self.log.name).unlink(missing_ok=True)
        return False


def report(runs, samples) -> list[str]:
    """The table of each run (us, MHz, W, mJ per call, clock-limit reasons) and, per point and
    shape, the medians over rounds with FA4 and SDPA beside ours. runs: (shape, who, knobs, us,
    start, end) in host seconds; samples: parse_samples's."""
    lines: list[str] = []
    lines.append(f"\n{len(samples)} nvidia-smi samples; per run, its last 75%: medians")
    lines.append(f"{'shape':28} {'who':5} {'us/call':>9} {'SM MHz':>7} {'W':>6} {'mJ/call':>8} {'reasons':>8} {'n':>3}")
    # Keyed by (point, shape, who): a set may hold several points of one shape, each timed with
    # its own baselines beside it.
    per: dict[tuple[str, str, str], list[tuple[float, float, float, float]]] = {}
    for shape, who, knobs, us, t0, t1 in runs:
        mhz, w, reasons, n = window(samples, t0, t1)
        mj = w * us * 1e-3
        per.setdefault((knobs, shape, who), []).append((us, mhz, w, mj))
        lines.append(f"{shape:28} {who:5} {us:9.2f} {mhz:7.0f} {w:6.0f} {mj:8.2f} {reasons:#8x} {n:3d}")
    lines.append("\nmedians over rounds, per point (ratio: FA4 or SDPA us / ours us; energy: their mJ / ours)")
    for knobs, shape in dict.fromkeys((k, s) for k, s, _ in per):
        ours = per.get((knobs, shape, "ours"))
        if not ours:
            continue
        o_us, o_mhz, o_w, o_mj = (statistics.median(x[i] for x in ours) for i in range(4))
        line = f"{shape:28} ours {o_us:9.2f} us {o_mhz:5.0f} MHz {o_w:4.0f} W {o_mj:7.2f} mJ"
        for who in ("fa4", "sdpa"):
            rows = per.get((knobs, shape, who))
            if rows:
                us, mhz, w, mj = (statistics.median(x[i] for x in rows) for i in range(4))
                line += f" | {who} {us:9.2f} us {mhz:5.0f} MHz {w:4.0f} W {mj:7.2f} mJ ({us / o_us:.3f}x, energy {mj / o_mj:.3f})"
        lines.append(line + f"  [{knobs}]")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="large", choices=sorted(C.POINT_SETS))
    ap.add_argument("--cubin-dir", help="load precompiled cubins from here (check_templates_gpu.py --build-cubins)")
    ap.add_argument("--seconds", type=float, default=2.0, help="back-to-back run per measurement (default 2)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-sdpa", action="store_true")
    args = ap.parse_args()

    gpu = C.Gpu()
    if args.cubin_dir:
        gpu.cubin_dir, gpu.cubins_only = Path(args.cubin_dir), True
    tpls = {t.rel: t for t in C.load_templates()}
    fa4_func, fa4_note = C.load_fa4()
    print(f"{gpu.name}; FA4: {fa4_note}", flush=True)

    runs = []  # (shape, who, knobs, us, start, end)
    with PowerSampler() as sampler:
        for rel, knobs, shapes in C.POINT_SETS[args.points]:
            tpl = tpls[rel]
            full = tpl.complete(knobs)
            for shape in shapes:
                q, k, v, _ = gpu.inputs(shape, "fp16", need_ref=False)
                probe = gpu.time_us(tpl, full, shape, reps=3, samples=3)
                reps = max(3, min(50, round(2000.0 / max(probe, 1e-3))))
                calls = {"ours": lambda: gpu.time_us(tpl, full, shape, reps=reps, samples=20,
                                                     sustain_ms=args.seconds * 1000.0)}
                fa4_call = C.fa4_fn(gpu, fa4_func, shape, q, k, v) if fa4_func else None
                if fa4_call:
                    calls["fa4"] = lambda: C.time_torch_graph_us(gpu, fa4_call, reps, 20, args.seconds * 1000.0)
                if not args.no_sdpa:
                    sd = C.sdpa_fn(gpu, shape, q, k, v)
                    calls["sdpa"] = lambda: C.time_torch_graph_us(gpu, sd, reps, 20, args.seconds * 1000.0)
                for r in range(args.rounds):
                    for who in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
                        gpu.torch.cuda.synchronize()
                        t0 = time.time()
                        us = calls[who]()
                        t1 = time.time()
                        runs.append((C.shape_key(shape), who, combo_label(full), us, t0, t1))
                        print(f"  {C.shape_key(shape):28} {who:5} {us:9.2f} us", flush=True)
                        time.sleep(0.3)  # let the sampler catch up and the board settle a little
    samples = sampler.samples
    print("\n".join(report(runs, samples)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
