"""oneDNN's prepacked linear layers for the CPU engine: the weights reordered once, at load, not every call.

torch's `F.linear` on the CPU calls MKL's sgemm, which packs its operands into scratch buffers on every call
(for a decode step's few rows, much of the work), and on this project's AMD CPU runs slower kernels besides.
oneDNN (torch's mkldnn backend, the library vLLM's CPU build uses) can reorder a weight once into its
kernel's layout. On the engine-speed checkpoint, one core: a 32-sequence decode step 20.9 -> 8.95 ms, a
160-token prefill 15.9 -> 8.67 ms, measured side by side.

The ops are torch's own (`torch.ops.mkldnn._reorder_linear_weight`, `_linear_pointwise`, what inductor's CPU
backend emits for frozen linears) but not public API, so `pack_linears` checks them on each layer against
`F.linear` and leaves the model as it is when they are missing or disagree.

oneDNN builds a kernel ("primitive") per input shape and keeps the last 1,024 it built. A served step's rows
are its token count, which takes hundreds of values under load (decodes plus prefill chunks of every
length): with four weight shapes per layer that is past the cache, so it thrashes, and a step that meets a
rebuilt shape pays for building it again (prefill steps of 65-512 tokens ran 1.25x faster bucketed).
So rows beyond
``EXACT_ROWS`` are padded up to one of eight sizes per octave (at most 12.5 % padding): 128 row
counts up to 16,384 tokens, every kernel stays cached.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PACKED_DTYPES = (torch.float32, torch.bfloat16)
EXACT_ROWS = 64  # a decode step's rows (its batch) are few and recur: kept exact
BUCKETS_PER_OCTAVE = 8
# Largest |packed - F.linear| accepted at packing, relative to the output's scale (the summation order differs).
TOLERANCE = 1e-3


class PackedLinear(nn.Module):
    """A linear layer over a weight oneDNN reordered once. It holds no dense copy of the weight."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, in_features: int, out_features: int):
        super().__init__()
        self.packed = packed
        self.bias = bias
        self.in_features = in_features
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0] if x.dim() == 2 else 0
        padded = bucket_rows(rows)
        if padded != rows:
            x = F.pad(x, (0, 0, 0, padded - rows))
        out = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return out if padded == rows else out[:rows]


def bucket_rows(rows: int) -> int:
    """``rows`` rounded up to the next of ``BUCKETS_PER_OCTAVE`` sizes per power of two (exact up to
    ``EXACT_ROWS``): few enough shapes that oneDNN's kernel cache holds them all."""
    if rows <= EXACT_ROWS:
        return rows
    step = (1 << (rows - 1).bit_length()) // (2 * BUCKETS_PER_OCTAVE)
    return -(-rows // step) * step


def _pack(linear: nn.Linear) -> PackedLinear | None:
    weight = linear.weight.detach()
    bias = None if linear.bias is None else linear.bias.detach()
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        layer = PackedLinear(packed, bias, linear.in_features, linear.out_features)
        probe = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        want, got = F.linear(probe, weight, bias).float(), layer(probe).float()
    except (AttributeError, RuntimeError):
        return None  # this torch has no such op, or it refused the weight
    scale = want.abs().max().item() or 1.0
    atol = TOLERANCE if weight.dtype == torch.float32 else 3e-2  # bfloat16 keeps 8 bits of mantissa
    return layer if (got - want).abs().max().item() <= atol * scale else None


def pack_linears(model: nn.Module) -> int:
    """Replace the model's CPU linear layers by prepacked ones; the number replaced (0: nothing changed)."""
    if not torch.backends.mkldnn.is_available():
        return 0
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) is nn.Linear and child.weight.device.type == "cpu"
               and child.weight.dtype in PACKED_DTYPES]
    packed = []
    with torch.no_grad():
        for parent, name, child in targets:
            layer = _pack(child)
            if layer is None:
                return 0  # all or none: one model, one kind of kernel
            packed.append((parent, name, layer))
    for parent, name, layer in packed:
        setattr(parent, name, layer)
    return len(packed)
