#!/usr/bin/env bash
# On the GPU machine: check the Hopper template's variants and time a change against the
# templates before it, from cubins built on the CPU machine (no compiler work here).
#
# Built here first (the CPU machine; .dev is git-ignored: carry .dev/ctg, .dev/old, .dev/mid):
#   git archive 995a61b kernel-templates | tar -x -C .dev/old   (before the overlap fix)
#   git archive 81dc508 kernel-templates | tar -x -C .dev/mid   (the overlap fix, before the peel)
#   python3 scripts/check_templates_gpu.py --build-cubins .dev/ctg --template wgmma_tma.cu \
#       --template tensor_map_probe.cu --pairs wgmma_tma.cu --time-best --points overlap \
#       --time-against .dev/old/kernel-templates
#   python3 scripts/check_templates_gpu.py --build-cubins .dev/ctg --no-check --template wgmma_tma.cu \
#       --template mma_fa2.cu --time-best --points best --time-against .dev/mid/kernel-templates
#   for p in epilogue best medium gqa streamk lpt dynamic; do python3 scripts/check_templates_gpu.py --build-cubins .dev/ctg \
#       --no-check --template wgmma_tma.cu --template mma_fa2.cu --time-best --points $p; done
# The mbarrier-sleep experiment (not in the templates yet: HOPPER.md, "ncu after the four changes"):
#   git archive HEAD kernel-templates | tar -x -C .dev/sleep, then in .dev/sleep/kernel-templates/common/hopper.cuh
#   give mbar_wait's try_wait a suspend-time hint: `... b64 done, [%0], %1, %2;` with operand "n"(0x989680)
#   (ptxas then emits NANOSLEEP.SYNCS in the retry path), and
#   for p in epilogue medium; do python3 scripts/check_templates_gpu.py --build-cubins .dev/ctg-sleep --no-check \
#       --template wgmma_tma.cu --time-best --points $p --time-against .dev/sleep/kernel-templates; done
# Then, one device call per step (each under the tool's 10-minute limit):
#   bash scripts/device-kernel-ab.sh check      every pair of knob values, more shapes, planted faults
#   bash scripts/device-kernel-ab.sh overlap    --points overlap, new against .dev/old
#   bash scripts/device-kernel-ab.sh peel       --points best, new against .dev/mid (the loop peel alone)
#   bash scripts/device-kernel-ab.sh epilogue   --points epilogue (EPI_TMA 1 against 0)
#   bash scripts/device-kernel-ab.sh best       --points best, then medium (FA4 where it imports)
#   bash scripts/device-kernel-ab.sh gqa        PACK_GQA: the pairs check, then --points gqa (1 against 0, FA4 beside),
#   bash scripts/device-kernel-ab.sh new        all of session 6's knobs in one call: the pairs check (STREAM_K,
#                                               PACK_GQA at D 64 and 128, LPT_MIB), then streamk, gqa, lpt
#                                               (3 rounds each); the sleep A/B is the `sleep` step
#   bash scripts/device-kernel-ab.sh streamk    --points streamk (STREAM_K 1 against 0, non-causal, FA4 beside);
#                                               the gqa step's pairs check covers STREAM_K's correctness
#   bash scripts/device-kernel-ab.sh dynamic    the pairs check (DYNAMIC), then --points dynamic (persistent causal tiles
#                                               from a counter against the static rounds and one CTA per tile)
#   bash scripts/device-kernel-ab.sh against    the working tree's templates (an experiment branch checked out)
#                                               against .dev/main's (git archive main kernel-templates | tar -x
#                                               -C .dev/main): the pairs check with faults, then --points epilogue
#                                               and tiles_per_cta both ways (cubins: the pairs, then those two sets
#                                               with --time-against .dev/main/kernel-templates); carry .dev/ctg, .dev/main
#   bash scripts/device-kernel-ab.sh sleep      --points epilogue and medium, new against .dev/sleep (carry
#                                               .dev/ctg-sleep and .dev/sleep): does sleeping in mbarrier waits pay
# Logs go to $OUT; each step ends with its table. FA4: PYTHONPATH as in
# ../shared/notes/fa4-on-device.md (the wheels travel in two calls).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-/tmp/optimizerd-out}"
mkdir -p "$out"
step="${1:?usage: device-kernel-ab.sh check|overlap|peel|epilogue|best|gqa|streamk|new|sleep|dynamic|against}"
ctg=(--cubin-dir .dev/ctg)
[[ "$step" == sleep || -d .dev/ctg ]] || { echo "device-kernel-ab: no .dev/ctg: build the cubins on the CPU machine and carry .dev/ctg" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader | tee "$out/gpu.txt"
run() {  # run NAME ARGS...: the checker's output to $OUT/NAME.log, its last lines here
  local name="$1"; shift
  echo "+ python3 scripts/check_templates_gpu.py $*"
  python3 scripts/check_templates_gpu.py "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$out/$name.log"
  echo "+ exit status $rc ($name)"
  return $rc
}
case "$step" in
  check)
    run check "${ctg[@]}" --template wgmma_tma.cu --template tensor_map_probe.cu --pairs wgmma_tma.cu \
      --more-shapes --faults ;;
  overlap)
    [[ -d .dev/old/kernel-templates ]] || { echo "device-kernel-ab: no .dev/old/kernel-templates (carry it)" >&2; exit 2; }
    run overlap "${ctg[@]}" --no-check --template wgmma_tma.cu --time-best --points overlap \
      --time-against .dev/old/kernel-templates --rounds 5 ;;
  peel)
    [[ -d .dev/mid/kernel-templates ]] || { echo "device-kernel-ab: no .dev/mid/kernel-templates (carry it)" >&2; exit 2; }
    run peel "${ctg[@]}" --no-check --template wgmma_tma.cu --template mma_fa2.cu --time-best --points best \
      --time-against .dev/mid/kernel-templates --rounds 5 ;;
  epilogue)
    run epilogue "${ctg[@]}" --no-check --template wgmma_tma.cu --time-best --points epilogue --rounds 5 ;;
  best)
    run best "${ctg[@]}" --no-check --template wgmma_tma.cu --template mma_fa2.cu --time-best --points best --rounds 5
    run medium "${ctg[@]}" --no-check --template wgmma_tma.cu --time-best --points medium --rounds 3 ;;
  gqa)
    run check "${ctg[@]}" --template wgmma_tma.cu --pairs wgmma_tma.cu --more-shapes --faults || exit 1
    run gqa "${ctg[@]}" --no-check --template wgmma_tma.cu --time-best --points gqa --rounds 5 ;;
  streamk)
    run streamk "${ctg[@]}" --no-check --template wgmma_tma.cu --time-best --points streamk --rounds 5 ;;
  new)
    # Session 6's knobs in one call (carry .dev/ctg): correctness first, then each A/B with 3
    # rounds to stay inside the 10-minute call. The mbarrier-sleep A/B is its own call (sleep).
    run check "${ctg[@]}" --template wgmma_tma.cu --template tensor_map_probe.cu --pairs wgmma_tma.cu \
      --more-shapes --faults || exit 1
    for p in streamk gqa lpt; do
      run "$p" "${ctg[@]}" --no-check --template wgmma_tma.cu --time-best --points "$p" --rounds 3
    done ;;
  sleep)
    [[ -d .dev/ctg-sleep && -d .dev/sleep/kernel-templates ]] || { echo "device-kernel-ab: carry .dev/ctg-sleep and .dev/sleep (built per the header)" >&2; exit 2; }
    run sleep-epilogue --cubin-dir .dev/ctg-sleep --no-check --template wgmma_tma.cu --time-best --points epilogue \
      --time-against .dev/sleep/kernel-templates --rounds 5
    run sleep-medium --cubin-dir .dev/ctg-sleep --no-check --template wgmma_tma.cu --time-best --points medium \
      --time-against .dev/sleep/kernel-templates --rounds 3 ;;
  dynamic)
    # DYNAMIC (persistent causal work tiles from a counter): the pairs check with the new knob and
    # the many-tile causal check shapes, then --points dynamic against the static rounds and one
    # CTA per tile, packed GQA and not; FA4 beside where installed (scripts/device_fa4.py).
    [[ -d /tmp/fa4/site ]] && eval "$(python3 scripts/device_fa4.py env)"
    run check "${ctg[@]}" --template wgmma_tma.cu --template tensor_map_probe.cu --pairs wgmma_tma.cu \
      --more-shapes --faults || exit 1
    run dynamic "${ctg[@]}" --no-check --template wgmma_tma.cu --time-best --points dynamic --rounds 5 ;;
  against)
    [[ -d .dev/main/kernel-templates ]] || { echo "device-kernel-ab: no .dev/main/kernel-templates (carry it)" >&2; exit 2; }
    [[ -d /tmp/fa4/site ]] && eval "$(python3 scripts/device_fa4.py env)"
    run check "${ctg[@]}" --template wgmma_tma.cu --template tensor_map_probe.cu --pairs wgmma_tma.cu \
      --more-shapes --faults || exit 1
    run against-epilogue "${ctg[@]}" --no-check --template wgmma_tma.cu --time-best --points epilogue \
      --time-against .dev/main/kernel-templates --rounds 5
    run against-tiles "${ctg[@]}" --no-check --template wgmma_tma.cu --time-best --points tiles_per_cta \
      --time-against .dev/main/kernel-templates --rounds 3 ;;
  *) echo "device-kernel-ab: unknown step $step (check, overlap, peel, epilogue, best, gqa, streamk, new, sleep, dynamic, against)" >&2; exit 2 ;;
esac
