"""Per-request scoring (what a serving engine's workers run) against StepScores on each request
alone: requests that arrive in prompt chunks, interleave in any order, and start over after a
preemption score every step as a batch of one scores it."""

import pytest
import torch

import tpc_hooks as tpc
from tpc_hooks.monitoring._generation import StepScores
from tpc_hooks.monitoring._requests import RequestScores
from tpc_hooks.pooling import POOLINGS

D = 8


def _monitor(pooling, cascade, aggregate="ema"):
    torch.manual_seed(0)
    head = tpc.TPC(D, 3, 2)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
    return tpc.Monitor(
        head,
        "blocks.0.hook_resid_post",
        pooling=pooling,
        cascade=tpc.Cascade(head, 0.1) if cascade else None,
        aggregate=aggregate,
        window=2,
        top_k=2,
    )


def _alone(mon, rows, prompt, steps):
    """StepScores on one request: the prompt in one pass, then one row per pass."""
    ss = StepScores(mon)
    out = [ss.update(rows[None, :prompt], torch.ones(1, prompt))]
    out += [ss.update(rows[None, t : t + 1], torch.ones(1, 1)) for t in range(prompt, prompt + steps - 1)]
    return {f: torch.cat([getattr(r, f) for r in out]) for f in ("probs", "logits", "exit_order", "flops")}


@pytest.mark.parametrize(
    "pooling, cascade, aggregate",
    [
        ("mean", True, "ema"),
        ("max", False, "ema"),
        ("last", True, "ema"),
        ("token", True, "ema"),
        ("token", True, "sctopk"),
    ],
)
def test_interleaved_chunked_requests_score_as_each_alone(pooling, cascade, aggregate):
    mon = _monitor(pooling, cascade, aggregate)
    g = torch.Generator().manual_seed(1)
    a, b, c = (torch.randn(n, D, generator=g) for n in (9, 7, 5))
    rs = RequestScores(mon)
    passes = [
        [("a", a[:3], False), ("b", b[:4], True)],  # a's prompt (5) in two chunks; b's (4) whole
        [("b", b[4:5], True), ("a", a[3:5], True)],  # any order in the flat batch
        [("a", a[5:6], True), ("c", c[:2], True), ("b", b[5:6], True)],  # c joins mid-generation
        [("c", c[2:3], True), ("a", a[6:7], True)],  # b has left
        [("a", a[7:8], True)],
    ]
    seen = {}
    for p in passes:
        ids, res = rs.update(p)
        assert ids == [rid for rid, _, complete in p if complete]
        for rid in ids:
            seen[rid] = seen.get(rid, 0) + 1
    got = rs.take()
    for rid, rows, prompt in (("a", a, 5), ("b", b, 4), ("c", c, 2)):
        want = _alone(mon, rows, prompt, seen[rid])
        torch.testing.assert_close(got[rid]["probs"], want["probs"], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got[rid]["logits"], want["logits"], rtol=1e-6, atol=1e-6)
        assert torch.equal(got[rid]["exit_order"], want["exit_order"])
        assert torch.equal(got[rid]["flops"], want["flops"])
    assert rs.take() == {} and not rs.states


@pytest.mark.parametrize("pooling", ["mean", "token"])
def test_a_preempted_request_computed_again_goes_on_from_where_it_was(pooling):
    """A preempted request is computed again from its first token (prompt + what it generated);
    after restart() its next step scores the whole prefix once, as if nothing happened."""
    mon = _monitor(pooling, False)
    x = torch.randn(8, D, generator=torch.Generator().manual_seed(2))
    rs = RequestScores(mon)
    rs.update([("r", x[:4], True)])
    rs.update([("r", x[4:5], True)])
    rs.restart("r")
    rs.update([("r", x[:6], True)])  # recomputed: prompt + 2 generated tokens, the newest one new
    rs.update([("r", x[6:7], True)])
    got = rs.take()["r"]
    torch.testing.assert_close(got["probs"], _alone(mon, x, 4, 4)["probs"], rtol=1e-6, atol=1e-7)


def test_no_complete_piece_scores_nothing():
    mon = _monitor("mean", False)
    rs = RequestScores(mon)
    assert rs.update([]) == ([], None)
    assert rs.update([("a", torch.randn(3, D), False)]) == ([], None)
    assert rs.steps("a") == 0 and rs.take() == {}


@pytest.mark.parametrize(
    "pooling, aggregate",
    [
        ("mean", None),
        ("max", None),
        ("last", None),
        ("token", "mean"),
        ("token", "max"),
        ("token", "ema"),
        ("token", "rolling"),
        ("token", "sctopk"),
    ],
)
def test_a_request_restored_from_a_kept_block_state_scores_as_one_that_computed_the_prefix(pooling, aggregate):
    """A serving engine keeps each request's state at its block ends (cuts) and starts a request
    whose prefix it finds in its cache from the kept state: every step of the second request
    equals a cold run of it, and mutating the donor afterwards leaves the kept state alone."""
    torch.manual_seed(0)
    head = tpc.TPC(D, 3, 2)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
    mon = tpc.Monitor(
        head,
        "blocks.0.hook_resid_post",
        pooling=pooling,
        cascade=tpc.Cascade(head, 0.1),
        aggregate=aggregate or "rolling",
        window=3,
        skip=2,
        top_k=2,
    )
    g = torch.Generator().manual_seed(2)
    shared, own = torch.randn(8, D, generator=g), torch.randn(6, D, generator=g)
    kept = {}
    donor = RequestScores(mon)
    # the donor computes the 8 shared rows in two chunks (5 + 3) with block ends at 4 and 8, then decodes
    donor.update([("d", shared[:5], False)], cuts=[[4]], keep=lambda r, off, st: kept.__setitem__(4, st))
    donor.update([("d", shared[5:8], True)], cuts=[[3]], keep=lambda r, off, st: kept.__setitem__(8, st))
    donor.update([("d", torch.randn(1, D, generator=g), True)])
    for at in (4, 8):
        rows = torch.cat([shared, own])
        cold = RequestScores(mon)
        cold.update([("x", rows[:10], True)])
        for t in range(10, 14):
            cold.update([("x", rows[t : t + 1], True)])
        warm = RequestScores(mon)
        warm.restore("x", kept[at])
        warm.update([("x", rows[at:10], True)])
        for t in range(10, 14):
            warm.update([("x", rows[t : t + 1], True)])
        want, got = cold.take()["x"], warm.take()["x"]
        torch.testing.assert_close(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
        assert torch.equal(got["exit_order"], want["exit_order"]) and torch.equal(got["flops"], want["flops"])


def test_kept_states_reach_keep_at_their_offsets_in_decode_groups_too():
    mon = _monitor("mean", True)
    rs, got = RequestScores(mon), []
    rs.update([("a", torch.randn(3, D), True), ("b", torch.randn(2, D), True)])
    rs.update(
        [("a", torch.randn(1, D), True), ("b", torch.randn(1, D), True)],
        cuts=[[1], []],
        keep=lambda r, off, st: got.append((r, off)),
    )
    assert got == [("a", 1)]


@pytest.mark.parametrize("how", POOLINGS)
def test_one_new_row_for_many_pools_at_once_is_each_pools_own_update(how):
    """RunningPool.add_rows (a decode step of many requests) against update() on each pool
    alone: the same bits, and the pools go on from there alike."""
    from tpc_hooks.pooling import RunningPool

    g = torch.Generator().manual_seed(3)
    firsts = [torch.randn(1, n, D, generator=g) for n in (3, 1, 5)]
    steps = [torch.randn(3, D, generator=g) for _ in range(4)]
    steps[2][1, 4] = float("nan")  # a non-finite row travels as update() carries it
    together, alone = [RunningPool(how) for _ in firsts], [RunningPool(how) for _ in firsts]
    for pools in (together, alone):
        for p, f in zip(pools, firsts, strict=True):
            p.update(f, torch.ones(1, f.shape[1]))
    for rows in steps:
        got = RunningPool.add_rows(together, rows)
        for j, p in enumerate(alone):
            p.update(rows[j][None, None], torch.ones(1, 1))
        want = torch.cat([p.value() for p in alone])
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
        assert all(
            torch.equal(a.value().nan_to_num(), b.value().nan_to_num()) for a, b in zip(together, alone, strict=True)
        )
        rows.fill_(1e6)  # the engine's buffer, overwritten by its next pass: no pool holds a view of it
        assert all(
            torch.equal(a.value().nan_to_num(), b.value().nan_to_num()) for a, b in zip(together, alone, strict=True)
        )


@pytest.mark.parametrize("pooling", ["mean", "token"])
def test_frozen_packs_score_as_the_checked_ones_and_never_reuse_a_stale_calibration(pooling):
    """A serving worker freezes its own head's packed weights (no version check per step): the
    scores are the checked path's bit for bit, and a step cache made before the freeze (under
    an older calibration) is not trusted."""
    mon = _monitor(pooling, True)
    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(4))
    mon.cascade.step(x[:, 0])  # a step cache under the current calibration
    mon.cascade.temperatures = [t * 2 for t in mon.cascade.temperatures]
    mon.cascade.biases = [b - 0.5 for b in mon.cascade.biases]
    results = {}
    for frozen in (True, False):  # frozen first: the stale cache is there to be (wrongly) trusted
        rs = RequestScores(mon, frozen=frozen)
        rs.update([("a", x[0, :4], True), ("b", x[1, :2], True)])
        for t in range(4, 6):
            rs.update([("a", x[0, t : t + 1], True), ("b", x[1, t - 2 : t - 1], True)])
        results[frozen] = rs.take()
    for rid in ("a", "b"):
        for f in ("probs", "logits", "exit_order", "flops"):
            assert torch.equal(results[True][rid][f], results[False][rid][f])
    from tpc_hooks.head._kernel import forget_packs

    assert not mon.head.__dict__.get("_stream_frozen")  # an unfrozen RequestScores ends a freeze
    RequestScores(mon, frozen=True)
    assert mon.head.__dict__.get("_stream_frozen")
    forget_packs(mon.head)
    assert not mon.head.__dict__.get("_stream_frozen")


def test_an_engine_whose_model_returns_no_residual_stream_is_refused_by_name():
    """vLLM's model class must return intermediate hidden states (SupportsEagle3) or have tpc-hooks'
    subclass that does: otherwise the worker refuses the engine, naming the class and the fix; a
    model that has the interface is asked for exactly the exposed ids."""
    from types import SimpleNamespace

    from tpc_hooks.adapters.vllm import _engine

    class FooForCausalLM(torch.nn.Module):
        pass

    runner = SimpleNamespace(get_model=lambda: FooForCausalLM(), use_aux_hidden_state_outputs=False)
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"vLLM's FooForCausalLM does not return intermediate hidden states .*"
        r"monitor FooForCausalLM through transformers or nnsight",
    ):
        _engine.expose(runner, [3])
    assert runner.use_aux_hidden_state_outputs is False

    class BarForCausalLM(FooForCausalLM):
        def set_aux_hidden_state_layers(self, layers):
            self.asked = layers

    model = BarForCausalLM()
    runner = SimpleNamespace(get_model=lambda: model, use_aux_hidden_state_outputs=False)
    _engine.expose(runner, [7, 3, 7])
    assert model.asked == (3, 7) and runner.use_aux_hidden_state_outputs is True
