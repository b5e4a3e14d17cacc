#!/bin/bash
# FlashAttention-4's compiled kernel for given shapes, for scripts/sass_loop_stats.py --cubin here
# (issue 19: FA4's hot loop beside ours, instruction by instruction). Run on the GPU machine with
# FA4 installed (scripts/device_fa4.py), then bring OUTDIR back through $OUT:
#
#   eval "$(python3 scripts/device_fa4.py env)"
#   bash scripts/fa4_cubin.sh $OUT/fa4 1,32,8,512,16384,128,causal 4,16,16,4096,4096,64
#
# A shape is what scripts/profile_one.py takes (b,hq,hkv,sq,sk,d[,causal]). Per shape, a folder
# OUTDIR/<shape> with the CuTe DSL's .cubin and .ptx (CUTE_DSL_KEEP; `sass` there would need
# nvdisasm >= 13.4, which the device lacks: disassemble here with .deps' 13.5), ptxas's register
# and spill report in run.log (CUTE_DSL_COMPILER_OPT), and the run's output. The DSL's file cache
# is off: a kernel it had compiled before would otherwise load from the cache and dump nothing.
# Then, on the CPU machine:
#   python3 scripts/sass_loop_stats.py --cubin OUTDIR/<shape>/*.cubin --template wgmma_tma.cu --knobs ... --d D
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:?usage: fa4_cubin.sh OUTDIR SHAPE [SHAPE...]}"
shift
[ $# -gt 0 ] || { echo "fa4_cubin.sh: no shape given (e.g. 1,32,8,512,16384,128,causal)" >&2; exit 2; }
python3 -c "import flash_attn.cute" 2>/dev/null || {
  echo "fa4_cubin.sh: flash_attn.cute does not import: install FA4 (scripts/device_fa4.py) and eval its env" >&2
  exit 2
}
rc=0
for shape in "$@"; do
  d="$out/${shape//,/_}"
  mkdir -p "$d"  # the DSL does not create the dump folder: without it nothing is written, silently
  CUTE_DSL_KEEP=cubin,ptx CUTE_DSL_DUMP_DIR="$d" CUTE_DSL_DISABLE_FILE_CACHING=1 \
    CUTE_DSL_COMPILER_OPT='ptx-options=-v' \
    python3 scripts/profile_one.py fa4 - "$shape" > "$d/run.log" 2>&1
  got=$(find "$d" -name '*.cubin' | wc -l)
  if [ "$got" -eq 0 ]; then
    echo "$shape: no cubin in $d (run.log's last lines below)"; tail -n 5 "$d/run.log"; rc=1
  else
    echo "$shape: $got cubin(s) in $d; ptxas: $(grep -m1 -o 'Used [0-9]* registers[^"]*' "$d/run.log" || echo 'no report')"
  fi
done
exit $rc
