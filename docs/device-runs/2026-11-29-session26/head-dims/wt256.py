"""Session 26: wgmma_tma.cu's D 256 points on the GPU against the fp32 reference."""
import sys
sys.path.insert(0, "scripts")
import check_templates_gpu as c
from nvrtc_compile_check import load_templates
tpl = next(t for t in load_templates() if t.rel == "wgmma_tma.cu")
base = dict(BLOCK_N=80, STAGES=2, CONSUMERS=2, PINGPONG=1, OVERLAP=1, PERSISTENT=1, LAZY_RESCALE=1, TAIL_SPLIT=1,
            EPI_TMA=0, PACK_GQA=0, STREAM_K=0, LPT_MIB=8, DYNAMIC=1, Q_STAGES=1, PV_WAIT=1)
points = [base, dict(base, BLOCK_N=64), dict(base, OVERLAP=0), dict(base, PINGPONG=0), dict(base, PINGPONG=0, OVERLAP=0, BLOCK_N=64),
          dict(base, PERSISTENT=0), dict(base, PACK_GQA=1), dict(base, PACK_GQA=1, BLOCK_N=64, PERSISTENT=0),
          dict(base, STREAM_K=1), dict(base, PV_WAIT=0, LAZY_RESCALE=0, TAIL_SPLIT=0, DYNAMIC=0)]
shapes = [s for s in c.CHECK_SHAPES + c.EXTRA_CHECK_SHAPES if s.d == 256] + [
    c.gqa(1, 16, 8, 4096, 4096, 256, True), c.gqa(2, 16, 8, 1000, 1000, 256, False, "bshd", padded=True),
    c.gqa(1, 16, 8, 512, 4096, 256, True), c.mha(1, 2, 81, 256, False)]
gpu = c.Gpu()
fails = n = 0
for kn in points:
    for dtype in ("fp16", "bf16"):
        worst = 0.0
        for s in shapes:
            try:
                c.plan(tpl, kn, s, gpu.dev)
            except c.DoesNotFit as e:
                print("  does not fit", c.shape_key(s), e); continue
            n += 1
            try:
                ok, msg = gpu.check(tpl, kn, s, dtype)
            except Exception as e:  # noqa
                ok, msg = False, str(e).splitlines()[0][:200]
            if ok:
                worst = max(worst, gpu.last_errors[1])
            else:
                fails += 1
                print("  FAIL", c.combo_label(kn), dtype, c.shape_key(s), msg)
        print(f"{c.combo_label({k: v for k, v in kn.items() if base.get(k) != v}) or 'base (BLOCK_N 80, C2, S2, EPI_TMA 0)':60} {dtype} worst rel_l2 {worst:.2e}")
print(f"wgmma_tma D 256: {n} checks, {fails} failures")
