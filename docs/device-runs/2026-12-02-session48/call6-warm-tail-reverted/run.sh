# Session 48, call 6: FA4's part 1; decode-cluster WARM_TAIL 1 (rank 0's pushed combine run dry in the prologue):
# check_points.py warm_tail, then the paired cold A/B WARM_TAIL 0 against 1 (decode_cold.py --warm-tail).
set -u
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/summary.txt") 2>&1
python3 scripts/device_fa4.py install .dev/fa4/parts/part1 2>&1 | tail -1 | cut -c1-100
t0=$(date +%s)
timeout 150 python3 scripts/check_points.py warm_tail --cubin-dir .dev/wt/check > $OUT/wt_check.txt 2>&1
echo "check rc=$? $(( $(date +%s) - t0 )) s"; grep -E "FAIL|checks" $OUT/wt_check.txt | tail -5
t0=$(date +%s)
timeout 200 python3 scripts/decode_cold.py $OUT/wt_ab.json --warm-tail --rounds 11 --cubin-dir .dev/wt/ab > $OUT/wt_ab.txt 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s"; tail -9 $OUT/wt_ab.txt
