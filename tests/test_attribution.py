from functools import reduce

import numpy as np
import pytest
import torch

import tpc_hooks as tpc
from conftest import random_head


def materialised_term(head, zs, k):
    """T_k(zs) from the full weight tensor W^[k], contracted one mode at a time (differentiable)."""
    U, lam = head.factors[str(k)].detach(), head.lambdas[str(k)].detach()
    W = sum(lam[r] * reduce(lambda a, b: torch.tensordot(a, b, dims=0), [U[:, r]] * k) for r in range(U.shape[1]))
    for _ in range(k):
        W = torch.tensordot(W, zs, dims=([W.dim() - 1], [0]))
    return W


@pytest.fixture(params=[torch.float64, torch.float32], ids=["f64", "f32"])
def setup(request):
    head = random_head(d_model=5, degree=4, ranks=(3, 2, 2), dtype=request.param)
    z = (torch.randn(3, 5, dtype=torch.float64) * 1.5 + 0.5).to(request.param)
    return head, z, request.param


def rel(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)


def test_parts_sum_to_the_logit(setup):
    head, z, dtype = setup
    a = tpc.attribute(head, z)
    with torch.no_grad():
        torch.testing.assert_close(a.logit, head(z), **rel(dtype))
        torch.testing.assert_close(a.by_order, head.terms(z), **rel(dtype))
    torch.testing.assert_close(a.by_order.sum(-1), a.logit, **rel(dtype))
    torch.testing.assert_close(a.bias + a.by_neuron.sum(-1), a.logit, **rel(dtype))
    torch.testing.assert_close(a.neuron_by_order.sum(-1)[:, 1:], a.by_order[:, 1:], **rel(dtype))


def test_neuron_attribution_is_eulers_split_of_the_materialised_terms(setup):
    head, z, dtype = setup
    a = tpc.attribute(head.double(), z.double())
    for b in range(len(z)):
        zs = a.z[b].clone().requires_grad_(True)
        for k in head.degrees:
            T = materialised_term(head.double(), zs, k)
            (g,) = torch.autograd.grad(T, zs)
            torch.testing.assert_close(a.neuron_by_order[b, k - 1], (zs * g / k).detach(), rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(a.neuron_by_order[b, 0], zs.detach() * head.linear.detach().double())


def test_pairs_are_the_hessian_split_of_the_materialised_terms(setup):
    head, z, dtype = setup
    a = tpc.attribute(head.double(), z.double())
    for b in range(len(z)):
        zs = a.z[b]
        for k in head.degrees:
            H = torch.autograd.functional.hessian(lambda v, k=k: materialised_term(head.double(), v, k), zs)
            M = zs[:, None] * zs[None, :] * H / (k * (k - 1))
            torch.testing.assert_close(a.pair_matrix(b, order=k), M, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(M.sum(), a.by_order[b, k - 1], rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(a.self_pairs(b, order=k), torch.diagonal(M), rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(a.pair_matrix(b, order=None).sum(), a.by_order[b, 1:].sum(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("mode", ["positive", "negative", "absolute"])
@pytest.mark.parametrize("order", [2, 3, None])
def test_top_pairs_match_a_sorted_brute_force(mode, order):
    head = random_head(d_model=23, degree=3, ranks=(4, 3))
    a = tpc.attribute(head, torch.randn(2, 23, dtype=torch.float64))
    M = a.pair_matrix(1, order=order)
    i, j = torch.triu_indices(23, 23, offset=1)
    v = 2 * M[i, j]
    key = {"positive": v, "negative": -v, "absolute": v.abs()}[mode]
    want = [(int(i[t]), int(j[t]), float(v[t])) for t in key.argsort(descending=True)[:15]]
    got = a.top_pairs(15, order, input=1, mode=mode, block=4)  # small blocks: the merge is exercised
    assert [(p, q) for p, q, _ in got] == [(p, q) for p, q, _ in want]
    np.testing.assert_allclose([x for _, _, x in got], [x for _, _, x in want], rtol=1e-10)


def test_top_pairs_at_d_model_8192_without_the_full_matrix():
    d = 8192
    head = tpc.TPC(d, 2, 8)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        head.factors["2"].copy_(torch.randn(d, 8, generator=gen) * 0.01)
        head.factors["2"][[123, 7001], 0] = 3.0  # plant one strongly interacting pair
        head.lambdas["2"].copy_(torch.tensor([2.0] + [0.1] * 7))
    z = torch.randn(1, d, generator=gen)
    z[0, [123, 7001]] = 2.0
    a = tpc.attribute(head, z)
    with pytest.raises(tpc.TPCHooksError, match="use top_pairs"):
        a.pair_matrix()
    top = a.top_pairs(5, mode="absolute", block=256)
    assert (top[0][0], top[0][1]) == (123, 7001)
    rest = float((head.factors["2"][123, 1:] * head.factors["2"][7001, 1:] * head.lambdas["2"][1:]).sum().detach())
    assert top[0][2] == pytest.approx(2 * 2.0 * 2.0 * (2.0 * 3.0 * 3.0 + rest), rel=1e-4)


def test_monitor_inputs_are_pooled_its_way():
    head = random_head(d_model=6, degree=3, ranks=(2, 2), dtype=torch.float32)
    mon = tpc.Monitor(head, "blocks.1.hook_resid_post", pooling="max")
    acts = torch.randn(2, 5, 6)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]])
    from tpc_hooks.pooling import pool

    want = tpc.attribute(head, pool(acts, mask, "max"))
    got = tpc.attribute(mon, acts, mask=mask)
    torch.testing.assert_close(got.by_neuron, want.by_neuron)
    assert got.site == "blocks.1.hook_resid_post" and got.basis == "residual"
    cache = {"blocks.1.hook_resid_post": acts}  # what an ActivationCache lookup gives
    torch.testing.assert_close(tpc.attribute(mon, cache, mask=mask).logit, want.logit)


def test_exports():
    pytest.importorskip("pandas")
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import json

    head = random_head(d_model=7, degree=3, ranks=(3, 2), dtype=torch.float32)
    a = tpc.attribute(head, torch.randn(2, 7))
    d = json.loads(a.to_json(input=1, k=4))
    assert d["logit"] == pytest.approx(float(a.logit[1])) and len(d["top_pairs"]["2"]) == 4
    df = a.to_dataframe(input=1, k=4)
    assert set(df["kind"]) == {"order", "neuron", "pair"}
    assert df[df.kind == "order"]["value"].sum() == pytest.approx(float(a.logit[1]), rel=1e-5)
    fig = a.plot(input=1, k=4)
    assert len(fig.axes) == 3  # bars, heatmap, colour bar
    m = a.mean()
    torch.testing.assert_close(m["by_neuron_abs"], a.by_neuron.abs().mean(0))


def test_bad_attribution_input():
    head = random_head(d_model=6, degree=3, ranks=(2, 2), dtype=torch.float32)
    with pytest.raises(tpc.TPCHooksError, match="z has d_model=5 but the head expects d_model=6"):
        tpc.attribute(head, torch.randn(2, 5))
    a = tpc.attribute(head, torch.randn(2, 6))
    with pytest.raises(tpc.TPCHooksError, match=r"order in 2\.\.3"):
        a.top_pairs(3, order=4)
    with pytest.raises(tpc.TPCHooksError, match=r"k must be in 1\.\.15 \(the number of pairs among 6 residual units\)"):
        a.top_pairs(16)
    with pytest.raises(tpc.TPCHooksError, match="mode must be one of"):
        a.top_pairs(3, mode="largest")
    with pytest.raises(tpc.TPCHooksError, match="input must index one of the 2"):
        a.top_pairs(3, input=5)
    with pytest.raises(tpc.TPCHooksError, match="needs a TPC head or a Monitor"):
        tpc.attribute(object(), torch.randn(2, 6))
    with pytest.raises(tpc.TPCHooksError, match="per-token activations"):
        tpc.attribute(head, torch.randn(2, 3, 6))


def test_directions_in_model_units_reproduce_the_projections():
    head = random_head(d_model=6, degree=3, ranks=(2, 3))
    x = torch.randn(4, 6, dtype=torch.float64)
    zs = (x - head.scaler.mean) / head.scaler.scale

    def const(u):
        return (head.scaler.mean / head.scaler.scale) @ u  # <u, mean/scale>

    torch.testing.assert_close(x @ head.direction(1) - const(head.linear.detach()), zs @ head.linear.detach())
    U3 = head.factors["3"].detach()
    torch.testing.assert_close(x @ head.direction(3) - (head.scaler.mean / head.scaler.scale) @ U3, zs @ U3)
    torch.testing.assert_close(head.direction(3, r=1), head.direction(3)[:, 1])
    with pytest.raises(tpc.TPCHooksError, match="r must index one of the 3 factors of degree 3"):
        head.direction(3, r=3)


@pytest.mark.parametrize("mode", ["positive", "negative", "absolute"])
def test_pairs_over_a_set_of_inputs(mode):
    head = random_head(d_model=12, degree=3, ranks=(3, 2))
    a = tpc.attribute(head, torch.randn(6, 12, dtype=torch.float64))
    Ms = torch.stack([2 * a.pair_matrix(b, order=None) for b in range(6)])
    agg = Ms.abs().mean(0) if mode == "absolute" else Ms.mean(0)
    i, j = torch.triu_indices(12, 12, offset=1)
    v = agg[i, j]
    key = {"positive": v, "negative": -v, "absolute": v}[mode]
    want = [(int(i[t]), int(j[t])) for t in key.argsort(descending=True)[:8]]
    got = a.top_pairs(8, None, input=None, mode=mode, candidates=None, block=5)
    assert [(p, q) for p, q, _ in got] == want
    np.testing.assert_allclose([x for *_, x in got], [float(agg[p, q]) for p, q in want], rtol=1e-10)
    # restricted to candidate neurons: exactly the brute force within that set
    cand = a.by_neuron.abs().mean(0).topk(5).indices.sort().values.tolist()
    sub = [(p, q) for p, q in zip(i.tolist(), j.tolist(), strict=True) if p in cand and q in cand]
    sub_key = torch.tensor([float(key[[t for t in range(len(i)) if (int(i[t]), int(j[t])) == pq][0]]) for pq in sub])
    want_sub = [sub[t] for t in sub_key.argsort(descending=True)[:4]]
    assert [(p, q) for p, q, _ in a.top_pairs(4, None, input=None, mode=mode, candidates=5)] == want_sub
    with pytest.raises(tpc.TPCHooksError, match="exceeds the 10 pairs among 5 candidate neurons"):
        a.top_pairs(11, None, input=None, candidates=5)


def test_unit_directions_and_circuitsvis_hand_off():
    head = random_head(d_model=6, degree=2, ranks=(2,), dtype=torch.float32)
    a = tpc.attribute(head, torch.randn(2, 6))
    assert torch.equal(a.direction(4), torch.eye(6)[4])
    with pytest.raises(tpc.TPCHooksError, match=r"neuron index in 0\.\.5"):
        a.direction(6)
    from tpc_hooks.views import colored_tokens

    try:
        import circuitsvis  # noqa: F401
    except ImportError:
        with pytest.raises(tpc.TPCHooksError, match="needs circuitsvis: pip install circuitsvis"):
            colored_tokens(["a", "b"], [0.1, 0.9])
    else:
        html = str(colored_tokens(["how", " to", " bake"], [0.1, 0.5, 0.9]))
        assert "ColoredTokens" in html and '" bake"' in html and "0.9" in html
