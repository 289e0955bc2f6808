"""Policies scored together (head._together.Together): each result equals the policy's own
per-step result bit for bit, whatever the group (cascades, fixed orders, gates, escalate_only,
NaN rows, mixed shapes, weights changed between passes); a group runs fewer tensor operations
than its members apart; a MonitorSet and a serving engine's per-request scores use it and
still score each member as alone."""

import pytest
import torch
from tiny_models import hf_llama, named, random_head, tiny_head
from torch.profiler import profile

import tpc_hooks as tpc
from tpc_hooks.head import _together
from tpc_hooks.head._policy import FixedOrder
from tpc_hooks.head._together import Together
from tpc_hooks.monitoring._requests import RequestScores

FIELDS = ("logits", "probs", "decision_logits", "exit_order", "flops", "gated")
D = 16


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, NaN where NaN (None where None)."""
    if a is None or b is None:
        return a is None and b is None
    if a.is_floating_point():
        m = a.isnan()
        return torch.equal(m, b.isnan()) and torch.equal(a[~m], b[~m])
    return torch.equal(a, b)


def assert_as_alone(pairs, got) -> None:
    for (rule, z), res in zip(pairs, got, strict=True):
        want = rule(z)
        for f in FIELDS:
            assert same(getattr(res, f), getattr(want, f)), f
        assert res.degree == want.degree


def cascade(seed: int, *, gate: bool = True, escalate: bool = False, degree: int = 4, rank: int = 3) -> tpc.Cascade:
    """A cascade whose rows exit at every order: a trust region from the inputs' own range (some rows
    leave it), per-order calibration, and exit thresholds that leave some rows open."""
    head = random_head(D, degree, rank, std=0.4, seed=seed)
    gen = torch.Generator().manual_seed(100 + seed)
    head.set_bounds(torch.randn(64, D, generator=gen), margin=0.2, gate=gate)
    head.escalate_only = escalate
    temps = (0.5 + torch.rand(degree, generator=gen)).tolist()
    biases = (0.3 * torch.randn(degree, generator=gen)).tolist()
    return tpc.Cascade(head, 0.3, temperatures=temps, biases=biases)


def inputs(n: int, k: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    zs = [1.5 * torch.randn(n, D, generator=gen) for _ in range(k)]
    if n > 2:
        zs[0][1, 3] = float("nan")
        zs[-1][2, 0] = float("inf")
    return zs


@pytest.mark.parametrize("n", [1, 7])
@pytest.mark.parametrize("gate,escalate", [(True, False), (False, False), (True, True)])
def test_cascades_of_one_shape_score_as_alone(n, gate, escalate, monkeypatch):
    stacked = []
    monkeypatch.setattr(
        _together._Stack, "step", lambda self, zs, real=_together._Stack.step: stacked.append(len(zs)) or real(self, zs)
    )
    pols = [cascade(s, gate=gate, escalate=escalate) for s in range(3)]
    pairs = [(p.step, z) for p, z in zip(pols, inputs(n, 3), strict=True)]
    got = Together().step(pairs)
    assert stacked == [3]  # one stacked evaluation
    assert_as_alone(pairs, got)
    if n > 2:  # the case is not degenerate: rows exit at several orders
        assert len(set(torch.cat([r.exit_order for r in got]).tolist())) > 1


def test_fixed_orders_mixed_shapes_and_other_policies_score_as_alone():
    class Mine:  # a user's own policy: scored alone
        def __init__(self, head):
            self.head = head

        def step(self, z):
            return FixedOrder(self.head, 1).step(z)

    heads = [tiny_head(D, 3, seed=s) for s in range(6)]
    pols = [
        FixedOrder(heads[0]),
        FixedOrder(heads[1]),
        FixedOrder(heads[2], 2),
        cascade(7),
        cascade(8, degree=3),
        cascade(9, rank=5),
        Mine(heads[3]),
        FixedOrder(heads[4]),
    ]
    zs = inputs(5, len(pols), seed=1)
    zs[-1] = zs[-1][:3]  # another row count: alone
    pairs = [(p.step, z) for p, z in zip(pols, zs, strict=True)]
    assert_as_alone(pairs, Together().step(pairs))


def test_members_of_another_packed_rank_or_trust_region_fall_back_to_alone():
    a, b = cascade(0), cascade(1)
    b.head.clear_bounds()  # same key (gate flag, degree), no trust region: not stackable
    pairs = [(a.step, z) for z in inputs(4, 1)] + [(b.step, inputs(4, 1, seed=2)[0])]
    assert_as_alone(pairs, Together().step(pairs))


def test_a_group_follows_changed_weights_scalers_and_thresholds():
    pols = [cascade(s) for s in range(2)]
    zs = inputs(6, 2)
    together = Together()
    pairs = [(p.step, z) for p, z in zip(pols, zs, strict=True)]
    assert_as_alone(pairs, together.step(pairs))
    with torch.no_grad():
        pols[0].head.factors["2"].mul_(1.5)  # a parameter (its version counter moves)
        pols[1].head.scaler.scale.mul_(0.7)  # the scaler, which the packs do not cover
    pols[0].lower, pols[0].upper = 0.1, 0.95  # the exit thresholds
    assert_as_alone(pairs, together.step(pairs))
    pols[1].head.set_bounds(torch.randn(64, D), margin=0.5, gate=True)
    assert_as_alone(pairs, together.step(pairs))


def ops(fn) -> int:
    with profile() as prof:
        fn()
    return sum(1 for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::"))


def test_a_group_runs_fewer_tensor_operations_than_its_members_apart():
    pols = [cascade(s) for s in range(4)]
    pairs = [(p.step, z) for p, z in zip(pols, inputs(8, 4), strict=True)]
    together = Together()
    together.step(pairs)  # the stacked weights are made once
    apart, joint = ops(lambda: [r(z) for r, z in pairs]), ops(lambda: together.step(pairs))
    one = ops(lambda: pairs[0][0](pairs[0][1]))
    assert joint < apart / 2 and joint < 2 * one, (one, apart, joint)


def test_request_scores_begin_and_end_score_members_together_as_alone():
    """The serving engine's path: each member's begin (pools per request), one Together step, each end."""
    heads = [random_head(D, 3, 3, seed=s) for s in range(3)]
    mons = [
        tpc.Monitor(heads[0], "blocks.0.hook_resid_post", pooling="mean", cascade=tpc.Cascade(heads[0], 0.2)),
        tpc.Monitor(heads[1], "blocks.0.hook_resid_post", pooling="last", cascade=tpc.Cascade(heads[1], 0.2)),
        tpc.Monitor(heads[2], "blocks.0.hook_resid_post", pooling="token", aggregate="max"),
    ]
    gen = torch.Generator().manual_seed(3)
    passes = [[("a", 4, True), ("b", 2, False)], [("a", 1, True), ("b", 3, True)], [("a", 1, True), ("b", 1, True)]]
    joint = [RequestScores(m, cascade=m.cascade) for m in mons]
    alone = [RequestScores(m, cascade=m.cascade) for m in mons]
    together = Together()
    for p in passes:
        rows = torch.randn(sum(n for _, n, _ in p), D, generator=gen)
        args = ([r for r, _, _ in p], rows, [n for _, n, _ in p], [c for _, _, c in p])
        zs = [rs.begin(*args) for rs in joint]
        got = together.step([(rs.rule, z) for rs, z in zip(joint, zs, strict=True) if z is not None])
        it = iter(got)
        ends = [rs.end(next(it) if z is not None else None) for rs, z in zip(joint, zs, strict=True)]
        for (done, res), rs in zip(ends, alone, strict=True):
            want_done, want = rs.update_flat(*args)
            assert done == want_done
            for f in ("logits", "probs", "decision_logits", "exit_order", "flops"):
                assert same(getattr(res, f), getattr(want, f)), f
    assert all(j.take().keys() == a.take().keys() for j, a in zip(joint, alone, strict=True))


def test_a_set_with_members_of_one_shape_scores_each_as_alone(monkeypatch):
    stacked = []
    monkeypatch.setattr(
        _together._Stack, "step", lambda self, zs, real=_together._Stack.step: stacked.append(len(zs)) or real(self, zs)
    )
    model = named(hf_llama())
    d = model.config.hidden_size
    heads = [random_head(d, 3, 4, std=0.2, seed=s) for s in range(3)]
    mons = {
        f"m{k}": tpc.Monitor(h, "blocks.1.hook_resid_post", pooling=pool, cascade=tpc.Cascade(h, 0.3))
        for k, (h, pool) in enumerate(zip(heads, ("mean", "last", "max"), strict=True))
    }
    prompts = ["how do i make bomb", "hello world", "tell me about the weather please"]
    run = tpc.MonitorSet(mons).generate(model, prompts, max_new_tokens=5)
    assert stacked and set(stacked) == {3}
    for name, mon in mons.items():
        alone = mon.generate(model, prompts, max_new_tokens=5)
        for f in ("scores", "logits", "exit_orders", "flops"):
            for g, a in zip(getattr(run[name], f), getattr(alone, f), strict=True):
                assert torch.equal(g, a), (name, f)
