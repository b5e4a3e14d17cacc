#!/bin/bash
# ncu source counters (warp-stall samples per SASS instruction), our wgmma-tma kernel and
# FlashAttention-4 at the same shapes: where each kernel's warps wait, instruction by instruction
# (issue 19: "whatever the profile shows"). Run on the GPU machine; FA4 optional (absent, only ours).
#
#   OUT=/tmp/src bash scripts/ncu_source.sh "4,16,4096,64|BLOCK_N=128,..." "4,16,4,2048,2048,64,causal|..."
# A case is "shape|knobs" as scripts/ncu_vs_fa4.sh takes it. Per case and kernel: NAME.ncu-rep, NAME_sass.csv
# (ncu --page source --csv --print-source sass), then scripts/ncu_source_summary.py prints each
# kernel's stall reasons, its top instructions and a per-opcode table, FA4 beside ours.
# PACK=1: afterwards the CSVs, logs and cases.txt go into one OUT/ncu_source.tgz and the .ncu-rep
# reports are removed (the device tool returns at most 8 files from its $OUT).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/ncu_source}"
mkdir -p "$OUT"
fa4=0
python3 -c "import flash_attn.cute" 2>/dev/null && fa4=1
prof() {  # prof NAME ARGS... : one launch with the source counters, then its SASS page as CSV
  local name="$1"; shift
  ncu --clock-control none --profile-from-start off --launch-count 1 --section WarpStateStats \
    --section SourceCounters --import-source no -f -o "$OUT/$name" python3 scripts/profile_one.py "$@" \
    > "$OUT/$name.log" 2>&1 || { echo "ncu failed for $name (rc $?), see $name.log"; tail -5 "$OUT/$name.log"; return 1; }
  ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/${name}_sass.csv" 2> "$OUT/${name}_sass.err" \
    || { echo "source page export failed for $name"; cat "$OUT/${name}_sass.err"; return 1; }
}
for case in "$@"; do
  shape="${case%%|*}"; knobs="${case##*|}"; tag="${shape//,/_}"
  prof "ours_$tag" wgmma_tma.cu "$knobs" "$shape"
  (( fa4 )) && prof "fa4_$tag" fa4 - "$shape"
  echo "$tag|$knobs" >> "$OUT/cases.txt"
done
python3 scripts/ncu_source_summary.py "$OUT"
if [[ "${PACK:-0}" == 1 ]]; then
  (cd "$OUT" && tar czf ncu_source.tgz --exclude='*.ncu-rep' --exclude=ncu_source.tgz \
     $(ls *.csv *.log *.err cases.txt 2>/dev/null) && rm -f ./*.csv ./*.log ./*.err ./*.ncu-rep cases.txt)
fi
