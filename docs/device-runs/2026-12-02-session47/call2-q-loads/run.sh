# Session 47, call 2: FA4's part 1; decode-wgmma with Q's loads issued together: its check points,
# the timeline (same points as call 1), cold sweeps --wgmma (MQA, B 1) and --wide (SQ 16 / SQ 8 groups).
set -u
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/summary.txt") 2>&1
python3 scripts/device_fa4.py install .dev/fa4/parts/part1 2>&1 | tail -1 | cut -c1-100
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
t0=$(date +%s)
timeout 150 python3 scripts/check_points.py decode_wgmma --cubin-dir .dev/dw/check > $OUT/check.txt 2>&1
echo "check rc=$? $(( $(date +%s) - t0 )) s"; grep -E "FAIL|checks" $OUT/check.txt | tail -5
python3 scripts/decode_timeline.py $OUT/tl_wgmma.json --only decode-wgmma --cubin-dir .dev/tl2 --samples 15 > $OUT/tl_wgmma.txt 2>&1
grep -E 'decode-wgmma|first|last  |exit' $OUT/tl_wgmma.txt
t0=$(date +%s)
timeout 200 python3 scripts/decode_cold.py $OUT/wgmma.json --wgmma --cubin-dir .dev/dw/cold > $OUT/wgmma.txt 2>&1
echo "wgmma rc=$? $(( $(date +%s) - t0 )) s"; tail -40 $OUT/wgmma.txt
t0=$(date +%s)
timeout 220 python3 scripts/decode_cold.py $OUT/wide.json --wide --cubin-dir .dev/dw/cold > $OUT/wide.txt 2>&1
echo "wide rc=$? $(( $(date +%s) - t0 )) s"; tail -40 $OUT/wide.txt
