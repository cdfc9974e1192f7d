"""oneDNN's prepacked linears compute what nn.Linear computes, replace all of a model's layers or none."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.core.engine import Engine
from engine.model import cpu_linear
from engine.model.cpu_linear import PackedLinear, bucket_rows, pack_linears
from engine.request.config import EngineConfig
from engine.request.sampling import SamplingParams

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def small_model(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Sequential(nn.Linear(96, 32, bias=False))).to(dtype)


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_packed_model_matches_the_dense_one(dtype, atol):
    dense = small_model(dtype)
    packed = small_model(dtype)
    assert pack_linears(packed) == 2
    assert all(type(m) is not nn.Linear for m in packed.modules())
    assert isinstance(packed[2][0], PackedLinear) and packed[2][0].bias is None
    # one row, a batch, rows padded to a bucket (65 -> 72, 300 -> 320), and leading dimensions
    for shape in [(1, 64), (37, 64), (65, 64), (300, 64), (2, 5, 64)]:
        x = torch.randn(shape).to(dtype)
        with torch.inference_mode():
            want, got = dense(x).float(), packed(x).float()
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=atol, rtol=atol)


def test_nothing_changes_when_a_layer_disagrees(monkeypatch):
    model = small_model(torch.float32)
    monkeypatch.setattr(cpu_linear, "TOLERANCE", -1.0)  # every check fails
    assert pack_linears(model) == 0
    assert [type(m) for m in model.modules()].count(nn.Linear) == 2


def test_nothing_changes_without_onednn(monkeypatch):
    model = small_model(torch.float32)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert pack_linears(model) == 0
    assert [type(m) for m in model.modules()].count(nn.Linear) == 2


def test_the_engine_generates_the_same_tokens_packed_or_not():
    prompts = [[5, 17, 99, 3] * 6, [42] * 30, list(range(10, 60))]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    packed = Engine(EngineConfig(model="tiny"))
    dense = Engine(EngineConfig(model="tiny", pack_cpu_weights=False))
    assert packed.packed_linears == 4 * 4 + 1 and dense.packed_linears == 0  # 4 per layer and the output layer
    got = [o.token_ids for o in packed.generate(prompts, params)]
    want = [o.token_ids for o in dense.generate(prompts, params)]
    assert got == want


def test_row_buckets_are_few_bounded_and_exact_for_decode_batches():
    sizes = [bucket_rows(n) for n in range(1, 16385)]
    assert sizes[:cpu_linear.EXACT_ROWS] == list(range(1, cpu_linear.EXACT_ROWS + 1))  # decode batches: exact
    assert all(n <= b <= n * 1.125 for n, b in enumerate(sizes, start=1))  # at most 12.5 % padding
    assert sizes == sorted(sizes) and len(set(sizes)) == 128  # monotone, and few shapes for oneDNN's cache
    assert bucket_rows(65) == 72 and bucket_rows(129) == 144 and bucket_rows(512) == 512 and bucket_rows(513) == 576


def test_padded_rows_do_not_reach_the_output():
    torch.manual_seed(0)
    dense = nn.Linear(64, 48)
    packed = nn.Sequential(nn.Linear(64, 48))
    packed[0].load_state_dict(dense.state_dict())
    assert pack_linears(packed) == 1
    x = torch.randn(130, 64)  # padded to 144 rows inside
    with torch.inference_mode():
        got = packed(x)
        want = dense(x)
    assert got.shape == (130, 48) and got.is_contiguous()
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
