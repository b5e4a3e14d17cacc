#!/usr/bin/env bash
# Session 26: the new head dims (96, 256) on the GPU: every template that lists them, checked
# against the fp32 reference on CHECK_SHAPES' D 96 / D 256 shapes (covering sets of knob
# pairs), then the old head dims of the templates the change touched, same way.
set -u
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
export OPTIMIZERD_NVRTC_LIB=$(ls /usr/local/cuda/lib64/libnvrtc.so.13* 2>/dev/null | head -1)
export OPTIMIZERD_CUDA_INCLUDE=/usr/local/cuda/include
T="--template baseline.cu --template decode.cu --template decode_cluster.cu --template mma_fa2.cu --template kv_split.cu --template memory.cu --template wmma.cu --template wgmma_tma.cu"
P="--pairs decode.cu --pairs decode_cluster.cu --pairs mma_fa2.cu --pairs kv_split.cu --pairs memory.cu --pairs wmma.cu --pairs wgmma_tma.cu"
t0=$(date +%s)
python3 scripts/check_templates_gpu.py --build-cubins /tmp/cub -j 16 --arch sm_90 $T $P > $OUT/build.txt 2>&1; echo "build rc=$? $(( $(date +%s) - t0 )) s"; tail -3 $OUT/build.txt
t0=$(date +%s)
timeout ${NEW_S:-300} python3 scripts/check_templates_gpu.py --cubin-dir /tmp/cub --no-time --head-dims 96,256 $T $P > $OUT/check_new.txt 2>&1; echo "new head dims rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^== |FAIL|correctness:" $OUT/check_new.txt | head -60
t0=$(date +%s)
timeout ${OLD_S:-200} python3 scripts/check_templates_gpu.py --cubin-dir /tmp/cub --no-time --head-dims 64,128 $T $P > $OUT/check_old.txt 2>&1; echo "old head dims rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^== |FAIL|correctness:" $OUT/check_old.txt | head -40
