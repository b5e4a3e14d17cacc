# Session 48, call 1: every decode_timeline.py point at main's 51590df, with the prologue stamps
# (k0_copy; decode-wgmma inited, prefetched). Cubins: decode_timeline.py --build-cubins .dev/tl.
set -u
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/summary.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
timeout 400 python3 scripts/decode_timeline.py $OUT/tl.json --cubin-dir .dev/tl --samples 15 > $OUT/tl.txt 2>&1
echo "timeline rc=$? $(( $(date +%s) - t0 )) s"
grep -E 'CTAs: call|entry|k0_copy|inited|prefetched|issued|first |last  |exit' $OUT/tl.txt
