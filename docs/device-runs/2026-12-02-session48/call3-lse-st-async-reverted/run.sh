# Session 48, call 3: decode-wgmma: the producer starts the stream before the CTA barrier, LSEs by st.async,
# the first output chunk addressed before the wait: check points, timeline, paired cold A/B against main's 51590df templates.
set -u
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/summary.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
t0=$(date +%s)
timeout 150 python3 scripts/check_points.py decode_wgmma --cubin-dir .dev/dw/check > $OUT/check.txt 2>&1
echo "check rc=$? $(( $(date +%s) - t0 )) s"; grep -E "FAIL|checks" $OUT/check.txt | tail -5
python3 scripts/decode_timeline.py $OUT/tl_wgmma.json --only decode-wgmma --cubin-dir .dev/tl2 --samples 15 > $OUT/tl_wgmma.txt 2>&1
grep -E 'decode-wgmma|entry|issued|first|last  |v_last|loop|merged|sent|pushed|combined|exit|inited|prefetched' $OUT/tl_wgmma.txt
t0=$(date +%s)
timeout 240 python3 scripts/decode_cold.py $OUT/ab.json --against .dev/old/kernel-templates --wgmma-only --rounds 9 --cubin-dir .dev/dw/ab > $OUT/ab.txt 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s"; tail -8 $OUT/ab.txt
