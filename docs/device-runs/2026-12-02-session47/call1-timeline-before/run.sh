# Session 47 call 1: FA4's part 1, then decode-wgmma's timeline (stamped cubins built on the CPU: .dev/tl)
set -u
export PYTHONUNBUFFERED=1
python3 scripts/device_fa4.py install .dev/fa4/parts/part1 2>&1 | tail -1 | cut -c1-120
python3 scripts/decode_timeline.py $OUT/tl_wgmma.json --only decode-wgmma --cubin-dir .dev/tl --samples 15 2>&1 | tee $OUT/tl_wgmma.txt
