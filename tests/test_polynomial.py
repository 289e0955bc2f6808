import subprocess
import sys
from functools import reduce

import pytest
import torch

import tpc_hooks as tpc
from conftest import random_head


def materialised_logit(head, z, order):
    """P_{:order}(z) from the full weight tensors W^[k] = sum_r lambda_r u_r o ... o u_r,
    built by explicit outer products and contracted one mode at a time."""
    zs = (z - head.scaler.mean) / head.scaler.scale
    total = head.bias[0] + sum(head.linear[i] * zs[i] for i in range(head.d_model))
    for k in range(2, order + 1):
        U, lam = head.factors[str(k)], head.lambdas[str(k)]
        W = torch.zeros([head.d_model] * k, dtype=z.dtype)
        for r in range(U.shape[1]):
            W += lam[r] * reduce(lambda a, b: torch.tensordot(a, b, dims=0), [U[:, r]] * k)
        for _ in range(k):  # W x_1 z x_2 z ... x_k z
            W = torch.tensordot(W, zs, dims=([W.dim() - 1], [0]))
        total = total + W
    return total


@pytest.mark.parametrize("degree", [1, 2, 3, 4, 5])
def test_every_truncation_equals_materialised_polynomial(degree):
    head = random_head(d_model=5, degree=degree, ranks=(3, 2, 4, 1))
    z = torch.randn(7, 5, dtype=torch.float64) * 2 + 1
    with torch.no_grad():
        for order in range(1, degree + 1):
            got = head(z, order=order)
            want = torch.stack([materialised_logit(head, row, order) for row in z])
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(head(z), head(z, order=degree))


def test_terms_cumulate_to_truncations():
    head = random_head()
    z = torch.randn(4, 3, 6, dtype=torch.float64)
    with torch.no_grad():
        terms = head.terms(z)
        assert terms.shape == (4, 3, 5)
        for n in range(1, 6):
            torch.testing.assert_close(terms[..., :n].sum(-1), head(z, order=n))


def test_cost_matches_parameter_count_and_closed_form():
    head = tpc.TPC(d_model=10, degree=5, rank=[3, 4, 5, 6])
    for n in range(1, 6):
        used = [head.bias, head.linear] + [
            p for k in range(2, n + 1) for p in (head.factors[str(k)], head.lambdas[str(k)])
        ]
        c = head.cost(n)
        assert c.params == sum(p.numel() for p in used)
        assert c.flops == 10 + sum(r * 10 + k * r for k, r in zip(range(2, n + 1), [3, 4, 5, 6], strict=False))
    assert head.cost() == head.cost(5)
    assert sum(head.term_flops()) == head.cost(5).flops


def test_shapes_and_half_precision():
    head = random_head(dtype=torch.float32)
    z = torch.randn(6)
    out = head(z)
    assert out.shape == () and out.dtype == torch.float32
    for half in (torch.float16, torch.bfloat16):
        zh = torch.randn(3, 6).to(half)
        got = head(zh, order=3)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, head(zh.float(), order=3))
    assert head.probs(z).item() == pytest.approx(torch.sigmoid(head(z)).item())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(d_model=0), "d_model must be an integer >= 1"),
        (dict(d_model=4, degree=0), "degree must be an integer >= 1"),
        (dict(d_model=4, degree=3, rank=0), "rank must be an integer >= 1"),
        (dict(d_model=4, degree=3, rank=[2]), "needs 2 entries; got 1"),
    ],
)
def test_bad_construction(kwargs, message):
    with pytest.raises(tpc.TPCHooksError, match=message):
        tpc.TPC(**kwargs)


def test_bad_inputs_at_scoring():
    head = random_head(dtype=torch.float32)
    with pytest.raises(tpc.TPCHooksError, match="z has d_model=7 but the head expects d_model=6"):
        head(torch.randn(2, 7))
    for bad in (0, 6, True):
        with pytest.raises(tpc.TPCHooksError, match=r"order must be an integer in 1\.\.5"):
            head(torch.randn(2, 6), order=bad)
    z = torch.randn(3, 6)
    z[1, 2] = float("nan")
    with pytest.raises(tpc.TPCHooksError, match=r"NaN/inf value\(s\), first at index \(1, 2\)"):
        head(z)


def test_import_pulls_in_no_toolkit():
    code = (
        "import sys, tpc_hooks, tpc_hooks.baselines, tpc_hooks.metrics, tpc_hooks.data, tpc_hooks.views, "
        "tpc_hooks.pooling;"
        "bad=[m for m in sys.modules if m.split('.')[0] in ('transformer_lens','nnsight','sae_lens','transformers')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("gate, escalate_only", [(False, False), (True, False), (True, True)])
def test_a_truncated_head_scores_as_the_truncation_and_saves_as_a_smaller_head(tmp_path, gate, escalate_only):
    head = random_head(d_model=12, degree=4, ranks=(3, 2, 2), dtype=torch.float32, seed=3)
    z = torch.randn(200, 12)
    head.set_bounds(z[:100], gate=gate)  # half the rows leave the trust region somewhere
    head.escalate_only = escalate_only
    for n in range(1, 5):
        small = head.truncated(n)
        assert small.degree == n and small.ranks == head.ranks[: n - 1]
        assert torch.equal(small(z), head(z, order=n))
        assert all(torch.equal(small(z, order=k), head(z, order=k)) for k in range(1, n + 1))
        assert small.cost().params == head.cost(n).params
        again = tpc.TPC.from_pretrained(small.save_pretrained(tmp_path / f"n{n}"))
        assert torch.equal(again(z), head(z, order=n))
    with pytest.raises(tpc.TPCHooksError, match="order must be an integer in 1..4"):
        head.truncated(5)
