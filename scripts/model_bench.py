#!/usr/bin/env python3
"""End-to-end model benchmark: a Llama-3-8B-shaped transformers model on attention
implementations "sdpa", "optimizerd" (an exported optimizerd package) and "fa4"
(FlashAttention-4, flash_attn.cute), with the same random weights.

The model: transformers.LlamaConfig with Llama-3-8B's shapes (hidden 4096, 32 query heads,
8 KV heads, head dim 128, MLP 14336, vocab 128256, rope_theta 500000), `--layers` decoder
layers (default 4; the full model has 32), random weights (seeded, no download), bf16, eval.
Each implementation is selected on the same model object (`model.set_attn_implementation`),
so weights and inputs are identical.

What is measured (bf16; on CUDA each step is one CUDA graph, warmed up, then replayed):
- prefill (B, S): one full forward of B sequences of S random tokens from an empty cache,
  use_cache=False, causal, logits of the last position only (`logits_to_keep=1`; the
  128256-wide lm_head over all S positions would dominate otherwise). Milliseconds per forward.
- decode (B, ctx): one decode step: B sequences of one new token each at position ctx-1,
  whose attention reads a KV cache of exactly ctx keys per sequence (ctx-1 prefilled, plus the
  new token's K/V that the step writes in place), then norm and lm_head. Microseconds per
  step (= per generated token of each sequence). The cache is `BenchKVCache` below: a
  preallocated [B, Hkv, ctx, D] buffer per layer, returned whole; every slot is valid at the
  measured step, so the step needs no mask (transformers passes attention_mask=None for one
  query row over a non-"compileable" cache; a StaticCache would force a mask, and the
  optimizerd hook runs SDPA when a mask is given). The bench records and prints what the
  attention function saw (shapes, mask) so this is checked, not assumed.
- Times: every implementation's graph is captured first, then all are timed in 5
  interleaved rounds (a, b, c, a, b, c, ...), so that clock and temperature drift over the
  run falls on each alike: median over every replay timed one by one with CUDA events, and a
  sustained figure: replays back to back, >= --sustain-ms (200 ms) per implementation in all.
- attention share: the same graph with attention replaced by "null" (returns zeros of the
  output's shape): share = 1 - t_null / t; t - t_null estimates the attention time per step.
- correctness: the last-position logits of each implementation vs "sdpa" on the same weights
  and inputs (taken from the captured graph's output, i.e. what was timed): max |diff|,
  relative L2 (||a-b|| / ||b||), cosine, top-1 agreement; PASS if rel L2 <= --rel-tol and
  cosine >= 0.999. For scale, "sdpa-flash" (SDPA forced to its flash backend, eager) vs
  "sdpa" gives the difference between two correct bf16 kernels.
- which path the optimizerd package took per shape (`explain`, `stats`), so a fallback to
  SDPA is visible.

Masks and CUDA graphs: transformers' mask functions materialize a mask whenever a CUDA stream
is capturing (`is_tracing` includes stream capture), which would send every implementation
through a masked path inside the graph. The bench therefore wraps each implementation's mask
function: under capture it returns None where the same call in eager mode (the warm-up just
before) returned None, and the original function otherwise. Nothing changes in eager mode.

Run on the GPU machine:  python3 scripts/model_bench.py [--json out.json]
Smoke:                   python3 scripts/model_bench.py --quick
CPU test config:         python3 scripts/model_bench.py --device cpu --tiny
"""
import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

import torch

LLAMA3_8B = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                 intermediate_size=14336, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192,
                 rms_norm_eps=1e-5, tie_word_embeddings=False)
TINY = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512,
            vocab_size=1024, rope_theta=500000.0, max_position_embeddings=1024, rms_norm_eps=1e-5,
            tie_word_embeddings=False)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
IMPLS = ("sdpa", "optimizerd", "fa4")


# ---------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------
def parse_cases(text):
    """'1x4096,4x1024' -> [(1, 4096), (4, 1024)]"""
    out = []
    for part in text.split(","):
        part = part.strip()
        if part:
            b, s = part.lower().split("x")
            out.append((int(b), int(s)))
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impls", default=",".join(IMPLS),
                   help="comma list of sdpa, optimizerd, fa4 (sdpa is always run: it is the reference)")
    p.add_argument("--package", default="optimizerd_kernels", help="the exported optimizerd package's import name")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 4; --tiny 2)")
    p.add_argument("--prefill", default=None, help="prefill cases BxS, comma-separated (default 1x4096,4x1024)")
    p.add_argument("--decode", default=None, help="decode cases BxCTX, comma-separated (default 1x4096,8x4096)")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-graphs", action="store_true", help="time eager forwards instead of CUDA graph replays")
    p.add_argument("--no-share", action="store_true", help="skip the 'null' runs (attention share)")
    p.add_argument("--time-ms", type=float, default=300.0, help="target time of the per-replay measurement")
    p.add_argument("--sustain-ms", type=float, default=200.0, help="minimum length of the sustained measurement")
    p.add_argument("--rel-tol", type=float, default=None,
                   help="PASS threshold on relative L2 of logits vs sdpa (default 0.02 bf16/fp16, 1e-4 fp32)")
    p.add_argument("--quick", action="store_true", help="small smoke config (2 layers, short sequences, few replays)")
    p.add_argument("--tiny", action="store_true", help="tiny model for CPU tests (2 layers, hidden 256, 4/2 heads)")
    p.add_argument("--json", default=None, help="also write the results as JSON to this path")
    a = p.parse_args(argv)
    a.impls = [x.strip() for x in a.impls.split(",") if x.strip()]
    for x in a.impls:
        if x not in IMPLS:
            p.error(f"unknown implementation {x!r} (known: {', '.join(IMPLS)})")
    if "sdpa" not in a.impls:
        a.impls.insert(0, "sdpa")
    if a.tiny:
        layers, pre, dec = 2, "1x128,2x64", "1x128,2x128"
    elif a.quick:
        layers, pre, dec = 2, "1x1024,2x512", "1x1024,4x1024"
    else:
        layers, pre, dec = 4, "1x4096,4x1024", "1x4096,8x4096"
    a.layers = a.layers or layers
    a.prefill_cases = parse_cases(a.prefill or pre)
    a.decode_cases = parse_cases(a.decode or dec)
    if a.quick or a.tiny:
        a.time_ms, a.sustain_ms = min(a.time_ms, 60.0), min(a.sustain_ms, 50.0)
    a.use_graphs = (not a.no_graphs) and a.device.startswith("cuda")
    if a.rel_tol is None:
        a.rel_tol = 1e-4 if a.dtype == "fp32" else 0.02
    return a


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------
def build_model(layers=4, tiny=False, dtype=torch.bfloat16, device="cpu", seed=0):
    """Llama-3-8B-shaped LlamaForCausalLM (or the tiny one) with seeded random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = TINY if tiny else LLAMA3_8B
    config = LlamaConfig(num_hidden_layers=layers, attention_bias=False, mlp_bias=False, **shape)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    return model


# ---------------------------------------------------------------------------
# The decode step's KV cache
# ---------------------------------------------------------------------------
def _cache_classes():
    from transformers.cache_utils import Cache, CacheLayerMixin

    class BenchKVLayer(CacheLayerMixin):
        """One layer's K/V: a preallocated [B, Hkv, ctx, D] buffer. `update` writes the step's
        new K/V in place at `pos` (slots pos .. pos+n-1) and returns the whole buffer, so the
        attention reads exactly ctx keys. Not compileable (so transformers leaves the mask
        out for one query row); the write is at a fixed slot, so a CUDA graph replays it."""

        is_compileable = False
        is_sliding = False

        def __init__(self, keys, values, pos):
            super().__init__()
            self.keys, self.values, self.pos = keys, values, pos
            self.max_cache_len = keys.shape[2]
            self.dtype, self.device = keys.dtype, keys.device
            self.is_initialized = True

        def lazy_initialization(self, key_states, value_states):
            pass

        def update(self, key_states, value_states, *args, **kwargs):
            n = key_states.shape[-2]
            if self.pos + n > self.max_cache_len:
                raise ValueError(f"BenchKVLayer: {n} new tokens at {self.pos} overflow {self.max_cache_len} slots")
            self.keys[:, :, self.pos:self.pos + n].copy_(key_states)
            self.values[:, :, self.pos:self.pos + n].copy_(value_states)
            return self.keys, self.values

        def get_mask_sizes(self, query_length):
            return self.max_cache_len, 0

        def get_seq_length(self):
            return self.pos  # tokens before the step: the new token's position

        def get_max_length(self):
            return self.max_cache_len

        def reset(self):
            pass

    class BenchKVCache(Cache):
        """The decode bench's cache: per layer a full [B, Hkv, ctx, D] K/V buffer (`BenchKVLayer`)."""

        def __init__(self, layers):
            super().__init__(layers=layers)

        @classmethod
        def allocate(cls, config, batch, ctx, pos, dtype, device):
            hkv = config.num_key_value_heads
            d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            layers = []
            for _ in range(config.num_hidden_layers):
                k = torch.zeros(batch, hkv, ctx, d, dtype=dtype, device=device)
                v = torch.zeros(batch, hkv, ctx, d, dtype=dtype, device=device)
                layers.append(BenchKVLayer(k, v, pos))
            return cls(layers)

    return BenchKVLayer, BenchKVCache


def make_decode_cache(model, tokens, ctx):
    """A BenchKVCache of ctx slots for tokens [B, ctx]: slots 0..ctx-2 hold the K/V of a
    prefill of tokens[:, :ctx-1] (with the model's current attention implementation), slot
    ctx-1 is for the decode step's token tokens[:, ctx-1]."""
    from transformers import DynamicCache

    _, BenchKVCache = _cache_classes()
    b = tokens.shape[0]
    p = next(model.parameters())
    cache = BenchKVCache.allocate(model.config, b, ctx, ctx - 1, p.dtype, p.device)
    with torch.no_grad():
        dyn = DynamicCache(config=model.config)
        model(input_ids=tokens[:, :ctx - 1], past_key_values=dyn, use_cache=True, logits_to_keep=1)
        for layer, src in zip(cache.layers, dyn.layers):
            assert src.keys.shape[2] == ctx - 1, src.keys.shape
            layer.keys[:, :, :ctx - 1].copy_(src.keys)
            layer.values[:, :, :ctx - 1].copy_(src.values)
    return cache


def decode_position_ids(batch, ctx, device):
    return torch.full((batch, 1), ctx - 1, dtype=torch.long, device=device)


# ---------------------------------------------------------------------------
# Attention implementations
# ---------------------------------------------------------------------------
SEEN = {}          # impl -> list of dicts, one per attention call shape (what the function saw)
EXPLAINED = {}     # (q shape, k shape, causal) -> optimizerd explain() result
_saved = {}        # name -> (attention fn or None, mask fn or None) before the bench touched it


def _record(name, query, key, value, attention_mask, kwargs, module):
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    entry = dict(q=list(query.shape), k=list(key.shape), v=list(value.shape),
                 mask=None if attention_mask is None else list(attention_mask.shape),
                 causal=bool(is_causal) and query.shape[2] > 1,
                 capturing=query.is_cuda and torch.cuda.is_current_stream_capturing())
    lst = SEEN.setdefault(name, [])
    sig = {k: v for k, v in entry.items() if k != "capturing"}
    for e in lst:
        if {k: v for k, v in e.items() if k not in ("capturing", "calls")} == sig:
            e["calls"] += 1
            e["capturing"] = e["capturing"] or entry["capturing"]
            return e
    entry["calls"] = 1
    lst.append(entry)
    return entry


def null_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Zeros of the output's shape [B, Sq, Hq, D]: the step without attention."""
    b, h, s, d = query.shape
    return query.new_zeros(b, s, h, value.shape[-1]), None


def make_fa4_attention(flash_attn_func):
    def fa4_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if attention_mask is not None or dropout:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                          dropout=dropout, **kwargs)
        is_causal = kwargs.get("is_causal")
        is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        causal = bool(is_causal) and query.shape[2] > 1
        # [B,H,S,D] views -> [B,S,H,D] views (HF's projections are [B,S,H,D] in memory, so q
        # is contiguous again; K/V from the cache are strided views, which FA4 takes as they are).
        # GQA: FA4 takes Hkv < Hq directly. Causal is bottom-right (same as top-left for Sq == Sk).
        out = flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                              softmax_scale=scaling, causal=causal)
        if isinstance(out, tuple):
            out = out[0]
        return out, None

    return fa4_attention


def _recording(name, fn, package=None):
    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        entry = _record(name, query, key, value, attention_mask, kwargs, module)
        if package is not None and attention_mask is None and entry["calls"] == 1:
            k = (tuple(query.shape), tuple(key.shape), entry["causal"])
            if k not in EXPLAINED:
                try:
                    EXPLAINED[k] = package.explain(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                                   causal=entry["causal"], layout="bshd")
                except Exception as e:  # noqa: BLE001 - reported, not fatal
                    EXPLAINED[k] = {"path": "?", "kernel": None, "reason": f"explain failed: {e}"}
        return fn(module, query, key, value, attention_mask, *args, **kwargs)

    attention.__wrapped__ = fn
    return attention


def _eager_decided(mask_fn):
    """Under CUDA-graph capture, return None where eager mode returned None for the same call."""
    decided = {}

    def mask(*args, **kwargs):
        key = (kwargs.get("batch_size"), kwargs.get("q_length"), kwargs.get("kv_length"), kwargs.get("kv_offset"),
               kwargs.get("attention_mask") is None, str(kwargs.get("device")))
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        if capturing and decided.get(key) == "none":
            return None
        m = mask_fn(*args, **kwargs)
        if not capturing:
            decided[key] = "none" if m is None else "mask"
        return m

    mask.__wrapped__ = mask_fn
    return mask


def register(name, attention_fn, mask_fn, package=None):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if name not in _saved:
        _saved[name] = (AttentionInterface._global_mapping.get(name),
                        AttentionMaskInterface._global_mapping.get(name))
    AttentionInterface.register(name, _recording(name, attention_fn, package))
    AttentionMaskInterface.register(name, _eager_decided(mask_fn))


def unregister_all():
    """Put transformers' interfaces back as they were before the bench registered anything."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name, (fn, mask) in _saved.items():
        for iface, old in ((AttentionInterface, fn), (AttentionMaskInterface, mask)):
            if old is None:
                iface._global_mapping.pop(name, None)
            else:
                iface._global_mapping[name] = old
    _saved.clear()


def setup_impls(args, log):
    """Register the implementations; returns (available names, {name: skip reason}, package)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    ok, skipped, package = [], {}, None
    register("sdpa", sdpa_attention_forward, sdpa_mask)
    ok.append("sdpa")
    if "optimizerd" in args.impls:
        try:
            import importlib

            package = importlib.import_module(args.package)
            package.register_transformers("optimizerd")
            fn = AttentionInterface._global_mapping["optimizerd"]
            mask = AttentionMaskInterface._global_mapping.get("optimizerd", sdpa_mask)
            register("optimizerd", fn, mask, package)
            ok.append("optimizerd")
        except Exception as e:  # noqa: BLE001 - absent or broken package: say so and go on
            skipped["optimizerd"] = f"package {args.package!r} not usable: {type(e).__name__}: {e}".splitlines()[0]
            package = None
    if "fa4" in args.impls:
        try:
            from flash_attn.cute import flash_attn_func

            register("fa4", make_fa4_attention(flash_attn_func), sdpa_mask)
            ok.append("fa4")
        except Exception as e:  # noqa: BLE001
            skipped["fa4"] = f"flash_attn.cute does not import: {type(e).__name__}: {e}".splitlines()[0]
    if not args.no_share:
        register("null", null_attention, sdpa_mask)
    for name, why in skipped.items():
        log(f"skip {name}: {why}")
    return ok, skipped, package


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------
def measure_eager(step, args):
    """Time `step` (a no-arg callable returning the logits) eagerly, one call at a time
    (--no-graphs, and CPU). Returns (timing dict in ms, output tensor copy)."""
    dev = args.device
    with torch.no_grad():
        out = step()  # warm-up
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        times = []
        t_end = time.perf_counter() + args.time_ms / 1e3
        while len(times) < 3 or (time.perf_counter() < t_end and len(times) < 200):
            t0 = time.perf_counter()
            out = step()
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    return _summary(times, None, None), out.detach().float().clone()


def capture(step):
    """`step` warmed up on a side stream, then captured as a CUDA graph: (graph, output)."""
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = step()
        torch.cuda.synchronize()
    return g, out


def time_interleaved(graphs, args, rounds=5):
    """Time every captured graph in interleaved rounds (a, b, c, a, b, c, ...), so that clock
    and temperature drift over the run falls on every implementation alike rather than on
    whichever ran last: per round and graph, replays timed one by one with CUDA events (about
    time_ms / rounds), then replays back to back for sustain_ms / rounds. Returns
    {name: timing dict in ms}: median/p10/p90 over every timed replay, and the sustained mean."""
    per, est = {}, {}
    for name, g in graphs.items():  # warm-up replays, and an estimate of one replay
        t0 = time.perf_counter()
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
        est[name] = max((time.perf_counter() - t0) * 1e3 / 5, 1e-3)
        per[name] = {"times": [], "sustained_ms": 0.0, "sustained_n": 0}
    for _ in range(rounds):
        for name, g in graphs.items():
            n = int(min(max(args.time_ms / rounds / est[name], 5), 400))
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            for a, b in ev:
                a.record()
                g.replay()
                b.record()
            torch.cuda.synchronize()
            per[name]["times"] += [a.elapsed_time(b) for a, b in ev]
            m = int(max(math.ceil(args.sustain_ms / rounds / est[name]), 3))
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(m):
                g.replay()
            b.record()
            torch.cuda.synchronize()
            per[name]["sustained_ms"] += a.elapsed_time(b)
            per[name]["sustained_n"] += m
    out = {}
    for name, p in per.items():
        n, total = p["sustained_n"], p["sustained_ms"]
        out[name] = dict(_summary(p["times"], total / n, (n, total)), rounds=rounds)
    return out


def _summary(times, sustained, sustained_run):
    ts = sorted(times)
    q = lambda f: ts[min(len(ts) - 1, int(f * (len(ts) - 1) + 0.5))]  # noqa: E731
    d = dict(median_ms=statistics.median(ts), p10_ms=q(0.1), p90_ms=q(0.9), min_ms=ts[0], n=len(ts))
    if sustained is not None:
        d.update(sustained_ms=sustained, sustained_n=sustained_run[0], sustained_total_ms=sustained_run[1])
    return d


def compare(a, b):
    """Logits a vs reference b ([B, 1, V] or [B, V], float32)."""
    a, b = a.reshape(a.shape[0], -1).float(), b.reshape(b.shape[0], -1).float()
    diff = (a - b)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    return dict(max_abs=diff.abs().max().item(), ref_max_abs=b.abs().max().item(),
                rel_l2=(diff.norm() / b.norm().clamp_min(1e-30)).item(), cosine_min=cos.min().item(),
                top1_agree=(a.argmax(-1) == b.argmax(-1)).float().mean().item())


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------
def prefill_step(model, ids):
    def step():
        return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits

    return step


def decode_step(model, ids, pos, cache):
    def step():
        return model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True,
                     logits_to_keep=1).logits

    return step


def _flash_reference(model, step, args):
    """The step in eager mode with SDPA forced to its flash backend (a second correct bf16 kernel)."""
    if not args.device.startswith("cuda"):
        return None, "CPU"
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        model.set_attn_implementation("sdpa")
        with torch.no_grad(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return step().detach().float().clone(), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}".splitlines()[0]


def run_case(model, kind, b, s, impls, args, log):
    """One case for every implementation: timings, outputs, what attention saw, correctness."""
    dev = args.device
    g = torch.Generator(device="cpu").manual_seed(args.seed * 1000 + b * 7 + s)
    vocab = model.config.vocab_size
    res = {"kind": kind, "batch": b, "seq": s, "impls": {}}
    if kind == "prefill":
        ids = torch.randint(0, vocab, (b, s), generator=g).to(dev)
        step = prefill_step(model, ids)
    else:
        tokens = torch.randint(0, vocab, (b, s), generator=g).to(dev)
        model.set_attn_implementation("sdpa")
        cache = make_decode_cache(model, tokens, s)
        step = decode_step(model, tokens[:, s - 1:], decode_position_ids(b, s, dev), cache)
    outs, graphs, held = {}, {}, []
    for name in impls:
        SEEN.clear()
        model.set_attn_implementation(name)
        entry = {}
        try:
            t0 = time.perf_counter()
            if args.use_graphs:
                g, out = capture(step)
                graphs[name] = g
                held.append(out)
                outs[name] = out  # the graph's output buffer: read after the timed replays
            else:
                timing, outs[name] = measure_eager(step, args)
                entry.update(timing)
            entry["wall_s"] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - one failing implementation must not lose the others
            entry["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            log(f"{kind} B{b} S{s} {name}: ERROR {entry['error']}")
        entry["seen"] = [dict(e) for e in SEEN.pop(name, [])]
        res["impls"][name] = entry
    if graphs:
        for name, timing in time_interleaved(graphs, args).items():
            res["impls"][name].update(timing)
        outs = {name: out.detach().float().clone() for name, out in outs.items()}
        del graphs, held
        torch.cuda.empty_cache()
    for name in impls:
        entry = res["impls"][name]
        if "median_ms" in entry:
            log(f"{kind} B{b} S{s} {name}: median {entry['median_ms']:.4f} ms"
                + (f", sustained {entry['sustained_ms']:.4f} ms" if "sustained_ms" in entry else "")
                + f"; attention saw {_seen_text(entry['seen'])}")
    if "sdpa" in outs:
        ref = outs["sdpa"]
        for name, out in outs.items():
            if name not in ("sdpa", "null"):
                c = compare(out, ref)
                c["pass"] = c["rel_l2"] <= args.rel_tol and c["cosine_min"] >= 0.999
                res["impls"][name]["vs_sdpa"] = c
        flash, why = _flash_reference(model, step, args)
        res["sdpa_flash_vs_sdpa"] = compare(flash, ref) if flash is not None else {"skipped": why}
    res["_outputs"] = outs
    return res


def _seen_text(seen):
    if not seen:
        return "nothing"
    parts = []
    for e in seen:
        parts.append(f"q {'x'.join(map(str, e['q']))} k {'x'.join(map(str, e['k']))} "
                     f"mask {'None' if e['mask'] is None else 'x'.join(map(str, e['mask']))}"
                     f"{' causal' if e['causal'] else ''}")
    return "; ".join(parts)


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------
def environment(args, argv):
    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "host": platform.node(), "device": args.device,
           "command": "python3 " + " ".join(shlex.quote(x) for x in (
               sys.argv if argv is None else ["scripts/model_bench.py", *argv]))}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    if args.device.startswith("cuda") and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.device(args.device))
        env["gpu"] = f"{p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB)"
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
            env["driver"] = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
    else:
        env["gpu"], env["driver"] = None, None
    for mod, key in (("flash_attn.cute", "flash_attn_cute"),):
        try:
            import importlib.metadata as md

            env[key] = md.version("flash-attn-4")
        except Exception:  # noqa: BLE001
            env[key] = None
    return env


def _col(kind, b, s):
    return f"prefill B{b} S{s}" if kind == "prefill" else f"decode B{b} ctx{s}"


def _fmt_t(kind, ms):
    return f"{ms:.2f} ms" if kind == "prefill" else f"{ms * 1e3:.1f} us"


def markdown(results, env, args, impls, skipped, package_info, model_desc):
    cases = results
    L = []
    L.append(f"### End-to-end: {model_desc}")
    L.append("")
    L.append(f"- date: {env['date']}; GPU: {env.get('gpu')}; driver: {env.get('driver')}; torch {env['torch']} "
             f"(CUDA {env['cuda']}, cuDNN {env['cudnn']}); transformers {env['transformers']}; python {env['python']}"
             + (f"; flash-attn-4 {env['flash_attn_cute']}" if env.get("flash_attn_cute") else ""))
    L.append(f"- command: `{env['command']}`")
    if package_info:
        L.append(f"- optimizerd package: {package_info}")
    for name, why in skipped.items():
        L.append(f"- {name} skipped: {why}")
    if "fa4" in impls:
        L.append("- fa4: `flash_attn.cute.flash_attn_func(q, k, v, softmax_scale, causal)` on [B,S,H,D] views, its "
                 "defaults otherwise (GQA packed; num_splits left at 1: the FA4 source this bench was written "
                 "against refuses split-KV on SM 9.x, so decode gets no flash-decoding split)")
    L.append(f"- timing: {'CUDA graph of each whole step; the implementations timed in 5 interleaved rounds; median of replays timed one by one with CUDA events' if args.use_graphs else 'eager forwards, wall clock (no CUDA graphs)'}; "
             "prefill = full forward from an empty cache, causal, logits of the last position; "
             "decode = one step of one new token per sequence over a KV cache of exactly ctx keys (no mask), "
             "per token of each sequence.")
    L.append("")
    heads = [_col(c["kind"], c["batch"], c["seq"]) for c in cases]
    L.append("| implementation | " + " | ".join(heads) + " |")
    L.append("|---|" + "---|" * len(heads))
    rows = impls + (["null"] if not args.no_share else [])
    for name in rows:
        cells = []
        for c in cases:
            e = c["impls"].get(name, {})
            if "median_ms" not in e:
                cells.append(e.get("error", "-")[:60] if e else "-")
                continue
            cell = _fmt_t(c["kind"], e["median_ms"])
            ref = c["impls"].get("sdpa", {}).get("median_ms")
            if name not in ("sdpa", "null") and ref:
                cell += f" ({ref / e['median_ms']:.2f}x)"
            cells.append(cell)
        label = name if name != "null" else "null (no attention)"
        L.append(f"| {label} | " + " | ".join(cells) + " |")
    L.append("")
    L.append("(x) = speedup vs sdpa (sdpa time / this time). null = the same step with attention returning zeros.")
    if not args.no_share:
        L.append("")
        L.append("Attention share of the step, 1 - t_null / t (attention time t - t_null):")
        L.append("")
        L.append("| implementation | " + " | ".join(heads) + " |")
        L.append("|---|" + "---|" * len(heads))
        for name in impls:
            cells = []
            for c in cases:
                e, n = c["impls"].get(name, {}), c["impls"].get("null", {})
                if "median_ms" in e and "median_ms" in n:
                    share = 1 - n["median_ms"] / e["median_ms"]
                    cells.append(f"{share * 100:.1f}% ({_fmt_t(c['kind'], e['median_ms'] - n['median_ms'])})")
                else:
                    cells.append("-")
            L.append(f"| {name} | " + " | ".join(cells) + " |")
    if args.use_graphs:
        L.append("")
        L.append(f"Sustained (replays back to back for >= {args.sustain_ms:.0f} ms, mean per step):")
        L.append("")
        L.append("| implementation | " + " | ".join(heads) + " |")
        L.append("|---|" + "---|" * len(heads))
        for name in rows:
            cells = []
            for c in cases:
                e = c["impls"].get(name, {})
                cells.append(_fmt_t(c["kind"], e["sustained_ms"]) + f" x{e['sustained_n']}"
                             if "sustained_ms" in e else "-")
            L.append(f"| {name} | " + " | ".join(cells) + " |")
    L.append("")
    L.append(f"Correctness: last-position logits vs sdpa, same weights and inputs (PASS: rel L2 <= {args.rel_tol:g} "
             "and cosine >= 0.999); max|diff| over max|ref|:")
    L.append("")
    L.append("| implementation | case | max abs diff | rel L2 | min cosine | top-1 agree | result |")
    L.append("|---|---|---|---|---|---|---|")
    for c in cases:
        for name in impls + ["sdpa-flash"]:
            v = c.get("sdpa_flash_vs_sdpa") if name == "sdpa-flash" else c["impls"].get(name, {}).get("vs_sdpa")
            if not v or "skipped" in v:
                continue
            res = "PASS" if v.get("pass") else ("FAIL" if "pass" in v else "(reference noise)")
            L.append(f"| {name} | {_col(c['kind'], c['batch'], c['seq'])} | {v['max_abs']:.3g} / {v['ref_max_abs']:.3g} | "
                     f"{v['rel_l2']:.2e} | {v['cosine_min']:.6f} | {v['top1_agree'] * 100:.0f}% | {res} |")
    L.append("")
    L.append("What each implementation's attention function saw (each distinct call shape, all layers, warm-up and "
             "capture; mask None = no mask):")
    L.append("")
    for c in cases:
        for name in rows:
            e = c["impls"].get(name)
            if e is not None:
                L.append(f"- {_col(c['kind'], c['batch'], c['seq'])} {name}: {_seen_text(e.get('seen', []))}")
    if "optimizerd" in impls:
        L.append("")
        L.append("optimizerd package path per attention shape (explain):")
        L.append("")
        for c in cases:
            st = c.get("optimizerd_stats_delta")
            if st:
                L.append(f"- {_col(c['kind'], c['batch'], c['seq'])}: op calls per path in this case's eager warm-ups "
                         f"and capture (stats(); graph replays are not counted): {st}")
            for e in c["impls"].get("optimizerd", {}).get("seen", []):
                if e["mask"] is not None:
                    L.append(f"- {_col(c['kind'], c['batch'], c['seq'])}: a mask was given: the hook ran transformers' SDPA")
                    continue
                x = c.get("explain", {}).get(f"{e['q']}|{e['k']}|{e['causal']}")
                if x:
                    L.append(f"- {_col(c['kind'], c['batch'], c['seq'])}: q {e['q']} k {e['k']} causal {e['causal']}: "
                             f"**{x.get('path')}** {x.get('kernel') or ''} ({x.get('reason')})")
    return "\n".join(L)


def main(argv=None):
    args = parse_args(argv)
    out_lines = []

    def log(msg):
        print(f"[model_bench] {msg}", file=sys.stderr, flush=True)

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("model_bench: --device cuda but torch sees no GPU (use --device cpu --tiny to test on CPU)",
              file=sys.stderr)
        return 2
    dtype = DTYPES[args.dtype]
    env = environment(args, argv)
    t_start = time.perf_counter()
    log(f"building the model ({args.layers} layers, {'tiny' if args.tiny else 'Llama-3-8B shapes'}, {args.dtype}, "
        f"{args.device}, seed {args.seed})")
    model = build_model(args.layers, args.tiny, dtype, args.device, args.seed)
    cfg = model.config
    model_desc = (f"Llama-3-8B-shaped ({'tiny: ' if args.tiny else ''}hidden {cfg.hidden_size}, "
                  f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads, head dim {cfg.head_dim}, "
                  f"MLP {cfg.intermediate_size}, vocab {cfg.vocab_size}), {args.layers} layers, random weights, "
                  f"{args.dtype}")
    try:
        impls, skipped, package = setup_impls(args, log)
        package_info = None
        if package is not None:
            try:
                info = package.info()
                package_info = (f"{info.get('package')} (run {info.get('run')}, tuned on "
                                f"{(info.get('device') or {}).get('name') or info.get('gpu')}, "
                                f"{len(info.get('kernels', []))} kernels, launcher "
                                f"{'in use' if info.get('launcher') else 'NOT in use: ' + str(info.get('launcher_error'))})")
            except Exception as e:  # noqa: BLE001
                package_info = f"{args.package} (info() failed: {e})"
        timed = impls + ([] if args.no_share else ["null"])
        results = []
        for kind, cases in (("prefill", args.prefill_cases), ("decode", args.decode_cases)):
            for b, s in cases:
                EXPLAINED.clear()
                stats0 = package.stats() if package is not None else None
                r = run_case(model, kind, b, s, timed, args, log)
                if package is not None:
                    r["explain"] = {f"{list(k[0])}|{list(k[1])}|{k[2]}": v for k, v in EXPLAINED.items()}
                    s1 = package.stats()
                    r["optimizerd_stats_delta"] = {k: s1[k] - stats0.get(k, 0) for k in ("exact", "class", "fallback")
                                                   if k in s1}
                results.append(r)
        model.set_attn_implementation("sdpa")
    finally:
        unregister_all()
    md = markdown(results, env, args, impls, skipped, package_info, model_desc)
    print(md)
    total = time.perf_counter() - t_start
    log(f"done in {total:.1f} s")
    if args.json:
        payload = {"environment": env, "model": model_desc, "args": {k: v for k, v in vars(args).items()},
                   "implementations": impls, "skipped": skipped, "package": package_info, "total_s": total,
                   "cases": [{k: v for k, v in r.items() if k != "_outputs"} for r in results], "markdown": md}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1, default=str)
        log(f"wrote {args.json}")
    main.last_results = results  # for tests
    return 0


if __name__ == "__main__":
    sys.exit(main())
