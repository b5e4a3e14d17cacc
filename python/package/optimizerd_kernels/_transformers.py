"""The op as a Hugging Face transformers attention implementation.

transformers calls it as fn(module, query [B,Hq,Sq,D], key [B,Hkv,Sk,D], value,
attention_mask, scaling=..., dropout=..., **kwargs) and expects (output [B,Sq,Hq,D], None).
The projections are [B,S,H,D] in memory and reach us as transposed views, so the op runs
in "bshd" on the same memory (no copy in) and writes [B,Sq,Hq,D] directly (no copy out).

The kernels take no mask, no sliding window, no soft-capping and no dropout: such calls,
and prefill over a longer cache (Sq > 1, Sq != Sk, where transformers' mask-free calls
mean top-left causal), go to transformers' own SDPA function unchanged. The mask
function is transformers' sdpa_mask, which leaves the mask out (None) whenever causality
alone says it (no padding), so that plain prefill and decode reach the kernels.
"""
import logging

import torch

from . import _op

log = logging.getLogger(_op.NAMESPACE)
_delegated = set()


def _why_not(module, query, key, attention_mask, dropout, kwargs):
    if attention_mask is not None:
        return "an attention_mask is given (padding, or a static cache)"
    if dropout:
        return f"dropout {dropout}"
    for k in ("sliding_window", "softcap", "s_aux", "position_bias"):
        if kwargs.get(k) is not None:
            return f"{k} is set"
    if kwargs.get("output_attentions"):
        return "output_attentions asks for the weights"
    sq, sk = query.shape[2], key.shape[2]
    if sq > 1 and sq != sk and kwargs.get("is_causal", getattr(module, "is_causal", True)):
        return f"causal Sq {sq} != Sk {sk} without a mask (transformers means top-left causal here)"
    return None


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    why = _why_not(module, query, key, attention_mask, dropout, kwargs)
    if why is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        shape = (tuple(query.shape), tuple(key.shape), why)
        if shape not in _delegated:
            _delegated.add(shape)
            log.info("%s: transformers' SDPA runs q %s k %s: %s", _op.NAMESPACE, shape[0], shape[1], why)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = bool(is_causal) and query.shape[2] > 1
    out = _op.OP(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal, scaling, "bshd")
    return out, None


def register(name: str) -> str:
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:
        raise ImportError(f"{_op.NAMESPACE}.register_transformers needs transformers >= 4.56 "
                          f"(AttentionInterface, AttentionMaskInterface): {e}") from e
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
