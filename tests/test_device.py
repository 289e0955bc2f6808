"""The monitor on the model's device (issue 12, item 1), checked on a CPU-only machine.

* The per-step scoring of generation reads nothing back to the host: it runs on tensors of
  the ``meta`` device, where every data-dependent host read (``bool``, ``item``, ``nonzero``,
  boolean indexing, ``tolist``) raises. On a GPU those reads are the synchronisations.
* :meth:`Cascade.step` (every order for every row, exits picked with masks) reports what the
  row-selecting cascade reports, against the offline cascade.
* NaN/inf activations during generation give NaN scores, count as flagged, and warn.
* The decode loops read back at most one bool per step (counted by wrapping the host reads).
* The monitor follows the adapter's device on first use (but not a lazily loaded model's meta one).
"""

import copy
import warnings

import pytest
import torch
from host_reads import HostReads, reads_per_step
from tiny_models import hf_llama, named, tiny_head, tokenizer

import tpc_hooks as tpc
from tpc_hooks.adapters import Adapter
from tpc_hooks.pooling import POOLINGS, RunningPool

SITE = "blocks.1.hook_resid_post"
PROMPTS = ["how do i make bomb", "tell me about the weather please", "hello world", "steal car"]


def bounded_head(seed: int = 0, gate: bool = True, escalate_only: bool = False):
    """A random head with a trust region narrow enough that some rows leave it (so the gate acts)."""
    head = tiny_head(d_model=16, degree=4, seed=seed)
    head.set_bounds(torch.randn(64, 16, generator=torch.Generator().manual_seed(seed + 1)) * 0.5)
    head.gate, head.escalate_only = gate, escalate_only
    return head


def cascades(head):
    yield tpc.Cascade(head, 0.0)
    yield tpc.Cascade(head, 0.2)
    yield tpc.Cascade(head, 0.1).centered(0.8)
    yield tpc.Cascade(head, lower=0.3, upper=0.9, temperatures=[1.5, 0.7, 2.0, 1.1], biases=[0.2, -0.1, 0.3, 0.0])
    yield tpc.Cascade(head, 0.5)


# ---------------------------------------------------------------------- Cascade.step = Cascade.__call__
@pytest.mark.parametrize("gate,escalate_only", [(True, False), (False, False), (True, True)])
def test_cascade_step_reports_what_the_cascade_reports(gate, escalate_only):
    head = bounded_head(gate=gate, escalate_only=escalate_only)
    z = torch.randn(300, 16, generator=torch.Generator().manual_seed(7))
    gated_somewhere = False
    for c in cascades(head):
        want, got = c(z), c.step(z)
        assert torch.equal(got.exit_order, want.exit_order)
        assert torch.equal(got.flops, want.flops)
        assert torch.equal(got.gated, want.gated)
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.probs, want.probs, rtol=1e-5, atol=1e-6)
        gated_somewhere |= bool(want.gated.any())
    assert gated_somewhere == gate  # the trust region was narrow enough to matter
    assert len(set(tpc.Cascade(head, 0.2)(z).exit_order.tolist())) >= 3  # rows exit at several orders


def test_fixed_order_step_equals_the_head():
    head = bounded_head()
    mon = tpc.Monitor(head, SITE)
    z = torch.randn(50, 16)
    for order in (1, 2, 4):
        got = mon._step_policy(order=order)(z)
        torch.testing.assert_close(got.logits, head(z, order=order), rtol=1e-6, atol=1e-6)
        assert torch.equal(got.exit_order, torch.full((50,), order))


def test_non_finite_rows_score_nan_and_leave_the_others_alone():
    head = bounded_head()
    mon = tpc.Monitor(head, SITE, cascade=tpc.Cascade(head, 0.1))
    z = torch.randn(6, 16)
    bad = z.clone()
    bad[1, 3], bad[4, 0] = float("nan"), float("inf")
    for rule in (mon._step_policy(), mon._step_policy(order=2)):
        got, want = rule(bad), rule(z)
        assert got.probs.isnan().tolist() == [False, True, False, False, True, False]
        assert got.logits.isnan().tolist() == got.probs.isnan().tolist()
        ok = ~got.probs.isnan()
        torch.testing.assert_close(got.probs[ok], want.probs[ok], rtol=0, atol=0)
    from tpc_hooks.metrics._rule import flagged

    assert flagged(got.probs, 0.999999)[[1, 4]].all()  # the monitor fails closed
    with pytest.raises(tpc.TPCHooksError, match="NaN/inf"):  # offline scoring still refuses them
        mon.policy()(bad)


# ---------------------------------------------------------------------- the fused per-step kernel
def uneven_head(dtype=torch.float32, bounds=True, gate=True, escalate_only=False):
    """Degree 5 with ranks 3, 6, 1, 4 (the kernel pads them to one width) and, optionally, a
    trust region narrow enough that rows leave it at different degrees."""
    gen = torch.Generator().manual_seed(3)
    head = tpc.TPC(12, 5, [3, 6, 1, 4]).to(dtype)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype) * 0.4)
    if bounds:
        head.set_bounds(torch.randn(40, 12, generator=gen, dtype=dtype) * 0.6)
    head.gate, head.escalate_only = gate, escalate_only
    return head


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "bounds,gate,escalate_only",
    [(False, False, False), (True, False, False), (True, True, False), (True, True, True), (False, False, True)],
)
def test_stream_logits_are_every_truncation_and_where_rows_left(dtype, bounds, gate, escalate_only):
    from tpc_hooks.head import _kernel

    head = uneven_head(dtype, bounds, gate, escalate_only)
    z = torch.randn(200, 12, generator=torch.Generator().manual_seed(4), dtype=dtype)
    zs, _ = _kernel.standardize(head, z)
    for order in range(1, 6):
        got, left = _kernel.stream_logits(head, zs, order)
        want = torch.stack([head(z, order=k) for k in range(1, order + 1)], 1)  # the head's own, order by order
        # rounding only: relative to the size of everything summed (terms cancel on some rows)
        with torch.no_grad():
            size = [1 + (zs @ head.linear).abs() + head.bias.abs()]
            for k in range(2, order + 1):
                size.append(size[-1] + (zs @ head.factors[str(k)]).abs() ** k @ head.lambdas[str(k)].abs())
        eps = torch.finfo(dtype).eps
        assert bool(((got - want).abs() <= 16 * eps * torch.stack(size, 1)).all())
        by_hand = [torch.zeros(200, dtype=torch.bool)] + [  # a projection outside [lo, hi], degree by degree
            ((zs @ head.factors[str(k)] < head.bounds(k)[0]) | (zs @ head.factors[str(k)] > head.bounds(k)[1])).any(1)
            if bounds
            else torch.zeros(200, dtype=torch.bool)
            for k in range(2, order + 1)
        ]
        assert torch.equal(left, torch.stack(by_hand, 1))
    if bounds:
        assert 0 < int(left[:, 1:].any(1).sum()) < 200  # some rows left, some did not


def test_the_packed_weights_follow_every_change_to_the_head():
    """The kernel packs the head's tensors once; an optimiser step, new bounds, a dtype or device
    change must be seen at the next step."""
    from tpc_hooks.head import _kernel

    head = uneven_head()
    z = torch.randn(30, 12)
    rule = tpc.Cascade(head, 0.0).step

    def agrees():
        torch.testing.assert_close(rule(z).logits, head(z), rtol=1e-5, atol=1e-6)

    agrees()
    opt = torch.optim.SGD(head.parameters(), lr=0.5)
    head(z).sum().backward()
    opt.step()  # in place, as fit's optimiser steps are
    agrees()
    head.set_bounds(torch.randn(40, 12) * 0.3)
    agrees()
    with torch.no_grad():
        head.factors["4"] = torch.nn.Parameter(torch.randn(12, 1))  # a new tensor, not an in-place change
    agrees()
    head.clear_bounds()
    agrees()
    head.double()
    got = rule(z.double())
    assert got.logits.dtype == torch.float64
    torch.testing.assert_close(got.logits, head(z.double()), rtol=1e-12, atol=1e-12)
    assert _kernel.stream_logits(head, torch.randn(2, 12, dtype=torch.float64), 5)[0].dtype == torch.float64


def step_kernels(head, batch: int = 4) -> list[str]:
    """The tensor operations one generation step's cascade runs (views, which launch nothing, left out)."""
    from torch.profiler import profile

    rule = tpc.Cascade(head, 0.1).step
    z = torch.randn(batch, head.d_model)
    rule(z)  # the packed weights are built on the first step
    with profile() as prof:
        rule(z)
    views = {
        "view",
        "slice",
        "select",
        "unsqueeze",
        "expand",
        "as_strided",
        "reshape",
        "to",
        "_to_copy",
        "promote_types",
        "alias",
        "detach",
    }
    return [
        name
        for e in prof.events()
        if e.cpu_parent is None and e.name.startswith("aten::") and (name := e.name.removeprefix("aten::")) not in views
    ]


@pytest.mark.parametrize("gate", [False, True])
def test_a_steps_operations_do_not_grow_with_the_degree(gate):
    """Every order in one pass: a degree-8 head launches the same operations per step as a
    degree-2 one (the order-by-order loop launched ~20 more per degree)."""
    ops = []
    for degree in (2, 8):
        head = tiny_head(d_model=16, degree=degree)
        if gate:
            head.set_bounds(torch.randn(64, 16), gate=True)
        ops.append(step_kernels(head))
    assert ops[0] == ops[1]
    assert len(ops[0]) <= 40, ops[0]


# ---------------------------------------------------------------------- no host reads per step
@pytest.mark.parametrize("pooling", POOLINGS)
def test_per_step_scoring_reads_nothing_back(pooling):
    """On the meta device a host read raises; the whole per-step path (pool update, every
    policy, the flag rule) runs there."""
    head = copy.deepcopy(bounded_head()).to("meta")
    mon = tpc.Monitor(head, SITE, pooling=pooling, cascade=tpc.Cascade(head, 0.1))
    from tpc_hooks.metrics._rule import flagged

    with pytest.raises((RuntimeError, NotImplementedError)):  # the premise: meta refuses host reads
        bool(torch.ones(3, device="meta").any())
    pool = RunningPool(pooling)
    for n in (5, 1, 1):
        pool.update(torch.randn(3, n, 16, device="meta"), torch.ones(3, n, dtype=torch.long, device="meta"))
        for rule in (
            mon._step_policy(),
            mon._step_policy(order=3),
            mon._step_policy(cascade=0.2),
            mon._step_policy(cascade=tpc.Cascade(head, lower=0.2, upper=0.7)),
        ):
            res = rule(pool.value())
            hit = flagged(res.probs, 0.7)
            assert res.probs.device.type == "meta" and hit.shape == (3,)


def monitor_on(threshold: float = 0.999999):
    """A monitor that flags nothing on the tiny model (every row generates to the end)."""
    return tpc.Monitor(tiny_head(), SITE, threshold=threshold)


def hf_setup():
    """The tiny model, a monitor that never flags, and ``hf_run(n, **kw)``: greedy HF generate
    of exactly n tokens for the left-padded prompts."""
    hf, tok = named(hf_llama()), tokenizer()
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)

    def hf_run(n, **kw):
        return hf.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)

    return hf, tok, monitor_on(), hf_run


@pytest.mark.parametrize("action", ["flag", "stop"])
def test_monitor_generate_reads_no_more_per_step_than_hf_generate(action):
    hf, _, mon, hf_run = hf_setup()
    mon.generate(hf, PROMPTS, max_new_tokens=2, action=action)  # warm up (tokenizer, first-use moves)
    lengths = []

    def ours(n):
        run = mon.generate(hf, PROMPTS, max_new_tokens=n, action=action, stop_at_eos=False)
        lengths.append({len(s) for s in run.scores})

    monitored, plain = reads_per_step(ours), reads_per_step(hf_run)
    assert lengths == [{5}, {13}]  # nothing flagged, nothing ended
    # the model's own mask check + the loop's "does any row go on?" (HF generate reads its own each step)
    assert monitored == plain == 2.0


def test_unpadded_monitor_generate_reads_as_hf_generate_and_scores_the_same():
    """Prompts of one length: HF generate drops the all-ones mask (so the model checks none per
    step) and so does monitor.generate's loop: one read per step each, the same tokens, and each
    step's score is still the offline score of its prefix."""
    hf = named(hf_llama())
    mon = monitor_on()
    prompts = ["how do i make bomb", "how to make a bomb"]
    ids = torch.tensor(mon.generate(hf, prompts, max_new_tokens=0).sequences)  # the monitor's own tokenisation
    assert ids.shape[0] == 2  # the premise: both prompts have one length, so nothing is padded

    def hf_run(n):
        return hf.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False
        )

    def ours(n):
        return mon.generate(hf, prompts, max_new_tokens=n, stop_at_eos=False)

    mon.generate(hf, prompts, max_new_tokens=2)  # warm up
    assert reads_per_step(ours) == reads_per_step(hf_run) == 1.0
    run, want = ours(6), hf_run(6)
    assert [list(s) for s in run.sequences] == want.tolist()
    for b in range(2):
        for t in (0, 3, 6):
            prefix = run.sequences[b][: run.prompt_lengths[b] + t]
            torch.testing.assert_close(
                torch.as_tensor(run.scores[b][t]).float(),
                mon.score(hf, tokens=[prefix]).probs[0].float(),
                rtol=1e-4,
                atol=1e-5,
            )


@pytest.mark.parametrize("toolkit", ["transformers", "nnsight", "hooked"])
def test_monitor_generate_ends_its_scoring_pass_at_the_site(toolkit):
    """n tokens take n full passes (as HF generate) and one more that stops at the site's layer:
    the last token is scored, and no later layer or LM head runs for it."""
    hf, tok, mon, _ = hf_setup()
    if toolkit == "hooked":
        from tiny_models import hooked_gpt2_style

        model = hooked_gpt2_style()
        layers, head = model.blocks, model.unembed
    else:
        model = hf if toolkit == "transformers" else __import__("nnsight").LanguageModel(hf, tokenizer=tok)
        layers, head = hf.model.layers, hf.lm_head
    calls = {"site": 0, "after": 0, "head": 0}
    site_layer = int(SITE.split(".")[1])
    hooks = [
        layers[site_layer].register_forward_hook(lambda *a: calls.__setitem__("site", calls["site"] + 1)),
        layers[-1].register_forward_hook(lambda *a: calls.__setitem__("after", calls["after"] + 1)),
        head.register_forward_hook(lambda *a: calls.__setitem__("head", calls["head"] + 1)),
    ]
    assert site_layer < len(layers) - 1
    kw = {} if toolkit == "hooked" else {"tokenizer": tok}
    try:
        run = mon.generate(model, PROMPTS, max_new_tokens=5, stop_at_eos=False, **kw)
    finally:
        for h in hooks:
            h.remove()
    assert calls == {"site": 6, "after": 5, "head": 5}
    assert {len(s) for s in run.scores} == {6}  # the prompt and every generated token scored
    for b in range(len(PROMPTS)):  # the last step's score is the offline score of the whole sequence
        offline = mon.score(model, tokens=[run.sequences[b]], **kw).probs[0]
        torch.testing.assert_close(torch.as_tensor(run.scores[b][-1]).float(), offline.float(), rtol=1e-4, atol=1e-5)


def test_stopping_criteria_reads_one_bool_per_step():
    hf, _, mon, hf_run = hf_setup()
    monitored = reads_per_step(lambda n: hf_run(n, stopping_criteria=[mon.stopping_criteria(hf)]))
    # the criterion's one read per step: "does any row go on?" (its hooks are given back when none does)
    assert monitored - reads_per_step(hf_run) == 1.0


def test_watch_reads_nothing_per_step():
    hf, tok, mon, hf_run = hf_setup()

    def watched(n):
        with mon.watch(hf, tokenizer=tok) as log:
            hf_run(n)
        assert len(log) == n

    assert reads_per_step(watched) == reads_per_step(hf_run)  # one read at the end of the block, none per step


# ---------------------------------------------------------------------- NaN during generation
def poison(mon, row: int):
    """Makes the monitor see NaN in ``row``'s activations from the model's first pass on."""
    real = mon._features

    def features(acts):
        acts = real(acts).clone()
        acts[row] = float("nan")
        return acts

    mon._features = features


def test_nan_activations_in_generate_flag_stop_and_warn():
    hf = named(hf_llama())
    mon = monitor_on()
    clean = mon.generate(hf, PROMPTS, max_new_tokens=5, action="stop")
    poison(mon, 2)
    with pytest.warns(RuntimeWarning, match=r"NaN/inf activations at 1 scored step\(s\) \(first: row 2, step 0\)"):
        run = mon.generate(hf, PROMPTS, max_new_tokens=5, action="stop")
    assert run.flagged == [False, False, True, False] and run.stopped_at[2] == 0
    assert run.scores[2].isnan().all() and len(run.scores[2]) == 1
    for b in (0, 1, 3):
        assert run.sequences[b] == clean.sequences[b]
        torch.testing.assert_close(run.scores[b], clean.scores[b], rtol=0, atol=0)


def test_nan_activations_in_hf_generate_stop_that_row_and_warn():
    hf, _, mon, hf_run = hf_setup()
    plain = hf_run(5)
    poison(mon, 1)
    sc = mon.stopping_criteria(hf)
    out = hf_run(5, stopping_criteria=[sc])
    with pytest.warns(RuntimeWarning, match="first: row 1, step 0"):
        assert sc.log.flagged == [False, True, False, False]
    assert sc.log.stopped_at[1] == 0
    for b in (0, 2, 3):
        assert out[b].tolist() == plain[b].tolist()


def test_nan_activations_under_watch_warn_at_the_end():
    hf, tok, mon, hf_run = hf_setup()
    poison(mon, 0)
    with pytest.warns(RuntimeWarning, match=r"monitor.watch: .* in 3 of 3 forward passes"):
        with mon.watch(hf, tokenizer=tok) as log:
            hf_run(3)
    assert all(r.probs[0].isnan() and not r.probs[1:].isnan().any() for r in log.results)


# ---------------------------------------------------------------------- device following
def test_the_monitor_follows_the_adapters_device_but_not_meta(monkeypatch):
    hf = named(hf_llama())
    mon = monitor_on()
    moved = []
    real_to = type(mon.head).to

    def spy(module, *args, **kwargs):
        moved.append(args[0] if args else kwargs.get("device"))
        return real_to(module, *args, **kwargs)

    monkeypatch.setattr(type(mon.head), "to", spy)
    mon.score(hf, PROMPTS[:1])
    assert moved == []  # already there
    monkeypatch.setattr(Adapter, "device", property(lambda self: torch.device("meta")))
    mon._adapter(hf)
    assert moved == [] and mon.head.bias.device.type == "cpu"  # a lazily loaded model: no weights to follow
    monkeypatch.setattr(Adapter, "device", property(lambda self: torch.device("cpu", 0)))
    mon._adapter(hf)
    assert moved == [torch.device("cpu", 0)]


def test_monitor_to_moves_the_head_and_its_cascade():
    head = tiny_head()
    mon = tpc.Monitor(head, SITE, cascade=tpc.Cascade(head, 0.1))
    assert mon.to("cpu") is mon and mon.cascade.head is mon.head
    mon.head.double()  # a float64 head scores float32 steps in float64, as offline
    z = torch.randn(3, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = mon._step_policy()(z)
    assert got.logits.dtype == torch.float64
    torch.testing.assert_close(got.logits, mon.policy()(z).logits, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------- fit: no reads per batch
@pytest.mark.parametrize("settings", [{}, {"dropout": 0.3}, {"consistency": 0.05}])
def test_fit_reads_per_epoch_do_not_grow_with_the_batches(settings):
    """An epoch reads back its loss and its validation scores (what the progress bar shows),
    however many minibatches it has: the shuffle, dropout and consistency draws reach the
    device once per epoch, not per batch."""
    from tpc_hooks.synthetic import make_problem

    X, y = make_problem(n=1200, d_model=16, seed=0)
    if settings.get("consistency"):
        settings = {**settings, "X_unlabelled": torch.randn(200, 16, generator=torch.Generator().manual_seed(1))}

    def reads(epochs: int, batch_size: int) -> int:
        r = HostReads()
        with r.counting():
            tpc.fit(
                X, y, degree=2, rank=4, epochs=epochs, batch_size=batch_size, patience=None, verbose=False, **settings
            )
        return r.count

    per_epoch = {b: reads(5, b) - reads(3, b) for b in (16, 128)}  # 60 vs 8 minibatches an epoch
    assert per_epoch[16] == per_epoch[128] <= 2 * 3  # <= 3 reads per epoch, 2 epochs
