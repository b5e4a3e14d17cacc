# Session 46: decode-wgmma and decode-cluster after their combine moved into common/cluster.cuh
# (cluster_combine_chunk): the check points of both, from cubins built on the CPU machine
# (python3 scripts/check_points.py decode_wgmma|k_first --build-cubins .dev/dw/check2).
set -u
export PYTHONUNBUFFERED=1
for s in decode_wgmma k_first; do
  timeout 200 python3 scripts/check_points.py $s --cubin-dir .dev/dw/check2 > $OUT/check_$s.txt 2>&1
  echo "$s rc=$?"; grep -E "FAIL|checks" $OUT/check_$s.txt | tail -3
done
