#!/usr/bin/env python3
"""PyTorch SDPA (and FlashAttention-4) timings for optimizerd's workload shapes, measured
like the candidates.

optimizerd runs this (command: `baseline.sdpa_command` in agent.toml) and records the
result per shape in the ledger, so each run reports its kernels against SDPA (and FA4,
where it imports) on the same GPU, the same day.

    sdpa_baseline.py --versions            -> {"torch": ..., "cuda": ..., "cudnn": ..., "device": ...,
                                               "fa4": VERSION or null, "fa4_error": why it is absent}
    sdpa_baseline.py --shapes SHAPES.json [--target-us T] [--sustained-ms N]
                                           -> {"versions": {...}, "method": {...}, "results": [...]}

SHAPES.json: a list of shapes as optimizerd writes them,
  {"b":8,"hq":32,"hkv":8,"sq":1,"sk":4096,"d":128,"causal":true,"dtype":"bf16","layout":"bhsd"},
or in the version-1 form {"b":1,"h":1,"s":128,"d":64,"causal":false,"dtype":"fp16"} (hq = hkv = h,
sq = sk = s, layout bhsd). A causal shape may carry a sliding window, `"window": W` (W >= 1): query
row i, at position p = i + SK - SQ, sees keys p - W < j <= p only (Hugging Face's sliding_window =
W; .dev/window-contract.md).

Inputs are built as a model holds them: Q [B,HQ,SQ,D], K/V [B,HKV,SK,D] for layout bhsd; for
bshd, [B,S,H,D] tensors passed to SDPA as `.transpose(1, 2)` views (no copy). Grouped-query
shapes (HQ != HKV) call SDPA with enable_gqa=True. Causal with SQ = SK is `is_causal`; with
SQ < SK the query rows are the last SQ positions (bottom-right), SDPA's
`causal_lower_right` mask; with SQ = 1 that mask hides nothing, so no mask is passed. A window
that masks something (W < SK) reaches SDPA as a boolean [SQ, SK] attn_mask, bottom-right causal
within the window (mask "window"; SDPA has no window argument, so its backends run a masked
kernel: `ran` says which); a window of SK keys or more masks nothing and is timed as causal.

For each shape and backend (SDPA's default, flash, cudnn, efficient; then "fa4"), one entry:
  graph_us  GPU time per call: a CUDA graph of `calls` back-to-back calls, median of
            `replays` replays, divided by `calls`. With --target-us T (the daemon passes
            its timing.sample_target_us) `calls` is chosen per shape and backend so that
            one replay lasts about T of GPU time (measured by a short graph's replay, not
            eagerly: a small kernel's eager call is its CPU dispatch), as long as one timed
            sample of a candidate: a long graph runs the GPU hotter, at lower clocks, than
            the candidates' samples, and a short one carries more of a replay's fixed cost;
  calls     the calls per graph that were used;
  eager_us  CUDA events around `calls` back-to-back Python calls (includes CPU dispatch);
  ran       the backend whose kernels ran (torch.profiler: cudnn, flash, efficient, math; fa4);
  picked    for `default`: the same as `ran` (the name older readers know);
  kv        "mha" (HQ = HKV), "gqa" (enable_gqa=True) or "repeated" (K/V repeated to HQ heads
            with repeat_interleave before timing: the backend refused enable_gqa);
  mask      "none", "is_causal", "lower_right" (causal_lower_right), "explicit" (a boolean
            [SQ, SK] mask: the backend refused the lower-right mask) or "window" (the boolean
            [SQ, SK] mask of a sliding window; FA4: its window_size argument);
  fallback  present when the first form was refused: what was refused and why;
  sustained_us, sustained_ms, sustained_replays
            for the default backend and fa4, with --sustained-ms N (the daemon's closing
            comparison passes its window, timing.sustained_ms unless cut to fit the budget):
            the same graph replayed back to back until at least N ms of GPU time have passed,
            events around the whole window, time per call = window / (replays * calls); the
            median of 3 windows, and the last window's length and replays. A model step runs
            attention this long, at lower clocks than one short replay; absent without it.
            Every shape's short replays are timed first, the sustained windows after them all
            (with the default backend's graph made again): a window leaves the GPU at its power
            cap for a while, and the next shape's short replays would run at those clocks.
            sustained_ran: present only when the default backend picked another kernel for the
            windows than for the short replays;
  error     instead of the timings when the backend cannot run the shape in any form (a
            forced backend whose kernels did not run counts as refused: under the
            lower-right mask SDPA dispatches by itself).
"fa4" is FlashAttention-4 (`flash_attn.cute.flash_attn_func`, [B,S,H,D] inputs: the bshd
tensors themselves, or contiguous [B,S,H,D] copies of bhsd ones made before timing; GQA and
bottom-right causal natively); it is timed the same way, and left out when flash_attn.cute
does not import (`versions.fa4` is then null and `versions.fa4_error` says why). A window runs
natively too: flash_attn_func(q, k, v, causal=True, window_size=(W - 1, 0)) (flash_attn/cute/
interface.py: keys j >= p - window_size[0] and j <= p + window_size[1], bottom-right; causal
forces the right edge to 0), its entry adding "window_size": [W - 1, 0]; where this FA4 refuses
it (an older release, or a GPU its local kernels do not cover) the entry is an error saying
"not measured: ..." and why.
Inputs: fresh randn (never zeros), rotated over several sets when one set fits in L2.
Exit status 0 with JSON on stdout; errors go to stderr.
"""
import argparse
import json
import statistics
import sys
import warnings

SDPA_BACKENDS = ["default", "flash", "cudnn", "efficient"]
FA4 = "fa4"


def load_fa4():
    """(flash_attn_func, version, None) when FlashAttention-4 imports, else (None, None, why)."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # absent, or present but broken (no CuTe DSL, wrong CUDA): not measured
        return None, None, f"flash_attn.cute does not import ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"[:300]
    # The CuTe DSL (nvidia-cutlass-dsl 4.8) warns at each compile that FA4's own `aux_data`
    # argument "cannot be converted to a JitArgument": FA4's business, harmless, and 800
    # characters a shape in every log that times FA4 (compare_exported, the daemon's baseline).
    warnings.filterwarnings("ignore", message=r"Argument aux_data \(position \d+\) cannot be converted",
                            category=UserWarning)
    version = None
    try:
        from importlib.metadata import version as dist_version
        version = dist_version("flash-attn-4")
    except Exception:
        import flash_attn
        version = getattr(flash_attn, "__version__", None)
    return flash_attn_func, version or "unknown", None


def versions(torch, fa4):
    dev = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    _, fa4_version, fa4_error = fa4
    v = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": dev.name if dev else None,
        "cc": f"{dev.major}.{dev.minor}" if dev else None,
        "fa4": fa4_version,
    }
    if fa4_error:
        v["fa4_error"] = fa4_error
    return v


def normalize(shape):
    """A shape as optimizerd writes it (version 2, or version 1's b/h/s) -> all fields, checked."""
    def need(*names):
        for n in names:
            if shape.get(n) is not None:
                return int(shape[n])
        raise ValueError(f"shape {json.dumps(shape)} has no {' or '.join(names)}")

    hq = need("hq", "h")
    hkv = int(shape["hkv"]) if shape.get("hkv") is not None else hq if shape.get("hq") is not None else need("h")
    sq = need("sq", "s")
    sk = int(shape["sk"]) if shape.get("sk") is not None else sq if shape.get("sq") is not None else need("s")
    s = {"b": need("b"), "hq": hq, "hkv": hkv, "sq": sq, "sk": sk, "d": need("d"),
         "causal": bool(shape.get("causal")), "dtype": shape.get("dtype") or "fp16", "layout": shape.get("layout") or "bhsd",
         "window": 0}
    if shape.get("window") is not None:
        w = shape["window"]
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"shape {json.dumps(shape)}: window {w!r} is not a number of keys >= 1")
        if not s["causal"]:
            raise ValueError(f"shape {json.dumps(shape)}: a window needs causal")
        s["window"] = w
    if s["hkv"] < 1 or s["hq"] % s["hkv"]:
        raise ValueError(f"shape {json.dumps(shape)}: hq {hq} is not a multiple of hkv {hkv}")
    if s["sq"] > s["sk"]:
        raise ValueError(f"shape {json.dumps(shape)}: sq {sq} > sk {sk}")
    if s["layout"] not in ("bhsd", "bshd"):
        raise ValueError(f"shape {json.dumps(shape)}: layout {s['layout']!r} is neither bhsd nor bshd")
    if s["dtype"] not in ("fp16", "bf16"):
        raise ValueError(f"shape {json.dumps(shape)}: dtype {s['dtype']!r} is neither fp16 nor bf16")
    return s


def masking_window(s):
    """The shape's window where it masks something (W < SK), else 0: no row's position exceeds
    SK - 1, so a window of SK keys or more hides none of the keys causality leaves."""
    w = s.get("window") or 0
    return w if 0 < w < s["sk"] else 0


def mask_kind(s):
    """How causality reaches SDPA: none, is_causal (SQ = SK), lower_right (SQ < SK), or window (a
    sliding window that masks something: an explicit boolean mask)."""
    if s["causal"] and masking_window(s):
        return "window"
    if not s["causal"] or s["sq"] == 1:
        # One query row, the last position, sees every key: bottom-right causal masks nothing.
        return "none"
    return "is_causal" if s["sq"] == s["sk"] else "lower_right"


def attempts(s):
    """The forms to try, in order: (kv, mask). The first is how a model calls SDPA; the others
    are the fallbacks for a backend that refuses enable_gqa or the lower-right mask."""
    gqa = s["hq"] != s["hkv"]
    kvs = ["gqa", "repeated"] if gqa else ["mha"]
    masks = [mask_kind(s)] + (["explicit"] if mask_kind(s) == "lower_right" else [])
    return [(kv, m) for m in masks for kv in kvs]


def backend_ctx(torch, name):
    from contextlib import nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return {
        "default": nullcontext(),
        "flash": sdpa_kernel(SDPBackend.FLASH_ATTENTION),
        "cudnn": sdpa_kernel(SDPBackend.CUDNN_ATTENTION),
        "efficient": sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION),
    }[name]


def ran_backend(torch, fn):
    """Name the SDPA backend from the kernels one call launches."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = " ".join(e.key.lower() for e in prof.key_averages())
    if "cudnn" in names:
        return "cudnn"
    if "flash" in names:
        return "flash"
    if "fmha" in names or "cutlassf" in names or "efficient" in names:
        return "efficient"
    return "math"


# Calls in the graph whose replay measures a call's GPU time for calls_for.
PROBE_CALLS = 8


def captured(torch, call, n_calls, warm):
    """A CUDA graph of `n_calls` calls, after `warm` calls on a side stream (as capture wants),
    replayed once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warm):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n_calls):
            call()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def calls_for(torch, call, target_us, fallback):
    """Calls per graph so that one replay lasts about target_us of GPU time, from a replay of a
    PROBE_CALLS-call graph (the fastest of 3). Timed eagerly, a small kernel's call is its
    Python dispatch (~80 us for SDPA on the H200): decode shapes got graphs of 11-27 calls,
    ~0.3 ms, where the candidates' samples last target_us, so SDPA's per-call figure carried
    a replay's fixed cost spread over fewer calls (2026-12-02, session 44)."""
    if target_us <= 0:
        return fallback
    probe = captured(torch, call, PROBE_CALLS, warm=1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replay_us = []
    for _ in range(3):
        start.record()
        probe.replay()
        end.record()
        end.synchronize()
        replay_us.append(start.elapsed_time(end) * 1000.0)
    per_call = max(min(replay_us) / PROBE_CALLS, 1e-3)
    return max(1, min(1000, round(target_us / per_call)))


SUSTAINED_WINDOWS = 3


def sustained(torch, graph, n_calls, replay_us, sustained_ms):
    """Back-to-back replays of `graph` for at least `sustained_ms` of GPU time, per call:
    the median of SUSTAINED_WINDOWS windows (see the module's docstring)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    target_us = sustained_ms * 1000.0
    # Sized from the burst replay time: sustained clocks are lower, so the window only grows.
    n = max(1, -(-int(target_us) // max(int(replay_us), 1)))
    per_call, window_us = [], 0.0
    for _ in range(SUSTAINED_WINDOWS):
        while True:
            start.record()
            for _ in range(n):
                graph.replay()
            end.record()
            end.synchronize()
            window_us = start.elapsed_time(end) * 1000.0
            if window_us >= target_us:
                break
            # Shorter than asked (the burst figure was off): longer, and take it again.
            n = max(n + 1, -(-int(target_us * n) // max(int(window_us), 1)))
        per_call.append(window_us / (n * n_calls))
    return {"sustained_us": statistics.median(per_call), "sustained_ms": window_us / 1000.0, "sustained_replays": n}


def time_call(torch, call, calls, replays, target_us, sustained_ms=0.0):
    """CUDA-graph and eager time per call of `call` (already warm): the entry's timings, and
    with sustained_ms > 0 the sustained ones."""
    n_calls = calls_for(torch, call, target_us, calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    eager = []
    for _ in range(5):
        start.record()
        for _ in range(n_calls):
            call()
        end.record()
        end.synchronize()
        eager.append(start.elapsed_time(end) * 1000.0 / n_calls)
    graph = captured(torch, call, n_calls, warm=3)
    g = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        g.append(start.elapsed_time(end) * 1000.0 / n_calls)
    out = {"graph_us": statistics.median(g), "eager_us": statistics.median(eager), "calls": n_calls}
    if sustained_ms > 0:
        out.update(sustained(torch, graph, n_calls, out["graph_us"] * n_calls, sustained_ms))
    return out


def first_line(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


class Inputs:
    """Rotating input sets for one shape: SDPA's [B,H,S,D] tensors (views for bshd) and, made on
    first use, K/V repeated to HQ heads, explicit masks, and FA4's [B,S,H,D] tensors."""

    def __init__(self, torch, s, l2_bytes):
        self.torch, self.s = torch, s
        dtype = torch.bfloat16 if s["dtype"] == "bf16" else torch.float16
        b, hq, hkv, sq, sk, d = s["b"], s["hq"], s["hkv"], s["sq"], s["sk"], s["d"]
        # Q, O and K, V at 2 bytes an element: what one call touches.
        set_bytes = 2 * 2 * (b * hq * sq * d + b * hkv * sk * d)
        self.n = max(1, min(16, (3 * l2_bytes) // max(set_bytes, 1)))

        def make(h, rows):
            if s["layout"] == "bshd":
                return torch.randn(b, rows, h, d, device="cuda", dtype=dtype).transpose(1, 2)
            return torch.randn(b, h, rows, d, device="cuda", dtype=dtype)

        self.sets = [(make(hq, sq), make(hkv, sk), make(hkv, sk)) for _ in range(self.n)]
        self._repeated = None
        self._fa4 = None
        self._mask = None
        self.i = 0

    def next_index(self):
        self.i += 1
        return self.i % self.n

    def repeated(self, j):
        if self._repeated is None:
            g = self.s["hq"] // self.s["hkv"]
            self._repeated = [(q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)) for q, k, v in self.sets]
        return self._repeated[j]

    def explicit_mask(self):
        """[SQ, SK] booleans, True where a row sees a key: bottom-right causal, and within the
        sliding window where the shape has one that masks something (window_mask)."""
        if self._mask is None:
            self._mask = window_mask(self.torch, self.s["sq"], self.s["sk"], masking_window(self.s), "cuda")
        return self._mask

    def fa4(self, j):
        if self._fa4 is None:
            # bshd: the tensors themselves; bhsd: contiguous [B,S,H,D] copies (FA4's layout).
            def bshd(t):
                t = t.transpose(1, 2)
                return t if t.is_contiguous() else t.contiguous()
            self._fa4 = [tuple(bshd(t) for t in qkv) for qkv in self.sets]
        return self._fa4[j]


def window_mask(torch, sq, sk, window, device="cpu"):
    """[SQ, SK] booleans, True where query row i (position p = i + SK - SQ) sees key j: j <= p,
    and with a window W > 0 also j > p - W (.dev/window-contract.md)."""
    ones = torch.ones(sq, sk, dtype=torch.bool, device=device)
    mask = ones.tril(diagonal=sk - sq)
    if window > 0:
        mask &= ones.triu(diagonal=sk - sq - window + 1)
    return mask


def fa4_mask_args(s):
    """FA4's masking arguments for shape `s`: causal (one query row: bottom-right causal masks
    nothing, so False), and for a window that masks something causal=True with window_size =
    (W - 1, 0): flash_attn.cute keeps keys p - window_size[0] <= j <= p + window_size[1]."""
    w = masking_window(s)
    if s["causal"] and w:
        return {"causal": True, "window_size": (w - 1, 0)}
    return {"causal": s["causal"] and s["sq"] > 1}


def sdpa_call(torch, inputs, kv, mask):
    F = torch.nn.functional
    kw = {}
    if mask == "is_causal":
        kw["is_causal"] = True
    elif mask == "lower_right":
        from torch.nn.attention.bias import causal_lower_right
        kw["attn_mask"] = causal_lower_right(inputs.s["sq"], inputs.s["sk"])
    elif mask in ("explicit", "window"):
        kw["attn_mask"] = inputs.explicit_mask()
    if kv == "gqa":
        kw["enable_gqa"] = True

    def call():
        j = inputs.next_index()
        q, k, v = inputs.repeated(j) if kv == "repeated" else inputs.sets[j]
        return F.scaled_dot_product_attention(q, k, v, **kw)

    return call


def refusal(kv, mask, why):
    what = {"gqa": "enable_gqa", "mha": "the call", "repeated": "repeated K/V"}[kv]
    return f"{what} with mask {mask}: {why}"


def time_sdpa(torch, inputs, name, calls, replays, target_us, sustained_ms=0.0):
    """One SDPA backend on one shape: the first form it runs (see `attempts`), timed."""
    refused = []
    with backend_ctx(torch, name):
        for kv, mask in attempts(inputs.s):
            call = sdpa_call(torch, inputs, kv, mask)
            try:
                for _ in range(5):
                    call()
                torch.cuda.synchronize()
                ran = ran_backend(torch, call)
                if name != "default" and ran != name:
                    refused.append(refusal(kv, mask, f"ran {ran}'s kernels instead"))
                    continue
                entry = time_call(torch, call, calls, replays, target_us, sustained_ms)
            except Exception as e:  # this form cannot run under this backend: try the next
                refused.append(refusal(kv, mask, first_line(e)))
                torch.cuda.synchronize()
                continue
            entry.update({"ran": ran, "kv": kv, "mask": mask})
            if name == "default":
                entry["picked"] = ran
            if refused:
                entry["fallback"] = "; ".join(refused)[:600]
            return entry
    return {"error": "; ".join(refused)[:600] or "no form to try"}


def time_fa4(torch, inputs, fa4_func, calls, replays, target_us, sustained_ms=0.0):
    s = inputs.s
    kw = fa4_mask_args(s)  # causal (not for one query row: it masks nothing), and the window

    def call():
        q, k, v = inputs.fa4(inputs.next_index())
        return fa4_func(q, k, v, **kw)

    try:
        # The first call JIT-compiles (tens of seconds per configuration): outside the timing.
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        entry = time_call(torch, call, calls, replays, target_us, sustained_ms)
    except Exception as e:
        torch.cuda.synchronize()
        if "window_size" in kw:  # FA4's local (sliding-window) path: not measured on this shape
            return {"error": f"not measured: FA4 refused window_size={list(kw['window_size'])}: {first_line(e)}"[:600]}
        return {"error": first_line(e)}
    entry.update({"ran": FA4, "kv": "gqa" if s["hq"] != s["hkv"] else "mha", "mask": mask_kind(s),
                  "layout": "bshd" if s["layout"] == "bshd" else "bshd copy"})
    if "window_size" in kw:
        entry["window_size"] = list(kw["window_size"])
    return entry


def time_shape(torch, shape, calls, replays, l2_bytes, target_us=0.0, fa4_func=None):
    """One shape's burst samples: every SDPA backend, then FA4 where it imports (the sustained
    windows come later, from `time_sustained`)."""
    s = normalize(shape)
    inputs = Inputs(torch, s, l2_bytes)
    out = {"input_sets": inputs.n}
    for name in SDPA_BACKENDS:
        try:
            out[name] = time_sdpa(torch, inputs, name, calls, replays, target_us)
        except Exception as e:  # the backend context itself failed
            out[name] = {"error": first_line(e)}
        torch.cuda.synchronize()
    if fa4_func is not None:
        out[FA4] = time_fa4(torch, inputs, fa4_func, calls, replays, target_us)
        torch.cuda.synchronize()
    return out


SUSTAINED_KEYS = ("sustained_us", "sustained_ms", "sustained_replays")


def merge_sustained(burst, windows):
    """Adds a sustained pass's figures (`windows`, an entry of time_sdpa or time_fa4) to the
    burst pass's entry of the same backend; a pass that failed adds its error as
    `sustained_error`. Returns `burst`."""
    if "error" in burst:
        return burst
    if "error" in windows:
        burst["sustained_error"] = windows["error"]
        return burst
    for key in SUSTAINED_KEYS:
        burst[key] = windows[key]
    if windows.get("ran") != burst.get("ran"):
        burst["sustained_ran"] = windows.get("ran")
    return burst


def time_sustained(torch, result, calls, replays, l2_bytes, target_us, fa4_func, sustained_ms):
    """The sustained windows of one shape's default backend and FA4, after every shape's
    burst timing (see the module's docstring), merged into `result` (time_shape's)."""
    inputs = Inputs(torch, normalize(result["shape"]), l2_bytes)
    try:
        windows = time_sdpa(torch, inputs, "default", calls, replays, target_us, sustained_ms)
    except Exception as e:  # the backend context itself failed
        windows = {"error": first_line(e)}
    torch.cuda.synchronize()
    merge_sustained(result["default"], windows)
    if fa4_func is not None and FA4 in result:
        merge_sustained(result[FA4], time_fa4(torch, inputs, fa4_func, calls, replays, target_us, sustained_ms))
        torch.cuda.synchronize()


def time_shapes(torch, shapes, calls, replays, l2_bytes, target_us, fa4_func, sustained_ms):
    """Every shape's burst timing, then (sustained_ms > 0) every shape's sustained windows."""
    results = []
    for shape in shapes:
        r = time_shape(torch, shape, calls, replays, l2_bytes, target_us, fa4_func)
        r["shape"] = shape
        results.append(r)
        torch.cuda.empty_cache()
    if sustained_ms > 0:
        for r in results:
            time_sustained(torch, r, calls, replays, l2_bytes, target_us, fa4_func, sustained_ms)
            torch.cuda.empty_cache()
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", action="store_true")
    ap.add_argument("--shapes")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--target-us", type=float, default=0.0,
                    help="size each graph to last about this long (0: --calls per graph)")
    ap.add_argument("--sustained-ms", type=float, default=0.0,
                    help="also replay each graph back to back for at least this long (0: off)")
    args = ap.parse_args()
    try:
        import torch
    except Exception as e:
        print(f"torch is not importable: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 2
    fa4 = load_fa4()
    v = versions(torch, fa4)
    if args.sustained_ms < 0:
        print("--sustained-ms must be >= 0", file=sys.stderr)
        return 2
    if args.versions:
        print(json.dumps(v))
        return 0
    shapes = json.load(open(args.shapes))
    try:
        for shape in shapes:
            normalize(shape)
    except (ValueError, TypeError, KeyError) as e:
        print(f"bad shape: {e}", file=sys.stderr)
        return 2
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 1024 * 1024)
    results = time_shapes(torch, shapes, args.calls, args.replays, l2, args.target_us, fa4[0], args.sustained_ms)
    print(json.dumps({"versions": v, "method": {"calls": args.calls, "replays": args.replays, "target_us": args.target_us,
                                               "sustained_ms": args.sustained_ms,
                                               "graph": "median replay of a CUDA graph of `calls` calls / calls",
                                               "eager": "CUDA events around `calls` Python calls / calls, median of 5",
                                               "fa4": "flash_attn.cute.flash_attn_func on [B,S,H,D] inputs, timed the same way"
                                               if fa4[0] else f"not measured: {fa4[2]}"},
                      "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
