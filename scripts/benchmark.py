#!/usr/bin/env python3
"""The benchmark: one optimizerd run from an empty ledger on a benchmark workload,
then a dated section appended to docs/BENCHMARKS.md with the exact command, the GPU,
driver, torch, cuDNN and FlashAttention-4 versions, and per shape: the best kernel's time
and TFLOPS (decode shapes: effective K/V bandwidth, TB/s), SDPA's (default and
FlashAttention-2 backends) and FlashAttention-4's (where it imports) from the same run
(CUDA-graph GPU time), the ratios, and the budget used until the best kernel first
matched SDPA default (time-to-target). The section embeds the run's figures:
`optimizerd report` writes them (with report.html and report.md) into
benchmarks/<run id>/ beside BENCHMARKS.md.

    python3 scripts/benchmark.py --bin target/release/optimizerd --budget 20m
    python3 scripts/benchmark.py --workload llm --budget 20m

Workloads (--workload; --config names any other file):
  default   scripts/benchmark-agent.toml: small MHA shapes and four large ones (fp16).
  llm       scripts/benchmark-llm.toml: a Llama-3-8B-like bf16 set: prefill, chunked
            prefill, decode (GQA and MQA, ragged sk), a D 64 GQA prefill ([B,H,S,D]).
  llm-bshd  scripts/benchmark-llm-bshd.toml: three of them in [B,S,H,D] (layout is per
            workload, so the other layout is a second, small run).
  unseen    scripts/benchmark-unseen.toml: bf16 prefill shapes the project was never
            tuned on (D 128 causal, D 64 non-causal, a ragged S of 577).
  medium    scripts/benchmark-medium.toml: issue 19's medium set, bf16, S 577-2048,
            D 64 and 128, causal and not (dtype is per workload: the default
            benchmark's large fp16 shapes are a separate run).
  gemma-phi3  scripts/benchmark-gemma-phi3.toml: head dims 256 (Gemma 2 9B-like, 16 query
            heads over 8 KV heads: prefill, chunked prefill, decode) and 96 (Phi-3-mini-like,
            MHA: prefill, decode), bf16.
  window    scripts/benchmark-window.toml: sliding-window attention as local layers run
            it (Gemma 3-like: 1024 keys at head dims 256 and 128; Mistral-7B-v0.1-like:
            4096 keys), prefill, chunked prefill and decode, bf16.
  long-decode  scripts/benchmark-long-decode.toml: decode over long KV caches (Llama-3-8B-like,
            bf16: batch 1 at 16K, 64K and 128K keys, batch 4 at 32K, multi-query at 16K).
  llama3-8b  scripts/benchmark-llama3-8b.toml: Llama-3-8B's attention as `workload --from-hf`
            writes it from scripts/models/llama-3-8b-config.json (prefill B 1/4/8 x S 1024/4096,
            decode B 1/4/8 over 4096 keys; the shapes scripts/model_e2e.sh tunes), bf16.
  spec-decode  scripts/benchmark-spec-decode.toml: speculative decoding's verification (4-16
            query rows per sequence against 4K keys, causal; Llama-3-8B-like and Qwen2-7B-like
            groups), bf16.

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


WORKLOADS = {
    "default": "scripts/benchmark-agent.toml",
    "llm": "scripts/benchmark-llm.toml",
    "llm-bshd": "scripts/benchmark-llm-bshd.toml",
    "unseen": "scripts/benchmark-unseen.toml",
    "medium": "scripts/benchmark-medium.toml",
    "gemma-phi3": "scripts/benchmark-gemma-phi3.toml",
    "window": "scripts/benchmark-window.toml",
    "long-decode": "scripts/benchmark-long-decode.toml",
    "llama3-8b": "scripts/benchmark-llama3-8b.toml",
    "spec-decode": "scripts/benchmark-spec-decode.toml",
}

DECODE_MAX_SQ = 16  # as optimizerd's Shape::is_decode


def dims(s):
    """(b, hq, hkv, sq, sk, d) of a shape as optimizerd records it (version 2, or 1's h/s)."""
    hq = s.get("hq", s.get("h"))
    sq = s.get("sq", s.get("s"))
    return s["b"], hq, s.get("hkv", hq), sq, s.get("sk", sq), s["d"]


def is_decode(s):
    return dims(s)[3] <= DECODE_MAX_SQ


def visible(s, i):
    """(lo, hi): the keys query row i sees, as optimizerd's Shape::visible_range: causal rows
    see keys <= i + SK - SQ, and a sliding window only the last `window` of those."""
    _, _, _, sq, sk, _ = dims(s)
    if not s.get("causal"):
        return 0, sk
    hi = min(sk, i + sk - sq + 1)
    return (max(0, hi - s["window"]) if s.get("window") else 0), hi


def flops(s):
    """4 * B * HQ * D per visible (query, key) pair."""
    b, hq, _, sq, sk, d = dims(s)
    if s.get("window"):
        pairs = sum(hi - lo for lo, hi in (visible(s, i) for i in range(sq)))
    else:
        pairs = sq * (sk - sq) + sq * (sq + 1) / 2 if s.get("causal") else sq * sk
    return 4.0 * b * hq * d * pairs


def kv_bytes(s):
    """Bytes of K and V read at least once (a window leaves the keys before row 0's unread)."""
    b, _, hkv, _, sk, d = dims(s)
    return 2 * b * hkv * (sk - visible(s, 0)[0]) * d * 2


def tflops(s, us):
    return flops(s) / (us * 1e-6) / 1e12 if us else None


def rate(s, us):
    """How a time is judged: TFLOPS, or for decode shapes the K/V bytes read per second."""
    if not us:
        return "-"
    if is_decode(s):
        return f"{kv_bytes(s) / (us * 1e-6) / 1e12:.2f} TB/s"
    return f"{tflops(s, us):.1f}"


def graph_us(backends, name):
    return ((backends or {}).get(name) or {}).get("graph_us")


def fa4_cell(backends):
    """FA4's time, 'failed' where it ran and could not take the shape, '-' where not measured."""
    e = (backends or {}).get("fa4")
    if not e:
        return "-"
    return fmt(e.get("graph_us")) if e.get("graph_us") is not None else "failed"


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
    ap.add_argument("--workload", default="default", choices=sorted(WORKLOADS),
                    help="which benchmark workload (its config file; see above)")
    ap.add_argument("--config", help="a config file instead of the workload's")
    ap.add_argument("--out", default="docs/BENCHMARKS.md")
    ap.add_argument("--work", help="folder for the run (default: a fresh temporary one)")
    ap.add_argument("--warm-from", metavar="WORK",
                    help="start from a copy of the ledger of an earlier benchmark's --work folder "
                         "(memory across runs and transfer), instead of an empty one")
    ap.add_argument("--detach", action="store_true",
                    help="start the daemon in the background (or attach to the run in --work) and wait for it")
    ap.add_argument("--max-wait", type=float, default=540.0, help="--detach: seconds to wait before exiting 75")
    ap.add_argument("--worker-script", help=argparse.SUPPRESS)
    ap.add_argument("--sdpa-command", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.config is None:
        args.config = WORKLOADS[args.workload]

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
    marker = os.path.join(work, "started")
    if args.warm_from and not os.path.exists(marker):
        src = os.path.join(os.path.abspath(args.warm_from), "runs", "optimizer.db")
        if not os.path.exists(src):
            ap.error(f"--warm-from {args.warm_from}: no ledger at {src}")
        os.makedirs(os.path.join(work, "runs"), exist_ok=True)
        shutil.copyfile(src, os.path.join(work, "runs", "optimizer.db"))

    command = [binary, "start", "--budget", args.budget, "--config", config]
    if not args.detach:
        command.append("--foreground")
    if args.worker_script:
        command += ["--worker-script", args.worker_script]
    shown = (f"python3 scripts/benchmark.py --bin {args.bin} --budget {args.budget}"
             + (f" --workload {args.workload}" if args.workload != "default" else "")
             + (" --warm-from WORK" if args.warm_from else "")
             + (" --detach --work DIR" if args.detach else ""))
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
            end_backends = c.get("sdpa_backends") or {}
            picked = c.get("sdpa_picked") or ""
        else:
            ours, end_default, end_backends, picked = b["median_us"], default_us, sd.get("backends", {}), sd.get("picked") or ""
        end_flash = graph_us(end_backends, "flash")
        end_fa4 = graph_us(end_backends, "fa4")
        # Sustained (timing.sustained_ms): each replayed back to back for that long at the
        # closing, as attention runs in a model step; None where it was not measured.
        sus, sus_default, sus_fa4 = None, None, None
        if c:
            before, after = c.get("ours_sustained_before_us"), c.get("ours_sustained_after_us")
            sus = 0.5 * (before + after) if before is not None and after is not None else (before if before is not None else after)
            sus_default = c.get("sdpa_default_sustained_us")
            sus_fa4 = ((end_backends.get("fa4") or {}).get("sustained_us"))
        rows.append(
            f"| {key} | {fmt(plan_best)} | {fmt(default_us / plan_best if default_us and plan_best else None, '.2f', 'x')} | "
            f"{b['seq']} | {b['median_us']:.2f} | {fmt(default_us)} | "
            f"{ours:.2f} | {rate(s, ours)} | "
            f"{fmt(end_default)} {picked} | {rate(s, end_default)} | "
            f"{fmt(end_flash)} | {fa4_cell(end_backends)} | "
            f"{fmt(end_default / ours if end_default else None, '.2f', 'x')} | "
            f"{fmt(end_flash / ours if end_flash else None, '.2f', 'x')} | "
            f"{fmt(end_fa4 / ours if end_fa4 else None, '.2f', 'x')} | "
            f"{fmt(ttt, '.0f', ' s') if ttt is not None else 'not reached'} | "
            f"{fmt(sus)} | {fmt(sus_default)} | {fmt(sus_fa4)} | "
            f"{fmt(sus_default / sus if sus and sus_default else None, '.2f', 'x')} | "
            f"{fmt(sus_fa4 / sus if sus and sus_fa4 else None, '.2f', 'x')} |"
        )

    # Time-to-best (optimizerd's own figures, `status --json`): when each shape's final best
    # was first reached, and the budget that went to candidates losing by more than 20%.
    ttb = status.get("time_to_best") or {}
    reached = {x["shape"]: x.get("first_reached_best_s") for x in ttb.get("shapes", [])}
    early = sum(1 for it in history if it.get("verdict") == "rejected_early")
    spent = ttb.get("budget_s_on_candidates") or 0.0
    losers_s = ttb.get("budget_s_on_losers_20pct") or 0.0
    ttb_note = ("Time-to-best (budget seconds when each shape's final best was first reached): "
                + ", ".join(f"{k} {fmt(v, '.0f', ' s')}" for k, v in reached.items())
                + f"; all by {fmt(max([v for v in reached.values() if v is not None], default=None), '.0f', ' s')}."
                + f" Budget on candidates losing by >20%: {losers_s:.0f} s of {spent:.0f} s"
                + (f" ({100 * losers_s / spent:.0f}%)" if spent else "")
                + f", {ttb.get('losers_20pct', 0)} candidates ({early} of them rejected early after a brief timing);"
                + f" failed before timing: {ttb.get('budget_s_on_failed', 0.0):.0f} s, {ttb.get('failed', 0)} candidates.")
    closing_note = (
        'The columns from "closing us" on are the closing comparison: at the end of the run the best kernel '
        'was timed, SDPA measured afresh, and the best kernel timed again (closing us = the mean of the two), '
        'so both are compared at the same clocks; the ratios come from it.'
        if closing else
        'No closing comparison was recorded: the columns from "closing us" on repeat the best kernel\'s time '
        'when it won and SDPA at the start.')
    sustained_ms = next((r.get("sustained_ms") for r in closing.values() if r.get("sustained_ms")), None)
    if sustained_ms:
        closing_note += (f' The "sustained" columns: at the closing comparison each kernel (ours, SDPA default, FA4) '
                         f'was also replayed back to back for at least {sustained_ms:.0f} ms (timing.sustained_ms), as attention '
                         'runs inside a model step, at the clocks sustained power draw allows; ratios are SDPA\'s or FA4\'s '
                         'sustained time over ours. Before that, each shape\'s top kernels were re-ranked under the same timing.')
    else:
        closing_note += ' No sustained timing was recorded (timing.sustained_ms = 0 or no closing comparison): the "sustained" columns are "-".'
    if versions.get("fa4"):
        fa4_note = f"FlashAttention-4 {versions['fa4']} (flash_attn.cute, [B,S,H,D] inputs, CUDA-graph replay in the same run)"
    else:
        fa4_note = "FA4 not measured" + (f": {versions['fa4_error']}" if versions.get("fa4_error") else " (flash_attn.cute does not import)")
    run_row = status["run"]
    kept = status.get("closing_reserve_s")
    # The search's end moved this far before the budget; a run that converged sooner stopped earlier.
    kept_note = (f" (the last {kept:.0f} s of the budget kept for the closing comparison: "
                 "run.budget_covers_closing)") if kept else ""
    out_md = os.path.join(repo, args.out) if not os.path.isabs(args.out) else args.out
    figures = report_figures(binary, config, repo, run_row["id"], os.path.dirname(os.path.abspath(out_md)))
    today = datetime.date.today().isoformat()
    how = "` in the background, waited for by --detach" if args.detach else " --foreground`"
    ledger_note = (f"a copy of the ledger of {os.path.abspath(args.warm_from)} (memory across runs, transfer)"
                   if args.warm_from else "an empty ledger")
    section = f"""
## {today} — benchmark, {run_row.get('gpu_name') or '-'}

- Command: `{shown}` (runs `optimizerd start --budget {args.budget}{how} from {ledger_note}
  with `{args.config}`); run `{run_row['id']}`, {run_row['iterations']} iterations,
  {run_row['used_s']:.0f} s of budget used{kept_note}, state {run_row['state']}.
- GPU {run_row.get('gpu_name') or '-'}; driver, max SM clock: {driver}; torch {versions.get('torch', '-')},
  CUDA {versions.get('cuda', '-')}, cuDNN {versions.get('cudnn', '-')}; {fa4_note}.
- Times are GPU time per call: candidates by CUDA-graph replay (timing.method = graph), SDPA and FA4 by
  CUDA-graph replay in the same run. TFLOPS = 4*B*HQ*D per visible (query, key) pair / time (S*S,
  about half for causal); decode shapes (sq <= {DECODE_MAX_SQ}) show instead the effective K/V bandwidth,
  bytes of K and V (2*B*HKV*SK*D*2) / time, in TB/s.
  "end of plan": the best when the plan's stages were done, before the open-ended phase
  (stages `open/<class>`), and its ratio to SDPA default as measured at the start of the run.
  "iter", "when won us", "SDPA at start us": the best kernel's iteration, its time when it won and
  SDPA default at the start of the run. {closing_note}
  {ttb_note}
  Time-to-target: budget used when a kernel at or under SDPA default (at the start) first won the shape. {sum(1 for it in history if it["stage"].startswith("open/"))} open-phase iterations;
  {run_row['iterations'] * 60.0 / max(run_row['used_s'], 1.0):.1f} candidates per minute of budget; run message: {run_row.get('message') or '-'}.

| shape | end of plan us | vs default | iter | when won us | SDPA at start us | closing us | TFLOPS or TB/s | SDPA default us | TFLOPS or TB/s | SDPA flash us | FA4 us | vs default | vs flash | vs FA4 | time-to-target | sustained us | SDPA default sustained us | FA4 sustained us | sustained vs default | sustained vs FA4 |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n" + figures
    with open(out_md, "a") as f:
        f.write(section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
