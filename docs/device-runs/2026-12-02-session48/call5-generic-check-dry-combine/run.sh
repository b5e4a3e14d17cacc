# Session 48, call 5: FA4's part 1; the generic templates' register-staged Q checked (check_points.py generic_q);
# experiment 2: the combine's loop run dry before the wait, then for real (is the real pass then warm?).
set -u
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/summary.txt") 2>&1
python3 scripts/device_fa4.py install .dev/fa4/parts/part1 2>&1 | tail -1 | cut -c1-100
t0=$(date +%s)
timeout 120 python3 scripts/check_points.py generic_q --cubin-dir .dev/gq/cp > $OUT/gq_check.txt 2>&1
echo "generic check rc=$? $(( $(date +%s) - t0 )) s"; grep -E "FAIL|checks" $OUT/gq_check.txt | tail -5
python3 .dev/tl_exp2.py $OUT/tl_exp2.json --cubin-dir .dev/tl4 --samples 15 > $OUT/tl_exp2.txt 2>&1
echo "tl_exp2 rc=$?"; grep -E 'CTAs: call|summed|merged|sent|dry|pushed|combined|exit' $OUT/tl_exp2.txt
