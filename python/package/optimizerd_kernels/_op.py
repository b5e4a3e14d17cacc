"""The torch custom op `<package>::attention` and its implementations:

- CUDA: the C++ launcher (csrc/launcher.cpp), built at first import where a GPU is
  visible; it asks `_resolve` (below, Python) once per call signature which kernel runs;
- CPU, and CUDA when the launcher could not be built: SDPA, same semantics;
- fake (meta): the output's shape, so torch.compile traces the op without a graph break.

Semantics (all paths): softmax(q k^T * scale) v with scale = 1/sqrt(D) by default;
grouped-query heads (query head h reads key/value head h // (Hq / Hkv)); causal is
bottom-right (query row i sees keys <= i + Sk - Sq); a sliding window W (causal only; 0:
none) hides the keys before the last W of those (row i, at position p = i + Sk - Sq, sees
p - W < j <= p: Hugging Face's sliding_window = W); the output is a new tensor,
contiguous in `layout` ([B,Hq,Sq,D] for "bhsd", [B,Sq,Hq,D] for "bshd").
"""
import logging
import os
import threading
from typing import Dict, Optional

import torch

from . import _dispatch, _launcher

NAMESPACE = __name__.split(".")[0]
KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
log = logging.getLogger(NAMESPACE)

_lock = threading.Lock()
_dispatcher: Optional[_dispatch.Dispatcher] = None
_gpus: Dict[int, _dispatch.Gpu] = {}
_images: Dict[str, torch.Tensor] = {}
_kernel_ids: Dict[tuple, int] = {}
_decisions: Dict[_dispatch.Call, _dispatch.Decision] = {}
_logged: set = set()
MAX_DECISIONS = 4096
# Shapes vary call to call in serving (prompt lengths, a growing KV cache): log the first
# few fallbacks and class matches, then say that the rest are in stats().
MAX_LOGGED = 20
launcher_error: Optional[str] = None  # why the C++ launcher is not in use, if it is not
launcher_path: Optional[str] = None


def strict() -> bool:
    """OPTIMIZERD_STRICT=1: raise where the op would otherwise fall back to SDPA."""
    return os.environ.get("OPTIMIZERD_STRICT", "") not in ("", "0")


def dispatcher() -> _dispatch.Dispatcher:
    global _dispatcher
    if _dispatcher is None:
        always = os.environ.get("OPTIMIZERD_ALWAYS_KERNELS", "") not in ("", "0")
        _dispatcher = _dispatch.Dispatcher.load(KERNELS, always_kernels=always)
    return _dispatcher


def gpu(device: int) -> _dispatch.Gpu:
    g = _gpus.get(device)
    if g is None:
        p = torch.cuda.get_device_properties(device)
        g = _gpus[device] = _dispatch.Gpu(name=p.name, cc=p.major * 10 + p.minor, sms=p.multi_processor_count,
                                          smem_optin=getattr(p, "shared_memory_per_block_optin", 0) or 232448)
        tuned = (dispatcher().manifest.get("device") or {}).get("name")
        if tuned and tuned != p.name:
            log.warning("%s: kernels were tuned on %s; this is %s: they run where their arch allows, but were not "
                        "tuned here (run optimizerd on this GPU for kernels tuned to it)", NAMESPACE, tuned, p.name)
    return g


# ---------------------------------------------------------------------------
# SDPA: the CPU implementation and every fallback.
# ---------------------------------------------------------------------------
def sdpa(q, k, v, causal=False, scale=None, layout="bhsd", window=0):
    check_args(q, k, v, layout, causal, window)
    bshd = layout == "bshd"
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v)) if bshd else (q, k, v)
    sq, sk = qh.shape[2], kh.shape[2]
    mask, is_causal = None, False
    if causal and _dispatch.effective_window(window, sk):
        mask = window_mask(sq, sk, window, q.device)
    elif causal and sq == sk:
        is_causal = True
    elif causal:  # bottom-right: the query rows are the last Sq positions
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
    o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=is_causal, scale=scale,
                                                         enable_gqa=qh.shape[1] != kh.shape[1])
    return (o.transpose(1, 2) if bshd else o).contiguous()


def window_mask(sq, sk, window, device=None):
    """[Sq, Sk] booleans, True where query row i sees key j: bottom-right causal (j <= p, p =
    i + Sk - Sq) within the sliding window (j > p - window)."""
    ones = torch.ones(sq, sk, dtype=torch.bool, device=device)
    return ones.tril(sk - sq) & ones.triu(sk - sq - window + 1)


def check_args(q, k, v, layout, causal=False, window=0):
    """The errors every path raises alike (the launcher's TORCH_CHECKs say the same)."""
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"{NAMESPACE}.attention: layout must be \"bhsd\" or \"bshd\", not {layout!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{NAMESPACE}.attention: q, k and v must be 4-d ([B,H,S,D] for bhsd, [B,S,H,D] for bshd); "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{NAMESPACE}.attention: q, k and v must have one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{NAMESPACE}.attention: q, k and v must be on one device; got {q.device}, {k.device}, "
                         f"{v.device}")
    hd = 2 if layout == "bshd" else 1
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"{NAMESPACE}.attention: k and v must be [B, Hkv, Sk, D] with q's B and D (in the layout's "
                         f"order); got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[hd] == 0 or q.shape[hd] % k.shape[hd]:
        raise ValueError(f"{NAMESPACE}.attention: query heads ({q.shape[hd]}) must be a multiple of key/value heads "
                         f"({k.shape[hd]})")
    if window < 0 or (window and not causal):
        raise ValueError(f"{NAMESPACE}.attention: window must be 0 (none) or >= 1 with causal=True; got window "
                         f"{window}, causal {causal}")


# ---------------------------------------------------------------------------
# The dispatcher's side of the launcher.
# ---------------------------------------------------------------------------
def call_of(q, k, v, causal, layout, window=0) -> _dispatch.Call:
    """The call signature as the launcher computes it (csrc/launcher.cpp `Key`)."""
    bshd = layout == "bshd"
    hd, sd = (2, 1) if bshd else (1, 2)
    strides = []
    for t in (q, k, v):
        strides += [t.stride(0), t.stride(hd), t.stride(sd)]
    dtype = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(q.dtype, str(q.dtype).replace("torch.", ""))
    return _dispatch.Call(dtype=dtype, device=q.device.index or 0, causal=bool(causal), layout=layout, b=q.shape[0],
                          hq=q.shape[hd], hkv=k.shape[hd], sq=q.shape[sd], sk=k.shape[sd], d=q.shape[3],
                          strides=tuple(strides), aligned=all(t.data_ptr() % 16 == 0 for t in (q, k, v)),
                          unit_last=all(t.stride(3) == 1 for t in (q, k, v)),
                          needs_grad=torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)),
                          window=int(window))


def decide(call: _dispatch.Call) -> _dispatch.Decision:
    with _lock:
        known = _decisions.get(call)
    if known is not None:
        return known
    if launcher_error is not None:
        decision = _dispatch.Decision("fallback", f"the C++ launcher is not in use: {launcher_error}")
    else:
        decision = dispatcher().decide(call, gpu(call.device))
    with _lock:
        if len(_decisions) >= MAX_DECISIONS:  # bounded, like the launcher's plan cache
            _decisions.clear()
        _decisions[call] = decision
    return decision


def _kernel_id(decision, launch, device) -> int:
    cubin = decision.kernel["cubin"]
    key = (cubin, launch.kernel, device)
    with _lock:
        if key in _kernel_ids:
            return _kernel_ids[key]
        image = _images.get(cubin)
        if image is None:
            with open(os.path.join(KERNELS, cubin), "rb") as f:
                image = _images[cubin] = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    kid = int(getattr(torch.ops, NAMESPACE)._load_kernel(image, launch.kernel, device))
    with _lock:
        _kernel_ids[key] = kid
    return kid


def _report(call, decision):
    """Log a fallback once per shape (a warning: the user asked for tuned kernels) and a
    class match once per shape (info)."""
    if decision.path == "fallback" and strict():
        raise RuntimeError(f"{NAMESPACE}: {call.shape_key}: {decision.reason} (OPTIMIZERD_STRICT is set)")
    key = (call.shape_key, decision.path)
    if key in _logged or decision.path == "exact":
        return
    _logged.add(key)
    shown = sum(1 for k in _logged if isinstance(k, tuple))
    if shown > MAX_LOGGED:
        if shown == MAX_LOGGED + 1:
            log.warning("%s: more shapes than %d took SDPA or a class kernel; the rest are not logged "
                        "(%s.stats() lists every decision)", NAMESPACE, MAX_LOGGED, NAMESPACE)
        return
    if decision.path == "fallback":
        log.warning("%s: %s runs SDPA: %s", NAMESPACE, call.shape_key, decision.reason)
    else:
        log.info("%s: %s runs %s, %s", NAMESPACE, call.shape_key, decision.kernel["file"], decision.reason)


def _resolve(key: torch.Tensor) -> torch.Tensor:
    call = _dispatch.Call.from_key(key.tolist())
    decision = decide(call)
    try:
        ids = [_kernel_id(decision, l, call.device) for l in decision.launches]
    except (OSError, RuntimeError) as e:  # a cubin that is missing or does not load on this driver
        decision = _dispatch.Decision("fallback", f"{decision.kernel['cubin']} does not load: {e}")
        with _lock:
            _decisions[call] = decision
        ids = []
    _report(call, decision)
    return torch.tensor(_dispatch.encode_plan(decision, ids, call), dtype=torch.int64)


# ---------------------------------------------------------------------------
# Registration.
# ---------------------------------------------------------------------------
_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
_lib.define("attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, str layout='bhsd', "
            "int window=0) -> Tensor")
_lib.define("_resolve(Tensor key) -> Tensor")


@torch.library.register_fake(f"{NAMESPACE}::attention", lib=_lib)
def _attention_fake(q, k, v, causal=False, scale=None, layout="bhsd", window=0):
    check_args(q, k, v, layout, causal, window)
    return q.new_empty(q.shape)


_lib.impl("attention", sdpa, "CPU")
OP = getattr(torch.ops, NAMESPACE).attention.default
_lib.impl("_resolve", _resolve, "CPU")


def _sdpa_on_cuda(q, k, v, causal=False, scale=None, layout="bhsd", window=0):
    """CUDA without the launcher: SDPA, and a warning once."""
    if "launcher" not in _logged:
        _logged.add("launcher")
        if strict():
            raise RuntimeError(f"{NAMESPACE}: the C++ launcher is not in use: {launcher_error}")
        log.warning("%s: every call runs SDPA: the C++ launcher is not in use: %s", NAMESPACE, launcher_error)
    return sdpa(q, k, v, causal, scale, layout, window)


def _install_launcher():
    """Build and load the launcher where it can run (a GPU is visible), or where asked
    to (OPTIMIZERD_KERNELS_BUILD=1: tests build it on machines without a GPU)."""
    global launcher_error, launcher_path
    forced = os.environ.get("OPTIMIZERD_KERNELS_BUILD", "") not in ("", "0")
    if not (forced or torch.cuda.is_available()):
        launcher_error = "no CUDA device at import"
    else:
        try:
            launcher_path = _launcher.load(NAMESPACE)
            return
        except (_launcher.BuildError, OSError, RuntimeError) as e:
            launcher_error = str(e)
            if strict():
                raise
    _lib.impl("attention", _sdpa_on_cuda, "CUDA")


_install_launcher()
