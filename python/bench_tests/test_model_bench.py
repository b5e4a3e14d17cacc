"""CPU tests of scripts/model_bench.py (tiny model): the decode step's cache, the masks the
attention functions see, sdpa through the bench cache vs a plain full forward, and the
whole script on sdpa + null.

    PYTHONPATH=.deps/py python3 -m unittest discover -s python/bench_tests -v
"""
import importlib.util
import json
import os
import sys
import tempfile
import unittest
from unittest import mock

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("model_bench", os.path.join(ROOT, "scripts", "model_bench.py"))
mb = importlib.util.module_from_spec(_spec)
sys.modules["model_bench"] = mb
_spec.loader.exec_module(mb)

CTX = 48


class Args:
    """The parts of parse_args' namespace that setup_impls reads."""

    def __init__(self, impls=("sdpa",), no_share=False):
        self.impls, self.no_share, self.package = list(impls), no_share, "optimizerd_kernels_absent_for_test"


class BenchCacheTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.model = mb.build_model(layers=2, tiny=True, dtype=torch.float32, device="cpu", seed=0)
        g = torch.Generator().manual_seed(1)
        cls.tokens = torch.randint(0, cls.model.config.vocab_size, (2, CTX), generator=g)

    def setUp(self):
        mb.SEEN.clear()
        mb.setup_impls(Args(impls=("sdpa",)), log=lambda m: None)
        self.model.set_attn_implementation("sdpa")

    def tearDown(self):
        self.model.set_attn_implementation("sdpa")
        mb.unregister_all()
        mb.SEEN.clear()

    def decode(self, impl="sdpa"):
        cache = mb.make_decode_cache(self.model, self.tokens, CTX)
        mb.SEEN.clear()
        self.model.set_attn_implementation(impl)
        step = mb.decode_step(self.model, self.tokens[:, CTX - 1:], mb.decode_position_ids(2, CTX, "cpu"), cache)
        with torch.no_grad():
            return step(), cache

    def test_decode_step_sees_no_mask_and_exactly_ctx_keys(self):
        out, cache = self.decode()
        seen = mb.SEEN["sdpa"]
        self.assertEqual(len(seen), 1, seen)  # one call shape, the same in every layer
        e = seen[0]
        cfg = self.model.config
        self.assertIsNone(e["mask"])
        self.assertFalse(e["causal"])
        self.assertEqual(e["q"], [2, cfg.num_attention_heads, 1, cfg.head_dim])
        self.assertEqual(e["k"], [2, cfg.num_key_value_heads, CTX, cfg.head_dim])
        self.assertEqual(e["v"], e["k"])
        self.assertEqual(e["calls"], cfg.num_hidden_layers)
        self.assertEqual(tuple(out.shape), (2, 1, cfg.vocab_size))
        self.assertFalse(cache.is_compileable)

    def test_decode_through_bench_cache_equals_full_forward(self):
        out, _ = self.decode()
        with torch.no_grad():
            full = self.model(input_ids=self.tokens, use_cache=False, logits_to_keep=1).logits
        c = mb.compare(out, full)
        self.assertLess(c["rel_l2"], 1e-5, c)
        self.assertGreater(c["cosine_min"], 0.99999, c)
        torch.testing.assert_close(out, full, rtol=1e-4, atol=1e-4)

    def test_cache_holds_the_prefill_and_the_new_token(self):
        _, cache = self.decode()
        with torch.no_grad():
            from transformers import DynamicCache

            dyn = DynamicCache(config=self.model.config)
            self.model.set_attn_implementation("sdpa")
            self.model(input_ids=self.tokens, past_key_values=dyn, use_cache=True, logits_to_keep=1)
        for mine, ref in zip(cache.layers, dyn.layers):
            self.assertEqual(tuple(mine.keys.shape), tuple(ref.keys.shape))
            torch.testing.assert_close(mine.keys, ref.keys, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(mine.values, ref.values, rtol=1e-4, atol=1e-4)

    def test_prefill_sees_no_mask_and_is_causal(self):
        with torch.no_grad():
            mb.prefill_step(self.model, self.tokens)()
        e = mb.SEEN["sdpa"][0]
        self.assertIsNone(e["mask"])
        self.assertTrue(e["causal"])
        self.assertEqual(e["q"][2], CTX)
        self.assertEqual(e["k"][2], CTX)

    def test_null_returns_zeros_of_the_output_shape(self):
        mb.setup_impls(Args(impls=("sdpa",), no_share=False), log=lambda m: None)
        out, _ = self.decode("null")
        e = mb.SEEN["null"][0]
        self.assertIsNone(e["mask"])
        self.assertEqual(e["k"][2], CTX)
        q = torch.randn(2, 4, 3, 64)
        z, w = mb.null_attention(None, q, torch.randn(2, 2, 5, 64), torch.randn(2, 2, 5, 64), None)
        self.assertEqual(tuple(z.shape), (2, 3, 4, 64))
        self.assertIsNone(w)
        self.assertEqual(z.abs().sum().item(), 0)

    def test_unregister_restores_sdpa(self):
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        mb.unregister_all()
        self.assertIs(AttentionInterface._global_mapping["sdpa"], sdpa_attention_forward)
        self.assertIs(AttentionMaskInterface._global_mapping["sdpa"], sdpa_mask)
        self.assertNotIn("null", AttentionInterface._global_mapping)


class MaskUnderCaptureTest(unittest.TestCase):
    def test_capture_repeats_the_eager_decision(self):
        calls = []

        def mask_fn(**kw):
            calls.append(kw)
            # transformers materializes masks under stream capture; eager skips them
            return torch.ones(1) if capturing["now"] else None

        capturing = {"now": False}
        wrapped = mb._eager_decided(mask_fn)
        kw = dict(batch_size=1, q_length=1, kv_length=8, kv_offset=0, attention_mask=None, device="cpu")
        with mock.patch.object(torch.cuda, "is_available", return_value=True), \
                mock.patch.object(torch.cuda, "is_current_stream_capturing", side_effect=lambda: capturing["now"]):
            self.assertIsNone(wrapped(**kw))
            capturing["now"] = True
            self.assertIsNone(wrapped(**kw))           # eager said None: None under capture
            other = dict(kw, q_length=4, kv_length=4)   # never seen in eager: the original runs
            self.assertIsNotNone(wrapped(**other))
        self.assertEqual(len(calls), 2)


class ScriptTest(unittest.TestCase):
    def test_tiny_cpu_run(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "out.json")
            argv = ["--device", "cpu", "--tiny", "--package", "no_such_package_for_test", "--prefill", "1x32,2x16", "--decode", "1x32,2x32",
                    "--time-ms", "1", "--json", path]
            with mock.patch("sys.stdout"), mock.patch("sys.stderr"):
                self.assertEqual(mb.main(argv), 0)
            with open(path) as f:
                res = json.load(f)
        self.assertEqual(res["args"]["impls"], ["sdpa", "optimizerd", "fa4"])  # asked for by default ...
        self.assertIn("no_such_package_for_test", res["skipped"]["optimizerd"])  # ... skipped, with the reason
        self.assertEqual(res["implementations"][0], "sdpa")
        self.assertNotIn("optimizerd", res["implementations"])
        self.assertIn("| implementation |", res["markdown"])
        cases = res["cases"]
        self.assertEqual([(c["kind"], c["batch"], c["seq"]) for c in cases],
                         [("prefill", 1, 32), ("prefill", 2, 16), ("decode", 1, 32), ("decode", 2, 32)])
        for c in cases:
            for name in ("sdpa", "null"):
                e = c["impls"][name]
                self.assertIn("median_ms", e, e)
                self.assertEqual(len(e["seen"]), 1, e["seen"])
                seen = e["seen"][0]
                self.assertIsNone(seen["mask"])
                self.assertEqual(seen["k"][2], c["seq"])
                self.assertEqual(seen["q"][2], c["seq"] if c["kind"] == "prefill" else 1)
                self.assertEqual(seen["causal"], c["kind"] == "prefill")

    @unittest.skipUnless(os.path.isdir(os.path.join(ROOT, "python", "package", "optimizerd_kernels")),
                         "the optimizerd package skeleton is not in this checkout")
    def test_tiny_cpu_run_with_the_package(self):
        """The package from the repo (no kernels exported: on CPU its op runs SDPA)."""
        sys.path.insert(0, os.path.join(ROOT, "python", "package"))
        try:
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "out.json")
                argv = ["--device", "cpu", "--tiny", "--impls", "sdpa,optimizerd", "--no-share", "--prefill", "1x32",
                        "--decode", "2x32", "--time-ms", "1", "--json", path]
                with mock.patch("sys.stdout"), mock.patch("sys.stderr"):
                    self.assertEqual(mb.main(argv), 0)
                with open(path) as f:
                    res = json.load(f)
        finally:
            sys.path.remove(os.path.join(ROOT, "python", "package"))
        self.assertEqual(res["implementations"], ["sdpa", "optimizerd"], res["skipped"])
        for c in res["cases"]:
            e = c["impls"]["optimizerd"]
            self.assertIsNone(e["seen"][0]["mask"])
            self.assertTrue(e["vs_sdpa"]["pass"], e["vs_sdpa"])
            self.assertEqual([x["path"] for x in c["explain"].values()], ["fallback"])
        self.assertIn("optimizerd package path per attention shape", res["markdown"])


if __name__ == "__main__":
    unittest.main()
