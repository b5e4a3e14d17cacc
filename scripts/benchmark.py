#!/usr/bin/env python3
"""The benchmark: one optimizerd run from an empty ledger on the benchmark workload,
then a dated section appended to docs/BENCHMARKS.md with the exact command, the GPU,
driver, torch and cuDNN versions, and per shape: the best kernel's time and TFLOPS,
SDPA's (default and FlashAttention-2 backends, same run, CUDA-graph GPU time), the
ratios, and the budget used until the best kernel first matched SDPA default
(time-to-target). The section embeds the run's figures: `optimizerd report` writes them
(with report.html and report.md) into benchmarks/<run id>/ beside BENCHMARKS.md.

    python3 scripts/benchmark.py --bin target/release/optimizerd --budget 20m

Run it on the GPU machine (the binary is built elsewhere and carried). Standard
library only. `--worker-script` and `--sdpa-command` exist for the CPU test.

A run longer than one sitting: `--detach --work DIR --max-wait 540` starts the daemon in
the background (its own session) and waits at most 540 s; if the run is still going it
exits 75 and says so. The same command again attaches to the run in DIR instead of
starting another, waits again, and writes the section once the run has ended.
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

STILL_RUNNING = 75  # EX_TEMPFAIL: the detached run has not ended yet; run the same command again


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def shape_of(key_json):
    return json.loads(key_json) if isinstance(key_json, str) else key_json


def flops(s):
    f = 4.0 * s["b"] * s["h"] * s["s"] * s["s"] * s["d"]
    return f / 2 if s["causal"] else f


def tflops(s, us):
    return flops(s) / (us * 1e-6) / 1e12 if us else None


def fmt(x, spec=".2f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


def report_figures(binary, config, repo, run_id, md_dir):
    """`optimizerd report` for the run into benchmarks/<run id>/ beside BENCHMARKS.md;
    returns the Markdown that embeds its figures (or says why there are none)."""
    rel = os.path.join("benchmarks", run_id)
    r = sh([binary, "report", run_id, "--config", config, "--out", os.path.join(md_dir, rel), "--json"], cwd=repo)
    if r.returncode != 0:
        print(f"optimizerd report failed ({r.returncode}): {r.stderr.strip()}", file=sys.stderr)
        return f"\nFigures: `optimizerd report {run_id}` failed: {r.stderr.strip() or r.returncode}\n"
    written = json.loads(r.stdout)
    lines = [f"\nFigures (`optimizerd report {run_id}`; the whole report: [{rel}/report.html]({rel}/report.html)):\n"]
    for path in written["figures"]:
        name = os.path.basename(path)
        lines.append(f"![{name[:-4]}]({rel}/{name})")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/optimizerd")
    ap.add_argument("--budget", default="20m")
    ap.add_argument("--config", default="scripts/benchmark-agent.toml")
    ap.add_argument("--out", default="docs/BENCHMARKS.md")
    ap.add_argument("--work", help="folder for the run (default: a fresh temporary one)")
    ap.add_argument("--detach", action="store_true",
                    help="start the daemon in the background (or attach to the run in --work) and wait for it")
    ap.add_argument("--max-wait", type=float, default=540.0, help="--detach: seconds to wait before exiting 75")
    ap.add_argument("--worker-script", help=argparse.SUPPRESS)
    ap.add_argument("--sdpa-command", help=argparse.SUPPRESS)
    args = ap.parse_args()

    binary = os.path.abspath(args.bin)
    if args.detach and not args.work:
        ap.error("--detach needs --work DIR (the same folder when you run it again)")
    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="optimizerd-bench-"))
    os.makedirs(work, exist_ok=True)
    # The benchmark config, with the runs folder inside the work folder (an empty ledger).
    config_text = open(args.config).read().replace('runs_dir = "runs"', f'runs_dir = "{work}/runs"')
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    config_text = config_text.replace('templates_dir = "kernel-templates"', f'templates_dir = "{repo}/kernel-templates"')
    config_text = config_text.replace('plan = "strategies/default.toml"', f'plan = "{repo}/strategies/default.toml"')
    if args.sdpa_command:
        config_text += f'\n[baseline]\nsdpa_command = "{args.sdpa_command}"\n'
    config = os.path.join(work, "agent.toml")
    open(config, "w").write(config_text)

    command = [binary, "start", "--budget", args.budget, "--config", config]
    if not args.detach:
        command.append("--foreground")
    if args.worker_script:
        command += ["--worker-script", args.worker_script]
    shown = f"python3 scripts/benchmark.py --bin {args.bin} --budget {args.budget}" + (" --detach --work DIR" if args.detach else "")
    marker = os.path.join(work, "started")
    if args.detach and os.path.exists(marker):
        print(f"attaching to the run in {work}", flush=True)
    else:
        print("+", " ".join(command), flush=True)
        run = subprocess.run(command, cwd=repo)
        if run.returncode != 0:
            print(f"the run failed ({run.returncode})", file=sys.stderr)
            return 1
        open(marker, "w").write(" ".join(command) + "\n")
    if args.detach:
        deadline = time.monotonic() + args.max_wait
        while True:
            st = sh([binary, "status", "--json", "--config", config], cwd=repo)
            state = json.loads(st.stdout)["run"]["state"] if st.returncode == 0 and st.stdout.strip() else "?"
            if state not in ("running", "waiting_for_gpu", "?"):
                break
            if time.monotonic() > deadline:
                print(f"the run in {work} is still {state}; run the same command again to wait for it",
                      file=sys.stderr)
                return STILL_RUNNING
            time.sleep(5)
        if state != "finished":
            print(f"the run ended {state}; the section is written from what it recorded", file=sys.stderr)
    status = json.loads(sh([binary, "status", "--json", "--config", config], cwd=repo).stdout)
    history = json.loads(sh([binary, "history", "--json", "--config", config], cwd=repo).stdout)

    versions = status["sdpa"][0]["versions"] if status["sdpa"] else {}
    driver = "-"
    if shutil.which("nvidia-smi"):
        # The max SM clock: the current one, read after the run, is the idle clock.
        q = sh(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm", "--format=csv,noheader"])
        driver = q.stdout.strip().splitlines()[0] if q.returncode == 0 and q.stdout.strip() else "-"
    sdpa = {r["shape"]: r for r in status["sdpa"]}
    shapes = {}
    for it in history:
        for s in it["shapes"]:
            shapes.setdefault(s["shape"], shape_of(s["shape_json"]))

    closing = {r["shape"]: r for r in status.get("closing", [])}
    rows = []
    for b in status["best"]:
        key = b["shape"]
        s = shapes[key]
        sd = sdpa.get(key, {})
        default_us = sd.get("default_graph_us")
        flash_us = (sd.get("backends", {}).get("flash") or {}).get("graph_us")
        # Time-to-target: budget used when some iteration first won this shape at or under SDPA default.
        ttt = None
        if default_us:
            for it in history:
                if any(x["shape"] == key and x["won"] and x["median_us"] is not None and x["median_us"] <= default_us for x in it["shapes"]):
                    ttt = it.get("used_s")
                    break
        # The best when the plan's stages were done (before the open phase), to show what it added.
        plan_best = None
        for it in history:
            if it["stage"].startswith("open/"):
                continue
            for x in it["shapes"]:
                if x["shape"] == key and x["won"] and x["median_us"] is not None:
                    plan_best = x["median_us"]
        # The closing comparison: ours timed before and after a fresh SDPA measurement at the
        # end of the run, so both are compared at the same clocks. The quoted ratios come from it.
        c = closing.get(key)
        if c:
            ours = 0.5 * (c["ours_before_us"] + c["ours_after_us"])
            end_default = c.get("sdpa_default_us")
            end_flash = ((c.get("sdpa_backends") or {}).get("flash") or {}).get("graph_us")
            picked = c.get("sdpa_picked") or ""
        else:
            ours, end_default, end_flash, picked = b["median_us"], default_us, flash_us, sd.get("picked") or ""
        rows.append(
            f"| {key} | {fmt(plan_best)} | {fmt(default_us / plan_best if default_us and plan_best else None, '.2f', 'x')} | "
            f"{b['seq']} | {b['median_us']:.2f} | {fmt(default_us)} | "
            f"{ours:.2f} | {fmt(tflops(s, ours), '.1f')} | "
            f"{fmt(end_default)} {picked} | {fmt(tflops(s, end_default), '.1f')} | "
            f"{fmt(end_flash)} | "
            f"{fmt(end_default / ours if end_default else None, '.2f', 'x')} | "
            f"{fmt(end_flash / ours if end_flash else None, '.2f', 'x')} | "
            f"{fmt(ttt, '.0f', ' s') if ttt is not None else 'not reached'} |"
        )

    closing_note = (
        'The columns from "closing us" on are the closing comparison: at the end of the run the best kernel '
        'was timed, SDPA measured afresh, and the best kernel timed again (closing us = the mean of the two), '
        'so both are compared at the same clocks; the ratios come from it.'
        if closing else
        'No closing comparison was recorded: the columns from "closing us" on repeat the best kernel\'s time '
        'when it won and SDPA at the start.')
    run_row = status["run"]
    out_md = os.path.join(repo, args.out) if not os.path.isabs(args.out) else args.out
    figures = report_figures(binary, config, repo, run_row["id"], os.path.dirname(os.path.abspath(out_md)))
    today = datetime.date.today().isoformat()
    how = "` in the background, waited for by --detach" if args.detach else " --foreground`"
    section = f"""
## {today} — benchmark, {run_row.get('gpu_name') or '-'}

- Command: `{shown}` (runs `optimizerd start --budget {args.budget}{how} from an empty ledger
  with `{args.config}`); run `{run_row['id']}`, {run_row['iterations']} iterations,
  {run_row['used_s']:.0f} s of budget used, state {run_row['state']}.
- GPU {run_row.get('gpu_name') or '-'}; driver, max SM clock: {driver}; torch {versions.get('torch', '-')},
  CUDA {versions.get('cuda', '-')}, cuDNN {versions.get('cudnn', '-')}.
- Times are GPU time per call: candidates by CUDA-graph replay (timing.method = graph), SDPA by
  CUDA-graph replay in the same run. TFLOPS = 4*B*H*S*S*D / time, halved for causal.
  "end of plan": the best when the plan's stages were done, before the open-ended phase
  (stages `open/<class>`), and its ratio to SDPA default as measured at the start of the run.
  "iter", "when won us", "SDPA at start us": the best kernel's iteration, its time when it won and
  SDPA default at the start of the run. {closing_note}
  Time-to-target: budget used when a kernel at or under SDPA default (at the start) first won the shape. {sum(1 for it in history if it["stage"].startswith("open/"))} open-phase iterations;
  {run_row['iterations'] * 60.0 / max(run_row['used_s'], 1.0):.1f} candidates per minute of budget; run message: {run_row.get('message') or '-'}.

| shape | end of plan us | vs default | iter | when won us | SDPA at start us | closing us | TFLOPS | SDPA default us | TFLOPS | SDPA flash us | vs default | vs flash | time-to-target |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n" + figures
    with open(out_md, "a") as f:
        f.write(section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
