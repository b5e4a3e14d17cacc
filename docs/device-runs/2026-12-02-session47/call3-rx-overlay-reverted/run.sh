# Session 47, call 3: decode-wgmma with the receive area over the drained V ring (a cluster barrier
# after the K/V loop): its check points (two new ones that fit only so), the timeline, and the
# cold sweeps --wgmma and --wide against decode-cluster.
set -u
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/summary.txt") 2>&1
t0=$(date +%s)
timeout 150 python3 scripts/check_points.py decode_wgmma --cubin-dir .dev/dw/check > $OUT/check.txt 2>&1
echo "check rc=$? $(( $(date +%s) - t0 )) s"; grep -E "FAIL|checks" $OUT/check.txt | tail -5
python3 scripts/decode_timeline.py $OUT/tl_wgmma.json --only decode-wgmma --cubin-dir .dev/tl3 --samples 15 > $OUT/tl_wgmma.txt 2>&1
grep -E 'decode-wgmma|first|last  |loop|sync_a|exit' $OUT/tl_wgmma.txt
timeout 200 python3 scripts/decode_cold.py $OUT/wgmma.json --wgmma --cubin-dir .dev/dw/cold > $OUT/wgmma.txt 2>&1
echo "wgmma rc=$?"; grep -E 'SDPA default|decode-wgmma' $OUT/wgmma.txt | head -30
timeout 220 python3 scripts/decode_cold.py $OUT/wide.json --wide --cubin-dir .dev/dw/cold > $OUT/wide.txt 2>&1
echo "wide rc=$?"; grep -E 'SDPA default|decode-wgmma' $OUT/wide.txt | head -30
