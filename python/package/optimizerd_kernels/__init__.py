"""Attention kernels tuned by optimizerd for one GPU, as a PyTorch op.

    import optimizerd_kernels as okern
    o = okern.attention(q, k, v, causal=True)          # [B,H,S,D] in, [B,H,S,D] out
    o = okern.attention(q, k, v, layout="bshd")        # [B,S,H,D] in and out
    o = okern.attention(q, k, v, causal=True, window=4096)  # sliding window (Mistral, Gemma local layers)
    okern.register_transformers()                      # then attn_implementation="optimizerd"

Each call runs the kernel tuned for its exact shape, else the best exported kernel of the
same shape class whose launch formulas cover it, else torch's SDPA (logged once per
shape). `explain(q, k, v, ...)` says which and why; `stats()` counts calls per path.
The op is `torch.ops.<package>.attention`: torch.compile traces it (fake implementation)
and CUDA graphs capture it. OPTIMIZERD_STRICT=1 turns every fallback into an error.
A shape where the run's closing comparison measured SDPA faster runs SDPA, unless
OPTIMIZERD_ALWAYS_KERNELS=1.
"""
from typing import Optional

import torch

from . import _op

__all__ = ["attention", "explain", "stats", "info", "register_transformers"]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: Optional[float] = None, layout: str = "bhsd", window: int = 0) -> torch.Tensor:
    """softmax(q k^T * scale) v, scale = 1/sqrt(D) by default.

    q: [B, Hq, Sq, D] ("bhsd") or [B, Sq, Hq, D] ("bshd"); k, v: the same with Hkv and Sk.
    Hq a multiple of Hkv (grouped-query heads; Hkv = 1 is multi-query). Any strides with a
    contiguous last dim (views from a transpose or a KV cache need no copy). causal: query
    row i sees keys <= i + Sk - Sq (the query rows are the last Sq positions, as in
    FlashAttention >= 2.1 and SDPA's bottom-right causal). window (with causal only; 0: none):
    a sliding window of that many keys, row i (position p = i + Sk - Sq) sees keys
    p - window < j <= p (Hugging Face's sliding_window, FlashAttention's window_size =
    (window - 1, 0)); only kernels exported from templates that implement windows run such
    calls, the others run SDPA with the window's mask. Returns a new tensor, contiguous
    in `layout`. fp16/bf16 on the GPU run the exported kernels; anything else runs SDPA.
    """
    return _op.OP(q, k, v, causal, scale, layout, window)


def explain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
            layout: str = "bhsd", window: int = 0) -> dict:
    """Which path a call with these tensors takes: {"path": "exact" | "class" | "fallback",
    "kernel": file or None, "reason": str, "shape": the daemon's shape key}."""
    _op.check_args(q, k, v, layout, causal, window)
    call = _op.call_of(q, k, v, causal, layout, window)
    if not q.is_cuda:
        return {"path": "fallback", "kernel": None, "reason": "CPU tensors run SDPA", "shape": call.shape_key}
    return dict(_op.decide(call).summary(), shape=call.shape_key)


def stats() -> dict:
    """Calls per path since import ({"exact": n, "class": n, "fallback": n}) on the GPU, and
    the decisions taken, per shape key."""
    counts = {"exact": 0, "class": 0, "fallback": 0}
    if _op.launcher_error is None and _op.launcher_path is not None:
        calls = getattr(torch.ops, _op.NAMESPACE)._calls(torch.empty(0)).tolist()
        counts = {"fallback": calls[0], "exact": calls[1], "class": calls[2]}
    with _op._lock:
        decisions = {c.shape_key: d.summary() for c, d in _op._decisions.items()}
    return dict(counts, decisions=decisions)


def info() -> dict:
    """The package: where its kernels came from, and whether the C++ launcher is in use."""
    m = _op.dispatcher().manifest
    return {"package": _op.NAMESPACE, "run": m.get("run"), "gpu": m.get("gpu"), "device": m.get("device"),
            "kernels": [{"file": k["file"], "template": k["template"], "dtype": k["dtype"], "arch": k.get("arch"),
                         "windows": bool(k.get("windows")), "shapes": [s["key"] for s in k["shapes"]]}
                        for k in m["kernels"]],
            "launcher": _op.launcher_path, "launcher_error": _op.launcher_error}


def register_transformers(name: str = "optimizerd") -> str:
    """Register the op with Hugging Face transformers' attention interface, so that
    `attn_implementation=name` (or `model.set_attn_implementation(name)`) runs it."""
    from ._transformers import register

    return register(name)
