# Session 46, call 1: decode-wgmma's correctness at its check points (now with SQ 16 / SQ 8 groups
# whose 64 packed rows fill the m64 tile), then cold timing: --wide (SQ 16 x G 4, SQ 8 x G 8 against
# a grid of decode-cluster) and --wgmma (MQA B 8, B 1 x SK 4096 / 1024 against decode-cluster's winners).
set -u
export PYTHONUNBUFFERED=1
exec > >(tee "$OUT/summary.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"
t0=$(date +%s)
timeout 150 python3 scripts/check_points.py decode_wgmma --cubin-dir .dev/dw/check > $OUT/check.txt 2>&1
echo "check rc=$? $(( $(date +%s) - t0 )) s"; grep -E "FAIL|checks" $OUT/check.txt | tail -5
t0=$(date +%s)
timeout 220 python3 scripts/decode_cold.py $OUT/wide.json --wide --cubin-dir .dev/dw/cold > $OUT/wide.txt 2>&1
echo "wide rc=$? $(( $(date +%s) - t0 )) s"; cat $OUT/wide.txt | tail -40
t0=$(date +%s)
timeout 200 python3 scripts/decode_cold.py $OUT/wgmma.json --wgmma --cubin-dir .dev/dw/cold > $OUT/wgmma.txt 2>&1
echo "wgmma rc=$? $(( $(date +%s) - t0 )) s"; cat $OUT/wgmma.txt | tail -40
