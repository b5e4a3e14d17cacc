"""The op as a Hugging Face transformers attention implementation.

transformers calls it as fn(module, query [B,Hq,Sq,D], key [B,Hkv,Sk,D], value,
attention_mask, scaling=..., dropout=..., **kwargs) and expects (output [B,Sq,Hq,D], None).
The projections are [B,S,H,D] in memory and reach us as transposed views, so the op runs
in "bshd" on the same memory (no copy in) and writes [B,Sq,Hq,D] directly (no copy out).

Sliding-window layers (Mistral, Gemma 2/3's local layers, Qwen2 with use_sliding_window):
transformers passes the layer's `sliding_window` as a kwarg (a few models only set it on the
attention module, which is read too), and the op runs them with window = sliding_window
(causal only; masking_utils' kv_idx > q_idx - sliding_window is the op's window). The mask
function leaves the window's mask out where nothing else needs one, as it does for plain
causal masks. A layer this module hands to transformers' SDPA instead gets that window mask
back, built here (the same booleans sdpa_mask builds).

The kernels take no mask, no soft-capping, no attention sinks (s_aux) and no dropout: such
calls, and prefill over a longer cache (Sq > 1, Sq != Sk, where transformers' mask-free
calls mean top-left causal), go to transformers' own SDPA function unchanged. The mask
function is transformers' sdpa_mask, which leaves the mask out (None) whenever causality
alone says it (no padding), so that plain prefill and decode reach the kernels — also
while a CUDA graph is captured or torch.compile traces, where sdpa_mask itself always builds
a mask (transformers counts stream capture as tracing, so as not to sync on the padding).
"""
import logging

import torch

from . import _op

log = logging.getLogger(_op.NAMESPACE)
_delegated = set()
# The window sizes whose masks `mask` left out: a model whose attention modules take the window
# from their config alone (neither the kwarg nor an attribute) is recognised by them.
_elided_windows = set()


def layer_window(module, kwargs):
    """The layer's sliding window (keys), or None: transformers' `sliding_window` kwarg, else the
    attention module's `sliding_window` attribute, else its config's `sliding_window` where the
    model built sliding-window masks of that size (which `mask` left out) and the config says
    this layer is a sliding one (no `layer_types`, or its entry is "sliding_attention")."""
    w = kwargs.get("sliding_window")
    if w is None:
        w = getattr(module, "sliding_window", None)
    if w is None:
        cfg = getattr(module, "config", None)
        cw = getattr(cfg, "sliding_window", None)
        if cw is not None and cw in _elided_windows:
            types, idx = getattr(cfg, "layer_types", None), getattr(module, "layer_idx", None)
            if types is None or (idx is not None and idx < len(types) and types[idx] == "sliding_attention"):
                w = cw
    return int(w) if w is not None else None


def _why_not(module, query, key, attention_mask, dropout, kwargs, window, is_causal):
    if attention_mask is not None:
        return "an attention_mask is given (padding, or a static cache)"
    if dropout:
        return f"dropout {dropout}"
    for k in ("softcap", "s_aux", "position_bias"):
        if kwargs.get(k) is not None:
            return f"{k} is set"
    if kwargs.get("output_attentions"):
        return "output_attentions asks for the weights"
    if window is not None and not is_causal:
        return f"sliding_window {window} on a non-causal layer (a two-sided window)"
    if window is not None and window < 1:
        return f"sliding_window {window}"
    sq, sk = query.shape[2], key.shape[2]
    if sq > 1 and sq != sk and is_causal:
        return f"causal Sq {sq} != Sk {sk} without a mask (transformers means top-left causal here)"
    return None


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    is_causal = kwargs.get("is_causal")
    is_causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    window = layer_window(module, kwargs)
    why = _why_not(module, query, key, attention_mask, dropout, kwargs, window, is_causal)
    if why is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        shape = (tuple(query.shape), tuple(key.shape), why)
        if shape not in _delegated:
            _delegated.add(shape)
            log.info("%s: transformers' SDPA runs q %s k %s: %s", _op.NAMESPACE, shape[0], shape[1], why)
        sq, sk = query.shape[2], key.shape[2]
        if (attention_mask is None and window is not None and is_causal and window >= 1
                and (sq == 1 or sq == sk) and window < sk):
            # `mask` left this layer's window mask out: give transformers' SDPA the same booleans.
            attention_mask = _op.window_mask(sq, sk, window, query.device)[None, None]
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    sq, sk = query.shape[2], key.shape[2]
    w = window if window is not None and window < sk else 0  # a window of Sk or more masks nothing
    causal = is_causal and (sq > 1 or w > 0)
    out = _op.OP(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal, scaling, "bshd", w)
    return out, None


def mask(batch_size, q_length, kv_length, attention_mask=None, local_size=None, allow_is_causal_skip=True, **kwargs):
    """transformers' sdpa_mask, except that the causal-only case (no padding mask at all, every
    query row either alone or one per key, which the op's causal flag expresses; with a sliding
    window too, which the op's window expresses: `local_size` is the layer's sliding_window)
    returns None whatever the tracing state. `allow_is_causal_skip` is False where transformers
    knows better (a static cache's unfilled slots, packed sequences, extra mask functions), and
    then sdpa_mask decides."""
    if allow_is_causal_skip and attention_mask is None and (q_length == 1 or q_length == kv_length):
        if local_size is not None:
            _elided_windows.add(int(local_size))
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, **kwargs)


def register(name: str) -> str:
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError(f"{_op.NAMESPACE}.register_transformers needs transformers >= 4.56 "
                          f"(AttentionInterface, AttentionMaskInterface): {e}") from e
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask)
    return name
