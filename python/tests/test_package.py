"""CPU tests of the package `optimizerd export --python` writes (python/package/).

The package under test is either the folder named by OPTD_PACKAGE_DIR (a real export:
tests/export_python.rs sets it after a scripted-worker run), or one assembled here from
python/package/ and a manifest written in this file. Either way it is installed with pip
from its folder, offline, into a temporary target, and imported from there.

Needs torch and transformers (scripts/setup.sh installs them into .deps/py). Under CI=true
a missing one is a failure, never a skip.

    PYTHONPATH=.deps/py python3 -m unittest discover -s python/tests -v
"""
import copy
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKELETON = os.path.join(REPO, "python", "package")
CI = os.environ.get("CI", "") not in ("", "0", "false")

try:
    import torch
    import transformers  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the machine
    if CI:
        raise RuntimeError(f"CI=true and {e}: scripts/setup.sh installs torch and transformers into .deps/py") from e
    raise unittest.SkipTest(f"{e}: run scripts/setup.sh and put .deps/py on PYTHONPATH")

FIXTURE_NAME = "optd_fixture_kernels"
H100 = dict(name="NVIDIA H100 80GB HBM3", cc=90, sms=132, smem_optin=232448)

# Formulas as the templates declare them (mma_fa2.cu, decode.cu, a wgmma-tma map).
PREFILL = {
    "file": "it7-mma-fa2.cu", "cubin": "it7-mma-fa2.cubin", "iteration": 7, "template": "mma-fa2",
    "params": {"WARP_ROWS": 16, "NUM_WARPS": 4, "KV_WARPS": 1, "BLOCK_N": 64, "STAGES": 2, "SWIZZLE": 1},
    "dtype": "bf16", "arch": "sm_90", "arch_specific": False, "min_cc": 80, "max_sq": None, "windows": False,
    "derived": [["block_m", "WARP_ROWS * NUM_WARPS // KV_WARPS"], ["m_blocks", "cdiv(SQ, block_m)"],
                ["row_bytes", "ELEM_BYTES * (D + 8 * (1 - SWIZZLE))"], ["splits", "1"]],
    "launches": [{"kernel": "optd_fwd_d{D}", "grid": ["m_blocks", "HQ", "B"], "block": ["NUM_WARPS * 32", "1", "1"],
                  "dyn_smem": "row_bytes * block_m + max(row_bytes * 2 * STAGES * KV_WARPS * BLOCK_N, "
                              "(NUM_WARPS - NUM_WARPS // KV_WARPS) * WARP_ROWS * (D + 8) * 4)", "when": None}],
    "tensor_maps": [],
    "shapes": [{"key": "b4hq32hkv8s2048d128-causal-bf16",
                "shape": {"b": 4, "hq": 32, "hkv": 8, "sq": 2048, "sk": 2048, "d": 128, "causal": True,
                          "dtype": "bf16", "layout": "bhsd"}}],
}
DECODE = {
    "file": "it9-decode-split.cu", "cubin": "it9-decode-split.cubin", "iteration": 9, "template": "decode-split",
    "params": {"NUM_WARPS": 4, "BLOCK_N": 32, "STAGES": 3, "SPLIT_WAVES": 1, "MIN_SPLIT_TILES": 2},
    "dtype": "bf16", "arch": "sm_90", "arch_specific": False, "min_cc": 80, "max_sq": 16, "windows": True,
    "derived": [["tile_n", "NUM_WARPS * BLOCK_N"], ["row_tiles", "cdiv(G * SQ, 16)"],
                ["groups", "B * HKV * row_tiles"], ["kv_tiles", "cdiv(SK, tile_n)"],
                ["want_splits", "max(1, min(cdiv(SPLIT_WAVES * SMS, groups), cdiv(kv_tiles, MIN_SPLIT_TILES)))"],
                ["tiles_per_split", "cdiv(kv_tiles, want_splits)"], ["splits", "cdiv(kv_tiles, tiles_per_split)"]],
    "launches": [
        {"kernel": "optd_fwd_d{D}", "grid": ["splits", "B * HKV", "row_tiles"], "block": ["NUM_WARPS * 32", "1", "1"],
         "dyn_smem": "ELEM_BYTES * D * 16 + max(ELEM_BYTES * D * 2 * STAGES * tile_n, NUM_WARPS * 16 * (D + 8) * 4)",
         "when": None},
        {"kernel": "optd_combine_d{D}", "grid": ["cdiv(B * HQ * SQ, 4)", "1", "1"], "block": ["128", "1", "1"],
         "dyn_smem": "0", "when": "splits > 1"}],
    "tensor_maps": [],
    "shapes": [{"key": "b8hq32hkv8sq1sk4096d128-bf16",
                "shape": {"b": 8, "hq": 32, "hkv": 8, "sq": 1, "sk": 4096, "d": 128, "causal": False,
                          "dtype": "bf16", "layout": "bhsd"}},
               # Mistral's decode over a long cache, sliding window 4096 (format 3's "window").
               {"key": "b8hq32hkv8sq1sk16384d128-causal-w4096-bf16",
                "shape": {"b": 8, "hq": 32, "hkv": 8, "sq": 1, "sk": 16384, "d": 128, "causal": True,
                          "window": 4096, "dtype": "bf16", "layout": "bhsd"}}],
}
HOPPER = {
    "file": "it12-wgmma-tma.cu", "cubin": "it12-wgmma-tma.cubin", "iteration": 12, "template": "wgmma-tma",
    "params": {"BLOCK_M": 128, "BLOCK_N": 128}, "dtype": "fp16", "arch": "sm_90a", "arch_specific": True,
    "min_cc": 90, "max_sq": None, "windows": True,
    "derived": [["m_blocks", "cdiv(SQ, BLOCK_M)"], ["splits", "1"]],
    "launches": [{"kernel": "optd_fwd_d{D}", "grid": ["m_blocks", "HQ", "B"], "block": ["384", "1", "1"],
                  "dyn_smem": "BLOCK_M * D * 2 + 4 * BLOCK_N * D * 2", "when": None}],
    "tensor_maps": [
        {"param_index": 17, "tensor": "q", "data_type": "uint16", "rank": 5, "dims": ["64", "SQ", "D // 64", "HQ", "B"],
         "strides_bytes": ["strides.q_s * 2", "128", "strides.q_h * 2", "strides.q_b * 2"],
         "box": ["64", "BLOCK_M", "D // 64", "1", "1"], "element_strides": [1, 1, 1, 1, 1], "swizzle_bytes": 128,
         "interleave": "none", "l2_promotion": "128B", "oob_fill": "none"},
        {"param_index": 18, "tensor": "k", "data_type": "uint16", "rank": 5,
         "dims": ["64", "SK", "D // 64", "HKV", "B"],
         "strides_bytes": ["strides.k_s * 2", "128", "strides.k_h * 2", "strides.k_b * 2"],
         "box": ["64", "BLOCK_N", "D // 64", "1", "1"], "element_strides": [1, 1, 1, 1, 1], "swizzle_bytes": 128,
         "interleave": "none", "l2_promotion": "128B", "oob_fill": "none"}],
    "shapes": [{"key": "b2h16s8192d128-causal",
                "shape": {"b": 2, "h": 16, "s": 8192, "d": 128, "causal": True, "dtype": "fp16"}}],
}
MANIFEST = {"format": 3, "run": "20261124-120000-abcd", "gpu": H100["name"], "device": H100,
            "package": {"name": FIXTURE_NAME, "optimizerd": "0.0.0-test"}, "kernels": [PREFILL, DECODE, HOPPER]}


def assemble(dest, name, manifest):
    """The package folder export writes, from the skeleton and a manifest."""
    shutil.copytree(os.path.join(SKELETON, "_optd_build"), os.path.join(dest, "_optd_build"))
    shutil.copytree(os.path.join(SKELETON, "optimizerd_kernels"), os.path.join(dest, name))
    with open(os.path.join(SKELETON, "pyproject.toml.in")) as f:
        text = f.read().replace("@NAME@", name).replace("@VERSION@", "0.0.0")
    with open(os.path.join(dest, "pyproject.toml"), "w") as f:
        f.write(text)
    kernels = os.path.join(dest, name, "kernels")
    os.makedirs(kernels, exist_ok=True)
    with open(os.path.join(kernels, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    for k in manifest["kernels"]:
        with open(os.path.join(kernels, k["cubin"]), "wb") as f:
            f.write(b"\x7fELF fixture")


def pip_install(folder, target):
    """`pip install DIR` as a user runs it, with no index: the build backend is in-tree."""
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
                          "--disable-pip-version-check", "--target", target, folder], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(f"pip install {folder} failed:\n{out.stdout}\n{out.stderr}")


def setUpModule():
    global PKG, NAME, DIRS, EXPORTED
    DIRS = tempfile.mkdtemp(prefix="optd-pkg-")
    src = os.environ.get("OPTD_PACKAGE_DIR")
    EXPORTED = bool(src)
    if src:
        with open(os.path.join(src, "pyproject.toml")) as f:
            NAME = next(l.split('"')[1] for l in f if l.startswith("name"))
    else:
        NAME = FIXTURE_NAME
        src = os.path.join(DIRS, "src")
        assemble(src, NAME, MANIFEST)
    target = os.path.join(DIRS, "site")
    pip_install(src, target)
    sys.path.insert(0, target)
    PKG = importlib.import_module(NAME)


def tearDownModule():
    sys.path[:] = [p for p in sys.path if not p.startswith(DIRS)]
    shutil.rmtree(DIRS, ignore_errors=True)


def seen(sq, sk, window=0):
    """[Sq, Sk] booleans, one key at a time: row i (position p = i + Sk - Sq) sees j <= p, and with
    a sliding window also j > p - window."""
    return torch.tensor([[j <= i + sk - sq and (not window or j > i + sk - sq - window) for j in range(sk)]
                         for i in range(sq)], dtype=torch.bool)


def reference(q, k, v, causal, scale=None, window=0):
    """fp32 attention, [B,H,S,D], GQA by repetition, bottom-right causal (within the window)."""
    g = q.shape[1] // k.shape[1]
    kr, vr = k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1)
    s = (q.float() @ kr.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        s = s.masked_fill(seen(sq, sk, window).logical_not(), float("-inf"))
    return s.softmax(-1) @ vr


class Installed(unittest.TestCase):
    def test_installs_offline_and_names_its_op_after_the_package(self):
        self.assertTrue(PKG.__file__.startswith(DIRS), PKG.__file__)
        self.assertTrue(hasattr(getattr(torch.ops, NAME), "attention"))
        info = PKG.info()
        self.assertEqual(info["package"], NAME)
        self.assertTrue(info["kernels"])
        self.assertEqual(info["launcher_error"], "no CUDA device at import")

    def test_manifest_names_existing_cubins(self):
        folder = os.path.join(os.path.dirname(PKG.__file__), "kernels")
        for k in PKG._op.dispatcher().manifest["kernels"]:
            self.assertTrue(os.path.isfile(os.path.join(folder, k["cubin"])), k["cubin"])
            if EXPORTED:  # a real export: NVRTC's cubins and the sources beside them
                with open(os.path.join(folder, k["cubin"]), "rb") as f:
                    self.assertEqual(f.read(4), b"\x7fELF")
                self.assertTrue(os.path.isfile(os.path.join(folder, k["file"])))


class Op(unittest.TestCase):
    """The op on CPU tensors (the SDPA path), and everything torch asks of a custom op."""

    def run_case(self, b, hq, hkv, sq, sk, d, causal, layout, scale=None, window=0):
        torch.manual_seed(0)
        q, k, v = torch.randn(b, hq, sq, d), torch.randn(b, hkv, sk, d), torch.randn(b, hkv, sk, d)
        args = (q, k, v) if layout == "bhsd" else tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))
        o = PKG.attention(*args, causal=causal, scale=scale, layout=layout, window=window)
        self.assertTrue(o.is_contiguous())
        got = o if layout == "bhsd" else o.transpose(1, 2)
        torch.testing.assert_close(got, reference(q, k, v, causal, scale, window), atol=1e-5, rtol=1e-5)

    def test_a_sliding_window_matches_the_reference(self):
        """Prefill, chunked prefill and decode, GQA and MQA, both layouts; windows of one key,
        narrower than the chunk's offset, wider, and of Sk or more (which mask nothing)."""
        for case in [(2, 8, 2, 33, 33, 64, True, "bhsd", None, 1), (2, 8, 2, 33, 33, 64, True, "bshd", None, 7),
                     (1, 4, 4, 5, 40, 32, True, "bhsd", None, 9), (1, 4, 1, 5, 40, 32, True, "bshd", None, 38),
                     (2, 8, 1, 1, 70, 64, True, "bshd", None, 16), (1, 8, 2, 4, 70, 64, True, "bhsd", 0.3, 3),
                     (1, 4, 2, 17, 17, 16, True, "bhsd", None, 17), (1, 4, 2, 1, 17, 16, True, "bhsd", None, 500)]:
            with self.subTest(case=case):
                self.run_case(*case)
        # The mask the op builds is the contract's, key by key.
        for sq, sk, w in ((33, 33, 7), (5, 40, 9), (1, 70, 16), (4, 70, 3), (17, 17, 1)):
            self.assertTrue(torch.equal(PKG._op.window_mask(sq, sk, w), seen(sq, sk, w)), (sq, sk, w))

    def test_matches_the_reference_for_gqa_decode_chunked_causal_and_both_layouts(self):
        for case in [(2, 8, 2, 33, 33, 64, True, "bhsd"), (1, 8, 1, 1, 70, 64, False, "bshd"),
                     (2, 4, 4, 5, 40, 32, True, "bshd"), (1, 4, 2, 17, 17, 16, False, "bhsd", 0.3)]:
            with self.subTest(case=case):
                self.run_case(*case)

    def test_misuse_is_refused_with_the_reason(self):
        q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 3, 8, 16)
        cases = [((q, q, q), dict(layout="bsdh"), "layout must be"),
                 ((q, q, q), dict(window=4), "window must be 0 .* with causal"),
                 ((q, q, q), dict(causal=True, window=-1), "window must be 0"),
                 ((q[0], q, q), {}, "must be 4-d"),
                 ((q, q.half(), q), {}, "one dtype"),
                 ((q, k, k), {}, "multiple of key/value heads"),
                 ((q, q[..., :8], q[..., :8]), {}, "q's B and D")]
        for args, kw, text in cases:
            with self.subTest(text=text), self.assertRaisesRegex(Exception, text):
                PKG.attention(*args, **kw)

    def test_fallbacks_are_logged_once_per_shape_and_then_capped(self):
        op = PKG._op
        saved = set(op._logged)
        op._logged.clear()
        try:
            def report(sk):
                call = PKG._dispatch.Call(dtype="bf16", device=0, causal=False, layout="bhsd", b=1, hq=8, hkv=8, sq=1,
                                          sk=sk, d=64, strides=(0,) * 9)
                op._report(call, PKG._dispatch.Decision("fallback", "no exported kernel for class decode-d64"))
            with self.assertLogs(NAME, "INFO") as logs:
                report(100)
                report(100)  # the same shape: not again
                for sk in range(101, 101 + op.MAX_LOGGED + 5):  # a growing KV cache: a new shape per token
                    report(sk)
            self.assertEqual(len(logs.records), op.MAX_LOGGED + 1)
            self.assertIn("the rest are not logged", logs.records[-1].getMessage())
        finally:
            op._logged.clear()
            op._logged.update(saved)

    def test_fake_implementation_gives_the_output_shape(self):
        for layout, shape in (("bhsd", (2, 8, 5, 64)), ("bshd", (2, 5, 8, 64))):
            q = torch.empty(shape, device="meta", dtype=torch.bfloat16)
            kv = torch.empty((2, 2, 40, 64) if layout == "bhsd" else (2, 40, 2, 64), device="meta", dtype=torch.bfloat16)
            o = getattr(torch.ops, NAME).attention(q, kv, kv, True, None, layout)
            self.assertEqual((o.shape, o.dtype, o.device.type), (torch.Size(shape), torch.bfloat16, "meta"))

    def test_opcheck_passes(self):
        q, k = torch.randn(1, 4, 9, 16), torch.randn(1, 2, 12, 16)
        for args in ((q, k, k.clone(), True, None, "bhsd"), (q, k, k.clone(), True, None, "bhsd", 5)):
            torch.library.opcheck(getattr(torch.ops, NAME).attention.default, args,
                                  test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))

    def test_the_schema_takes_the_window_last_with_default_0(self):
        schema = str(getattr(torch.ops, NAME).attention.default._schema)
        self.assertIn("str layout=\"bhsd\", int window=0) -> Tensor", schema)

    def test_torch_compile_fullgraph_traces_it_without_a_break(self):
        def block(q, k, v):
            return PKG.attention(q * 2, k, v, causal=True).sum(-1)

        q, k = torch.randn(1, 4, 9, 16), torch.randn(1, 2, 9, 16)
        compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(q, k, k), block(q, k, k))


class Dispatch(unittest.TestCase):
    """The policy, on the fixture manifest alone (what the launcher asks per signature)."""

    @classmethod
    def setUpClass(cls):
        cls.d = PKG._dispatch.Dispatcher(copy.deepcopy(MANIFEST), "/nonexistent")
        cls.gpu = PKG._dispatch.Gpu(**H100)

    def call(self, b, hq, hkv, sq, sk, d, causal=False, dtype="bf16", layout="bhsd", **kw):
        def strides(h, s):
            return (h * s * d, s * d, d) if layout == "bhsd" else (s * h * d, d, h * d)
        st = strides(hq, sq) + strides(hkv, sk) * 2
        return PKG._dispatch.Call(dtype=dtype, device=0, causal=causal, layout=layout, b=b, hq=hq, hkv=hkv, sq=sq,
                                  sk=sk, d=d, strides=kw.pop("strides", st), **kw)

    def test_the_tuned_shape_runs_its_kernel(self):
        dec = self.d.decide(self.call(4, 32, 8, 2048, 2048, 128, causal=True), self.gpu)
        self.assertEqual((dec.path, dec.kernel["file"]), ("exact", "it7-mma-fa2.cu"))
        self.assertEqual(dec.launches[0].grid, (2048 // 64, 32, 4))
        self.assertEqual(dec.launches[0].smem, 2 * 128 * 64 + 2 * 128 * 2 * 2 * 64)

    def test_a_shape_where_sdpa_won_the_closing_comparison_runs_sdpa_unless_asked(self):
        manifest = copy.deepcopy(MANIFEST)
        manifest["kernels"][0]["shapes"][0]["closing"] = {"ours_us": 88.42, "sdpa_default_us": 85.49,
                                                          "sdpa_picked": "cudnn", "fa4_us": None}
        exact = self.call(4, 32, 8, 2048, 2048, 128, causal=True)
        near = self.call(4, 32, 8, 1900, 1900, 128, causal=True)
        d = PKG._dispatch.Dispatcher(manifest, "/nonexistent")
        for call, where in ((exact, "on this shape"), (near, "on the nearest tuned shape b4hq32hkv8s2048d128")):
            dec = d.decide(call, self.gpu)
            self.assertEqual(dec.path, "fallback")
            self.assertIn(f"SDPA was faster {where}", dec.reason)
            self.assertIn("85.49 us cudnn vs 88.42 us", dec.reason)
        always = PKG._dispatch.Dispatcher(manifest, "/nonexistent", always_kernels=True)
        self.assertEqual(always.decide(exact, self.gpu).path, "exact")
        manifest["kernels"][0]["shapes"][0]["closing"]["sdpa_default_us"] = 90.0  # ours won
        self.assertEqual(PKG._dispatch.Dispatcher(manifest, "/x").decide(exact, self.gpu).path, "exact")

    def test_the_tuned_shape_in_the_other_layout_is_still_exact(self):
        dec = self.d.decide(self.call(8, 32, 8, 1, 4096, 128, layout="bshd"), self.gpu)
        self.assertEqual((dec.path, dec.kernel["file"], dec.reason), ("exact", "it9-decode-split.cu",
                                                                      "tuned for this shape (in bhsd)"))

    def test_an_unseen_shape_of_the_class_runs_the_class_kernel_with_its_own_geometry(self):
        dec = self.d.decide(self.call(2, 32, 8, 3000, 3000, 128, causal=True, layout="bshd"), self.gpu)
        self.assertEqual((dec.path, dec.kernel["file"]), ("class", "it7-mma-fa2.cu"))
        self.assertEqual(dec.launches[0].grid, (-(-3000 // 64), 32, 2))
        self.assertIn("compute-d128-causal", dec.reason)
        dec = self.d.decide(self.call(1, 32, 8, 1, 1000, 128), self.gpu)
        self.assertEqual((dec.path, dec.kernel["file"]), ("class", "it9-decode-split.cu"))
        kv_tiles = -(-1000 // 128)
        want = max(1, min(-(-132 // 8), -(-kv_tiles // 2)))
        splits = -(-kv_tiles // -(-kv_tiles // want))
        self.assertEqual(dec.splits, splits)
        self.assertEqual([l.kernel for l in dec.launches], ["optd_fwd_d128", "optd_combine_d128"])
        # The split workspace: o_partial, then the LSEs and one split semaphore per row.
        plan = PKG._dispatch.encode_plan(dec, [0, 1], self.call(1, 32, 8, 1, 1000, 128))
        self.assertEqual(plan[1:4], [splits, splits * 32 * 128, (splits + 1) * 32])

    def test_no_kernel_of_the_class_falls_back_and_says_what_the_package_has(self):
        for call, text in [(self.call(4, 32, 8, 2048, 2048, 128, causal=False), "no exported kernel for class "
                            "compute-d128 bf16"),
                           (self.call(4, 32, 8, 2048, 2048, 64, causal=True), "class compute-d64-causal"),
                           (self.call(1, 32, 8, 1, 4096, 128, dtype="float32"), "dtype float32"),
                           (self.call(1, 32, 8, 1, 4096, 128, needs_grad=True), "forward-only"),
                           (self.call(1, 32, 8, 1, 4096, 128, aligned=False), "16-byte aligned"),
                           (self.call(1, 32, 8, 1, 4096, 128, strides=(4, 128, 128) * 3), "multiples of 8"),
                           (self.call(1, 32, 8, 4, 2, 128), "SQ 4 > SK 2")]:
            with self.subTest(text=text):
                dec = self.d.decide(call, self.gpu)
                self.assertEqual(dec.path, "fallback")
                self.assertIn(text, dec.reason)
                self.assertEqual(PKG._dispatch.encode_plan(dec, [], call), [0])

    def test_a_gpu_the_cubins_do_not_run_on_falls_back_with_the_reason(self):
        l4 = PKG._dispatch.Gpu(name="NVIDIA L4", cc=89, sms=58, smem_optin=101376)
        dec = self.d.decide(self.call(8, 32, 8, 1, 4096, 128), l4)
        self.assertEqual(dec.path, "fallback")
        self.assertIn("sm_89", dec.reason)
        dec = self.d.decide(self.call(2, 16, 16, 8192, 8192, 128, causal=True, dtype="fp16"),
                            PKG._dispatch.Gpu(name="H20", cc=100, sms=78, smem_optin=232448))
        self.assertIn("runs only on compute capability 9.0", dec.reason)

    def test_a_kernel_whose_formulas_do_not_cover_the_shape_is_passed_over(self):
        small = PKG._dispatch.Gpu(name="tiny", cc=90, sms=132, smem_optin=48 * 1024)
        dec = self.d.decide(self.call(4, 32, 8, 2048, 2048, 128, causal=True), small)
        self.assertEqual(dec.path, "fallback")
        self.assertIn("bytes of shared memory", dec.reason)

    def test_tensor_maps_resolve_over_the_calls_strides_and_encode(self):
        call = self.call(2, 16, 16, 8192, 8192, 128, causal=True, dtype="fp16", layout="bshd")
        dec = self.d.decide(call, self.gpu)
        self.assertEqual((dec.path, dec.kernel["file"]), ("exact", "it12-wgmma-tma.cu"))  # tuned in bhsd
        q_map = dec.maps[0]
        self.assertEqual(q_map["dims"], [64, 8192, 2, 16, 2])
        self.assertEqual(q_map["strides_bytes"], [16 * 128 * 2, 128, 128 * 2, 8192 * 16 * 128 * 2])
        plan = PKG._dispatch.encode_plan(dec, [5], call)
        # lse_partial: (splits + 1) * B*HQ*SQ words, the LSEs then the split semaphores.
        self.assertEqual(plan[:6], [1, 1, 2 * 16 * 8192 * 128, (1 + 1) * 2 * 16 * 8192, 1, 2])
        self.assertEqual(len(plan), 6 + 8 + 2 * 26)
        self.assertEqual(plan[6:14], [5, 64, 16, 2, 384, 1, 1, 128 * 128 * 2 + 4 * 128 * 128 * 2])

    def test_a_kernels_refusal_passes_the_shape_over_with_its_reason(self):
        """The template's [[refuse]] travels in the manifest: where `when` holds the kernel
        is not used, and the reason says why."""
        k = dict(HOPPER, refuse=[{"when": "CAUSAL and SQ > 4096", "why": "a test's refusal"}])
        call = self.call(2, 16, 16, 8192, 8192, 128, causal=True, dtype="fp16")
        dec, why = self.d._plan("exact", k, call, self.gpu, "c")
        self.assertIsNone(dec)
        self.assertIn("a test's refusal", why)
        dec, why = self.d._plan("exact", HOPPER, call, self.gpu, "c")
        self.assertIsNone(why)

    def test_a_swizzle_given_as_a_formula_of_the_head_dim_is_evaluated(self):
        """wgmma-tma's maps swizzle 64 bytes at D 96 (three panels of 32 columns), 128 elsewhere:
        its manifest entry writes the swizzle as that formula and P as (formula) // 2."""
        sw = "64 if D == 96 else 128"
        p = f"(({sw}) // 2)"
        k = dict(HOPPER, tensor_maps=[dict(HOPPER["tensor_maps"][1], swizzle_bytes=sw,
                                           dims=[p, "SK", f"D // {p}", "HKV", "B"],
                                           strides_bytes=["strides.k_s * 2", f"({sw})", "strides.k_h * 2", "strides.k_b * 2"],
                                           box=[p, "BLOCK_N", f"D // {p}", "1", "1"], param_index=17)])
        for d, swizzle, panels in ((96, 64, 3), (128, 128, 2)):
            call = self.call(1, 32, 32, 1000, 1000, d, causal=True)
            env = dict(B=1, HQ=32, HKV=32, SQ=1000, SK=1000, D=d, BLOCK_N=128)
            (m,) = self.d._maps(k, call, env)
            self.assertEqual((m["swizzle"], m["dims"], m["box"]),
                             (swizzle, [swizzle // 2, 1000, panels, 32, 1], [swizzle // 2, 128, panels, 1, 1]))
            self.assertEqual(m["strides_bytes"][1], swizzle)

    def test_formulas_compile_to_python_and_refuse_what_is_not_arithmetic(self):
        f = PKG._dispatch.Formulas()
        env = dict(SK=100, CAUSAL=0, SMS=132, strides=PKG._dispatch.SimpleNamespace(q_s=8))
        self.assertEqual(f.eval("cdiv(SK, 64) if CAUSAL else max(1, min(SK // 2, SMS))", env), 50)
        self.assertEqual(f.eval("strides.q_s * 2", env), 16)
        self.assertEqual(f.eval("SK > 64 and not CAUSAL", env), 1)
        for bad in ("__import__('os').getcwd()", "SK.__class__", "open('manifest.json')", "SK / 3"):
            with self.subTest(bad=bad), self.assertRaises(Exception):
                f.eval(bad, env)

    def test_the_launcher_key_round_trips(self):
        call = self.call(3, 8, 2, 5, 77, 64, causal=True, layout="bshd")
        key = [1, 0, 1, 1, 3, 8, 2, 5, 77, 64, *call.strides, 1, 1, 0, 0, 0]
        self.assertEqual(PKG._dispatch.Call.from_key(key), call)
        self.assertEqual(call.shape_key, "b3hq8hkv2sq5sk77d64-causal-bf16-bshd")
        # The window is key[22] (csrc/launcher.cpp `Key`); the shape key carries it after -causal.
        windowed = self.call(3, 8, 2, 5, 77, 64, causal=True, layout="bshd", window=16)
        self.assertEqual(PKG._dispatch.Call.from_key(key[:22] + [16, 0]), windowed)
        self.assertEqual(windowed.shape_key, "b3hq8hkv2sq5sk77d64-causal-w16-bf16-bshd")

    def test_a_windowed_call_runs_the_kernel_tuned_with_that_window(self):
        call = self.call(8, 32, 8, 1, 16384, 128, causal=True, window=4096)
        dec = self.d.decide(call, self.gpu)
        self.assertEqual((dec.path, dec.kernel["file"]), ("exact", "it9-decode-split.cu"))
        # An unseen windowed decode shape: the class kernel tuned with a window.
        dec = self.d.decide(self.call(1, 32, 8, 1, 9000, 128, causal=True, window=1024), self.gpu)
        self.assertEqual((dec.path, dec.kernel["file"]), ("class", "it9-decode-split.cu"))
        self.assertIn("b8hq32hkv8sq1sk16384d128-causal-w4096-bf16", dec.reason)
        # The same dims without a window are not that tuned shape (they match the unwindowed one).
        dec = self.d.decide(self.call(8, 32, 8, 1, 16384, 128, causal=True), self.gpu)
        self.assertEqual(dec.path, "class")

    def test_a_windowed_call_never_runs_a_kernel_without_windows(self):
        # it7-mma-fa2 ("windows": false) is tuned for exactly these dims, causal.
        for w in (1, 512, 2047):
            with self.subTest(window=w):
                dec = self.d.decide(self.call(4, 32, 8, 2048, 2048, 128, causal=True, window=w), self.gpu)
                self.assertEqual(dec.path, "fallback")
                self.assertIn("it7-mma-fa2.cu: its template does not implement sliding windows", dec.reason)
        dec, why = self.d._plan("exact", PREFILL, self.call(4, 32, 8, 2048, 2048, 128, causal=True, window=64),
                                self.gpu, "c")
        self.assertIsNone(dec)
        self.assertIn("does not implement sliding windows", why)
        # A window of Sk keys or more masks nothing: the plain causal kernel runs it.
        for w in (2048, 4096):
            dec = self.d.decide(self.call(4, 32, 8, 2048, 2048, 128, causal=True, window=w), self.gpu)
            self.assertEqual((dec.path, dec.kernel["file"]), ("exact", "it7-mma-fa2.cu"))
        # A window without causal is refused before any kernel is looked at.
        dec = self.d.decide(self.call(8, 32, 8, 1, 16384, 128, causal=False, window=4096), self.gpu)
        self.assertEqual(dec.path, "fallback")
        self.assertIn("only with causal", dec.reason)

    def test_formulas_read_the_window(self):
        k = dict(DECODE, refuse=[{"when": "WINDOW > 0 and WINDOW < 2048", "why": "a narrow window"}])
        narrow = self.call(8, 32, 8, 1, 16384, 128, causal=True, window=1024)
        dec, why = self.d._plan("exact", k, narrow, self.gpu, "c")
        self.assertIsNone(dec)
        self.assertIn("a narrow window", why)
        for call in (self.call(8, 32, 8, 1, 16384, 128, causal=True, window=4096),
                     self.call(8, 32, 8, 1, 16384, 128, causal=True)):
            dec, why = self.d._plan("exact", k, call, self.gpu, "c")
            self.assertIsNone(why)

    def test_a_manifest_that_cannot_be_used_says_why_and_what_to_do(self):
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaisesRegex(PKG._dispatch.ManifestError, "does not exist.*export it again"):
                PKG._dispatch.Dispatcher.load(tmp)
            for fmt in (1, 2):  # kernels of ABI v1 / v2 take no window: this runtime passes 17 arguments
                with open(os.path.join(tmp, "manifest.json"), "w") as f:
                    json.dump(dict(MANIFEST, format=fmt), f)
                with self.assertRaisesRegex(PKG._dispatch.ManifestError, f"`format` is {fmt}.*export the package again"):
                    PKG._dispatch.Dispatcher.load(tmp)
            manifest = copy.deepcopy(MANIFEST)
            del manifest["kernels"][1]["windows"]
            with open(os.path.join(tmp, "manifest.json"), "w") as f:
                json.dump(manifest, f)
            with self.assertRaisesRegex(PKG._dispatch.ManifestError, "kernels\\[1\\] has no `windows`"):
                PKG._dispatch.Dispatcher.load(tmp)


class Launcher(unittest.TestCase):
    def test_the_cpp_launcher_builds_here_and_registers_the_cuda_kernel(self):
        """Compiled against this torch with the CUDA headers of its pip wheels, in a fresh
        interpreter (OPTIMIZERD_KERNELS_BUILD=1 builds it without a GPU)."""
        code = (f"import torch, {NAME} as p; print(p.info()['launcher_error']); "
                f"print(torch._C._dispatch_has_kernel_for_dispatch_key('{NAME}::attention', 'CUDA')); "
                f"print(p.info()['launcher'])")
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, OPTIMIZERD_KERNELS_BUILD="1", OPTIMIZERD_KERNELS_CACHE=cache,
                       # scripts/setup.sh's CUDA 13.0 headers (with crt/, which torch's wheels lack)
                       CUDA_HOME=os.environ.get("CUDA_HOME") or os.path.join(REPO, ".deps", "cuda", "nvidia", "cu13"),
                       PYTHONPATH=os.pathsep.join([os.path.join(DIRS, "site")] + sys.path))
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
            self.assertEqual(out.returncode, 0, out.stderr[-3000:])
            error, registered, path = out.stdout.strip().splitlines()[-3:]
            self.assertEqual((error, registered), ("None", "True"), out.stderr[-3000:])
            self.assertTrue(path.startswith(cache) and os.path.isfile(path), path)


class Transformers(unittest.TestCase):
    def test_the_mask_function_leaves_out_causal_only_masks_even_under_capture(self):
        import transformers.masking_utils as mu

        mask = PKG._transformers.mask
        capturing = mu.is_tracing
        try:  # what transformers sees while a CUDA graph is captured
            mu.is_tracing = lambda *a, **k: True
            self.assertIsNone(mask(batch_size=2, q_length=1, kv_length=40, mask_function=mu.causal_mask_function))
            self.assertIsNone(mask(batch_size=2, q_length=9, kv_length=9, mask_function=mu.causal_mask_function))
        finally:
            mu.is_tracing = capturing
        for kw in (dict(allow_is_causal_skip=False), dict(local_size=4), dict(attention_mask=torch.ones(2, 9).bool())):
            with self.subTest(**{k: str(v)[:20] for k, v in kw.items()}):
                m = mask(batch_size=2, q_length=9, kv_length=9, mask_function=mu.causal_mask_function, **kw)
                if m is not None:
                    self.assertEqual(tuple(m.shape)[-2:], (9, 9))
        m = mask(batch_size=2, q_length=3, kv_length=9, mask_function=mu.causal_mask_function, q_offset=6)
        self.assertTrue(m is None or m.shape[-2:] == (3, 9))
        m = mask(batch_size=2, q_length=9, kv_length=9, mask_function=mu.causal_mask_function, allow_is_causal_skip=False)
        self.assertEqual(tuple(m.shape), (2, 1, 9, 9))

    def test_the_mask_function_leaves_out_sliding_window_masks_the_op_expresses(self):
        import transformers.masking_utils as mu

        tf = importlib.import_module(f"{NAME}._transformers")
        mask, fn = tf.mask, mu.sliding_window_causal_mask_function(4)
        for q_length in (1, 9):  # decode, and prefill (one query row per key)
            self.assertIsNone(mask(batch_size=2, q_length=q_length, kv_length=9, mask_function=fn, local_size=4))
        self.assertIn(4, tf._elided_windows)
        # Padding, or a chunk over a longer cache (top-left here), still get sdpa_mask's window mask.
        m = mask(batch_size=2, q_length=9, kv_length=9, mask_function=fn, local_size=4,
                 attention_mask=torch.tensor([[0] * 2 + [1] * 7, [1] * 9]).bool())
        self.assertEqual(tuple(m.shape)[-2:], (9, 9))
        m = mask(batch_size=2, q_length=3, kv_length=9, mask_function=fn, local_size=4, q_offset=6)
        self.assertTrue(m is None or m.shape[-2:] == (3, 9))

    def test_a_layers_window_comes_from_the_kwarg_the_module_or_its_config(self):
        from types import SimpleNamespace as NS

        tf = importlib.import_module(f"{NAME}._transformers")
        self.assertEqual(tf.layer_window(NS(), {"sliding_window": 4096}), 4096)
        self.assertIsNone(tf.layer_window(NS(), {"sliding_window": None}))
        self.assertEqual(tf.layer_window(NS(sliding_window=7), {}), 7)  # qwen2_moe: the attribute only
        saved = set(tf._elided_windows)
        try:
            tf._elided_windows.clear()
            phimoe = NS(config=NS(sliding_window=2047), layer_idx=0)  # phimoe, doge: the config only
            self.assertIsNone(tf.layer_window(phimoe, {}))  # no window mask was left out at that size
            tf._elided_windows.add(2047)
            self.assertEqual(tf.layer_window(phimoe, {}), 2047)
            types = ["sliding_attention", "full_attention"]
            self.assertEqual(tf.layer_window(NS(config=NS(sliding_window=2047, layer_types=types), layer_idx=0), {}), 2047)
            self.assertIsNone(tf.layer_window(NS(config=NS(sliding_window=2047, layer_types=types), layer_idx=1), {}))
        finally:
            tf._elided_windows.clear()
            tf._elided_windows.update(saved)

    def test_a_mistral_with_a_sliding_window_runs_the_op_with_the_window_and_matches_sdpa(self):
        from transformers import MistralConfig, MistralForCausalLM

        name = PKG.register_transformers("optimizerd-test")
        cfg = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=97, max_position_embeddings=64, sliding_window=5)
        torch.manual_seed(0)
        model = MistralForCausalLM(cfg).eval()
        ids = torch.randint(0, 97, (2, 12))
        seen_windows = []
        op = PKG._op.OP

        def spy(q, k, v, causal, scale, layout, window=0):
            seen_windows.append((q.shape[1], k.shape[1], causal, window))
            return op(q, k, v, causal, scale, layout, window)

        PKG._transformers._delegated.clear()
        with torch.no_grad():
            model.set_attn_implementation("sdpa")
            want = model(ids).logits
            model.set_attn_implementation(name)
            PKG._op.OP = spy
            try:
                got = model(ids).logits
                out = model(ids[:, :11], use_cache=True)
                step = model(ids[:, 11:], past_key_values=out.past_key_values, use_cache=True).logits
            finally:
                PKG._op.OP = op
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(step[:, -1], want[:, -1], atol=1e-5, rtol=1e-5)
        # Prefill reached the op with the window (no mask, nothing delegated), in every layer.
        self.assertEqual(seen_windows[:2], [(12, 12, True, 5)] * 2)
        self.assertEqual(PKG._transformers._delegated, set())

    def test_a_sliding_layer_the_op_cannot_run_gets_its_window_mask_back(self):
        """Gemma 2's local layers soft-cap the logits: transformers' SDPA runs them, and since the
        mask function left their window mask out, it is rebuilt for that call."""
        from transformers import Gemma2Config, Gemma2ForCausalLM

        name = PKG.register_transformers("optimizerd-test")
        cfg = Gemma2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, vocab_size=97, max_position_embeddings=64,
                           sliding_window=5, attn_logit_softcapping=50.0, final_logit_softcapping=None)
        torch.manual_seed(0)
        model = Gemma2ForCausalLM(cfg).eval()
        ids = torch.randint(0, 97, (2, 12))
        PKG._transformers._delegated.clear()
        with torch.no_grad():
            model.set_attn_implementation("sdpa")
            want = model(ids).logits
            model.set_attn_implementation(name)
            got = model(ids).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        self.assertTrue(any("softcap" in why for _, _, why in PKG._transformers._delegated))

    def test_a_llama_runs_with_attn_implementation_optimizerd_and_matches_sdpa(self):
        from transformers import LlamaConfig, LlamaForCausalLM

        name = PKG.register_transformers("optimizerd-test")
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=97, max_position_embeddings=64)
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
        ids = torch.randint(0, 97, (2, 12))
        with torch.no_grad():
            model.set_attn_implementation("sdpa")
            want = model(ids).logits
            model.set_attn_implementation(name)
            got = model(ids).logits
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            # Decode over a cache: one query row against all keys, no mask.
            out = model(ids[:, :11], use_cache=True)
            step = model(ids[:, 11:], past_key_values=out.past_key_values, use_cache=True).logits
            torch.testing.assert_close(step[:, -1], want[:, -1], atol=1e-5, rtol=1e-5)
        # Both reached the op: transformers passed no mask (sdpa_mask left it out), nothing was delegated.
        self.assertEqual(PKG._transformers._delegated, set())
        with torch.no_grad():  # padding needs a mask: transformers' own SDPA runs it, and it says so
            mask = torch.ones(2, 12, dtype=torch.long)
            mask[0, :3] = 0
            got = model(ids, attention_mask=mask).logits
            model.set_attn_implementation("sdpa")
            torch.testing.assert_close(got, model(ids, attention_mask=mask).logits, atol=1e-5, rtol=1e-5)
        self.assertTrue(any("attention_mask" in why for _, _, why in PKG._transformers._delegated))


if __name__ == "__main__":
    unittest.main()
