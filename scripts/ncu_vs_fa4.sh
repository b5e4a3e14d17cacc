#!/bin/bash
# ncu: FlashAttention-4's Hopper forward against our wgmma-tma kernel at the same shapes (issue 19,
# part 3: "profile FA4's Hopper kernel and ours side by side"). Run on the GPU machine with FA4
# importable (../shared/notes/fa4-on-device.md; PYTHONPATH to its --target folder) and, optionally,
# precompiled cubins (CUBINS=.dev/ctg, from check_templates_gpu.py --build-cubins ... --points best).
#
#   OUT=/tmp/ncu bash scripts/ncu_vs_fa4.sh      # one log per (kernel, shape) under $OUT, a table last
#   bash scripts/ncu_vs_fa4.sh "2,16,8192,128|BLOCK_N=128,...,CONSUMERS=2,..." "..."   # these cases instead
# A case is "shape|knobs" (shape as profile_one.py takes it: B,H,S,D[,causal] or B,HQ,HKV,SQ,SK,D[,causal]);
# several cases may share a shape (FA4 is profiled once per shape, each of our points beside it).
#
# One launch each (--profile-from-start off: scripts/profile_one.py warms up, then opens the profiled
# range), --clock-control none (the clocks the timings run at), fp16.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/ncu_vs_fa4}"
mkdir -p "$OUT"
CUBINS="${CUBINS:-}"
M="gpu__time_duration.sum,sm__cycles_elapsed.avg,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
M="$M,regex:sm__pipe_tensor_op_(hmma|gmma).*cycles_active.avg.pct_of_peak_sustained_active"
M="$M,regex:sm__inst_executed_pipe_(xu|fma|alu|uniform|lsu).*sum$"
M="$M,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio"
M="$M,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,l1tex__data_pipe_lsu_wavefronts_mem_local.sum"
M="$M,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_read.sum,lts__t_sector_hit_rate.pct"
# EXTRA_METRICS: more, comma-separated (e.g. the L2's request and coalescer counters that
# `ncu --query-metrics` lists on the machine)
[[ -n "${EXTRA_METRICS:-}" ]] && M="$M,$EXTRA_METRICS"
# shape (B,H,S,D[,causal])  our knobs (the daemon's best points, check_templates_gpu.py BEST_POINTS)
CASES=(
  "4,16,4096,64|BLOCK_N=128,STAGES=2,CONSUMERS=3,PINGPONG=1,OVERLAP=1,PERSISTENT=1,LAZY_RESCALE=1"
  "4,16,4096,64,causal|BLOCK_N=192,STAGES=3,CONSUMERS=3,PINGPONG=1,OVERLAP=0,PERSISTENT=0,LAZY_RESCALE=1"
  "2,16,8192,128|BLOCK_N=128,STAGES=2,CONSUMERS=3,PINGPONG=1,OVERLAP=0,PERSISTENT=1,LAZY_RESCALE=1"
  "8,16,1024,64,causal|BLOCK_N=128,STAGES=2,CONSUMERS=2,PINGPONG=1,OVERLAP=1,PERSISTENT=1,LAZY_RESCALE=1"
)
(( $# > 0 )) && CASES=("$@")
for case in "${CASES[@]}"; do
  shape="${case%%|*}"; knobs="${case##*|}"; tag="${shape//,/_}"
  # Our point's file name: the knobs' values in order (BLOCK_N=128,CONSUMERS=2 -> 128-2).
  ktag=$(tr ',' '\n' <<< "$knobs" | sed 's/.*=//' | paste -sd-)
  [[ -f "$OUT/fa4_$tag.txt" ]] || ncu --clock-control none --profile-from-start off --launch-count 1 --metrics "$M" \
    python3 scripts/profile_one.py fa4 - "$shape" > "$OUT/fa4_$tag.txt" 2>&1
  ncu --clock-control none --profile-from-start off --launch-count 1 --metrics "$M" \
    python3 scripts/profile_one.py wgmma_tma.cu "$knobs" "$shape" ${CUBINS:+--cubin-dir "$CUBINS"} > "$OUT/ours_${tag}__$ktag.txt" 2>&1
  echo "${tag}__$ktag: $knobs" >> "$OUT/cases.txt"
done
# Table: every metric, FA4 and ours side by side per shape.
python3 - "$OUT" <<'PY'
import re, sys, pathlib
out = pathlib.Path(sys.argv[1])
def metrics(path):
    d = {}
    if not path.exists():
        return d
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"\s+([a-z][\w.]+)\s+(\S+)\s+([\d.,]+)\s*$", line)
        if m:
            d[m.group(1)] = (m.group(2), m.group(3))
    return d
for ours in sorted(out.glob("ours_*.txt")):
    tag, _, knobs = ours.name[5:-4].partition("__")
    a, b = metrics(out / f"fa4_{tag}.txt"), metrics(ours)
    print(f"\n== {tag}, our point {knobs}   (FA4 | ours)")
    for k in sorted(set(a) | set(b)):
        print(f"  {k:95} {a.get(k, ('', '-'))[1]:>16} | {b.get(k, ('', '-'))[1]:>16}  {(a.get(k) or b.get(k))[0]}")
PY
