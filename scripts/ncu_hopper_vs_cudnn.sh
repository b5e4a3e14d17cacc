#!/bin/bash
# Run on the GPU machine after scripts/wgmma_sweep_build.py built .dev/cubins with two variants (v0, v1).
# ncu on the two Hopper variants (.dev/cubins v0, v1) and SDPA's cuDNN backend at (2,16,8192,128).
M="smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.per_cycle_active,launch__block_size,launch__grid_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic"
M="$M,regex:sm__pipe_tensor.*cycles_active.avg.pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_(xu|fma|alu|uniform).*sum$"
for v in 0 1; do
  echo "=== ours v$v $(python3 -c "import json;print(json.load(open('.dev/cubins/variants.json'))[$v])")"
  ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:optd_fwd --metrics "$M" python3 scripts/wgmma_sweep.py profile $v 2,16,8192,128,0 2>&1 | grep -v "^==PROF==\|^profiled"
done
echo "=== SDPA cuDNN"
ncu --clock-control none --launch-skip 2 --launch-count 1 -k regex:"sdpa|fmha|cudnn|sm90" --metrics "$M" python3 scripts/profile_one.py sdpa cudnn 2,16,8192,128 2>&1 | grep -v "^==PROF=="
