# Session 48, call 4: decode-wgmma with only the producer's early start (the send as before): check points,
# timeline, paired cold A/B against main's templates; the combine run three times (cold caches or work?);
# the generic templates' register-staged Q: correctness and a paired A/B against main's.
set -u
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/summary.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
t0=$(date +%s)
timeout 150 python3 scripts/check_points.py decode_wgmma --cubin-dir .dev/dw/check > $OUT/check.txt 2>&1
echo "check rc=$? $(( $(date +%s) - t0 )) s"; grep -E "FAIL|checks" $OUT/check.txt | tail -5
python3 scripts/decode_timeline.py $OUT/tl_wgmma.json --only decode-wgmma --cubin-dir .dev/tl2 --samples 15 > $OUT/tl_wgmma.txt 2>&1
grep -E 'decode-wgmma|issued|first|last  |v_last|loop|merged|sent|pushed|combined|exit|inited' $OUT/tl_wgmma.txt
t0=$(date +%s)
timeout 200 python3 scripts/decode_cold.py $OUT/ab.json --against .dev/old/kernel-templates --wgmma-only --rounds 11 --cubin-dir .dev/dw/ab > $OUT/ab.txt 2>&1
echo "ab rc=$? $(( $(date +%s) - t0 )) s"; tail -7 $OUT/ab.txt
python3 .dev/tl_exp.py $OUT/tl_exp.json --cubin-dir .dev/tl3 --samples 15 > $OUT/tl_exp.txt 2>&1
echo "tl_exp rc=$?"; grep -E 'CTAs: call|pushed|pass0|pass1|combined' $OUT/tl_exp.txt
if [[ -n "${GQ_CHECK:-}" ]]; then
  t0=$(date +%s)
  timeout 240 python3 scripts/check_templates_gpu.py --template kv_split.cu --template memory.cu --template wmma.cu --no-time --cubin-dir .dev/gq/check > $OUT/gq_check.txt 2>&1
  echo "generic check rc=$? $(( $(date +%s) - t0 )) s"; grep -iE "fail|checks|passed|mismatch" $OUT/gq_check.txt | tail -6
fi
t0=$(date +%s)
timeout 200 python3 scripts/check_templates_gpu.py --time-best --points generic_q --time-against .dev/old/kernel-templates --no-check --rounds 7 --cubin-dir .dev/gq/tb > $OUT/gq_ab.txt 2>&1
echo "generic ab rc=$? $(( $(date +%s) - t0 )) s"; tail -14 $OUT/gq_ab.txt
