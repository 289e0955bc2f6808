"""The segment top-k objective (``FitConfig.objective="sctopk"``): a per-token head trained on each
sequence's aggregate, as a monitor with ``aggregate="sctopk"`` decides.

Independent computations: :func:`tpc_hooks.pooling.aggregate` (its own float64 loop over segments) for
the sequence logit, a numpy loop for the weighted segment variance, scikit-learn-free BCE by hand,
and the fit's own invariants (degree k leaves truncations < k bit-identical; the probe is kept when
the sequences' validation loss prefers it)."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_streaming import chats
from tiny_models import hf_llama, named, tokenizer

import tpc_hooks
import tpc_hooks as tpc
from tpc_hooks._errors import TPCHooksError
from tpc_hooks.pooling import aggregate
from tpc_hooks.training._engine._rows import Rows
from tpc_hooks.training._engine._segments import (
    SEGVAR_TAU,
    SequenceBatches,
    Sequences,
    segment_top_k,
    segment_variance,
)

SITE = "blocks.1.hook_resid_post"


def _sequence_logits(z, lengths, window, top_k, streamed=False):
    """Each sequence's logit as a monitor decides after its last token, or (``streamed``) the highest
    value its aggregate takes after any token (pooling.aggregate, float64)."""
    out, a = [], 0
    for n in lengths:
        agg = aggregate(z[None, a : a + n].double(), torch.ones(1, n), "sctopk", window=window, top_k=top_k)
        out.append(float(agg[0].max() if streamed else agg[0, -1]))
        a += n
    return torch.tensor(out, dtype=torch.float64)


def _problem(n, seed, d=12):
    """Sequences of 3-50 tokens: a harmful one carries a long run of shifted tokens, a benign one a
    single strongly shifted token (one word)."""
    rng = np.random.default_rng(seed)
    X, y, lengths = [], [], []
    for i in range(n):
        label, t = i % 2, int(rng.integers(3, 50))
        z = rng.normal(size=(t, d))
        at = int(rng.integers(0, t))
        if label:
            z[at : at + 20, 0] += 1.5
        else:
            z[at, 0] += 4.0
        X.append(z)
        y += [label] * t
        lengths.append(t)
    return np.concatenate(X).astype(np.float32), np.array(y), lengths


SETTINGS = [(16, 8), (3, 2), (1, 1), (4, 50)]


@pytest.mark.parametrize(("window", "top_k"), SETTINGS)
def test_the_sequence_logit_is_the_aggregate_after_its_last_token(window, top_k):
    g = torch.Generator().manual_seed(window * 100 + top_k)
    lengths = [1, window - 1 or 1, window, window + 1, 2 * window + 3, 60, 7]
    z = torch.randn(sum(lengths), generator=g, dtype=torch.float64)
    got = segment_top_k(z, torch.tensor(lengths), window, top_k)
    torch.testing.assert_close(got, _sequence_logits(z, lengths, window, top_k), rtol=1e-12, atol=1e-12)
    # leading dimensions: each row on its own (what the shrinkage grid reads)
    stacked = torch.stack([z, 2 * z - 1, z.flip(0)])
    each = torch.stack([segment_top_k(r, torch.tensor(lengths), window, top_k) for r in stacked])
    torch.testing.assert_close(segment_top_k(stacked, torch.tensor(lengths), window, top_k), each)


@pytest.mark.parametrize(("window", "top_k"), SETTINGS)
def test_the_streamed_logit_is_the_highest_aggregate_over_every_prefix(window, top_k):
    """What a streaming monitor flags on: the aggregate's maximum over the sequence, early prefixes (a
    few tokens' mean) included; it is at least the final aggregate, and the loss trains on it."""
    g = torch.Generator().manual_seed(window * 10 + top_k)
    lengths = [1, 2, window - 1 or 1, window, window + 1, window + top_k, 2 * window + 3, 60, 7]
    z = torch.randn(sum(lengths), generator=g, dtype=torch.float64) * 3
    z[0] = 9.0  # one word at the start: only the streamed logit sees it in a longer sequence
    got = segment_top_k(z, torch.tensor(lengths), window, top_k, streamed=True)
    torch.testing.assert_close(got, _sequence_logits(z, lengths, window, top_k, True), rtol=1e-12, atol=1e-12)
    assert (got >= segment_top_k(z, torch.tensor(lengths), window, top_k) - 1e-12).all()
    y_rows = torch.tensor(np.repeat(np.arange(len(lengths)) % 2, lengths))
    seqs = Sequences(np.array(lengths), y_rows, window, top_k, 0.0, torch.device("cpu"))
    assert seqs.streamed  # the default
    bce = F.binary_cross_entropy_with_logits(got, seqs.y.double())
    torch.testing.assert_close(seqs.loss(z, torch.arange(len(lengths)), torch.tensor(lengths)).double(), bce)


def test_the_loss_adds_the_weighted_segment_variance_of_benign_sequences_only():
    g = torch.Generator().manual_seed(0)
    lengths = [20, 5, 33, 16, 40]
    z = torch.randn(sum(lengths), generator=g, dtype=torch.float64) * 3
    y_rows = torch.tensor(np.repeat([0, 1, 0, 1, 0], lengths))
    seqs = Sequences(np.array(lengths), y_rows, 4, 3, 0.5, torch.device("cpu"), streamed=False)
    assert seqs.y.tolist() == [0, 1, 0, 1, 0]
    by_hand, a = [], 0
    for n in lengths:  # every whole segment's mean, weighted by sigmoid(score / tau)
        s = z[a : a + n].numpy()
        seg = np.array([s[i : i + 4].mean() for i in range(n - 3)])
        w = 1 / (1 + np.exp(-seg / SEGVAR_TAU))
        centre = (w * seg).sum() / w.sum()
        by_hand.append((w * (seg - centre) ** 2).sum() / w.sum())
        a += n
    _, seg, exists = segment_top_k(z, torch.tensor(lengths), 4, 3, scores=True)
    torch.testing.assert_close(segment_variance(seg, exists), torch.tensor(by_hand, dtype=torch.float64))
    ids = torch.arange(5)
    bce = F.binary_cross_entropy_with_logits(_sequence_logits(z, lengths, 4, 3), seqs.y.double())
    expected = bce + 0.5 * np.mean([v * (1 - c) for v, c in zip(by_hand, [0, 1, 0, 1, 0], strict=True)])
    torch.testing.assert_close(seqs.loss(z, ids, torch.tensor(lengths)), expected.double())
    # a sequence with fewer than two segments adds no variance; a chat is harmful when any of its rows is
    mixed = Sequences(np.array([3, 4]), torch.tensor([0, 0, 1, 0, 0, 0, 0]), 4, 3, 0.5, torch.device("cpu"))
    assert mixed.y.tolist() == [1, 0]
    _, seg, exists = segment_top_k(torch.randn(7, generator=g), torch.tensor([3, 4]), 4, 3, scores=True)
    assert segment_variance(seg, exists).tolist() == [0.0, 0.0]


def test_batches_hold_whole_sequences_and_an_epoch_every_sequence_once():
    lengths = np.array([5, 30, 2, 9, 1, 12, 40, 3])
    X = torch.randn(int(lengths.sum()), 3)
    rows = Rows(X)
    rows.std = X
    seqs = Sequences(lengths, torch.zeros(len(X)), 4, 2, 0.0, torch.device("cpu"))
    seen = []
    for xb, ids in SequenceBatches(rows, seqs).batches(None, torch.device("cpu"), 16, torch.Generator().manual_seed(0)):
        size = int(lengths[ids.numpy()].sum())
        assert size <= 16 or len(ids) == 1  # a sequence longer than a batch comes alone
        starts = np.cumsum(lengths) - lengths
        expected = torch.cat([X[starts[i] : starts[i] + lengths[i]] for i in ids.tolist()])
        assert torch.equal(xb, expected)
        seen += ids.tolist()
    assert sorted(seen) == list(range(len(lengths)))


def _val_sequence_loss(head, Xv, yv, lengths, window=16, top_k=8, order=1):
    with torch.no_grad():
        z = head(torch.as_tensor(Xv), order=order).double()
    starts = np.cumsum(lengths) - lengths
    y = torch.tensor(yv[starts], dtype=torch.float64)
    return float(F.binary_cross_entropy_with_logits(_sequence_logits(z, lengths, window, top_k, True), y))


def test_degree_one_starts_from_the_probe_and_keeps_it_unless_the_sequences_prefer_another():
    X, y, L = _problem(160, 0)
    Xv, yv, Lv = _problem(80, 1)
    probe = tpc.fit(X, y, Xv, yv, degree=1, verbose=False)
    seq = tpc.fit(X, y, Xv, yv, degree=1, objective="sctopk", sequences=L, val_sequences=Lv, epochs=8, verbose=False)
    assert seq.history.selected[1]["C"] == probe.history.selected[1]["C"]  # the same probe to start from
    before, after = _val_sequence_loss(probe, Xv, yv, Lv), _val_sequence_loss(seq, Xv, yv, Lv)
    assert math.isclose(seq.history.selected[1]["val_loss"], after, rel_tol=1e-5)
    assert after <= before + 1e-6
    if seq.history.selected[1]["best_epoch"] == -1:
        assert torch.equal(seq.linear, probe.linear)
    else:
        assert after < before


def test_higher_degrees_train_on_the_sequences_and_leave_lower_truncations_bit_identical():
    X, y, L = _problem(160, 2)
    Xv, yv, Lv = _problem(80, 3)
    kw = dict(objective="sctopk", sequences=L, val_sequences=Lv, rank=3, epochs=4, window=4, top_k=3, verbose=False)
    plain = dict(trust_region=False, gate=False)
    one = tpc.fit(X, y, Xv, yv, degree=1, **kw)
    three = tpc.fit(X, y, Xv, yv, degree=3, **kw, **plain)
    two = tpc.fit(X, y, Xv, yv, degree=2, **kw, **plain)
    extended = tpc.fit(X, y, Xv, yv, degree=3, init=two, **kw)
    Z = torch.as_tensor(Xv)
    with torch.no_grad():
        assert torch.equal(one(Z, order=1), three(Z, order=1))
        for k in (1, 2):
            assert torch.equal(two(Z, order=k), extended(Z, order=k))
    for k in (2, 3):  # each degree selected on the validation sequences' loss, its shrinkage scale folded in
        by_hand = _val_sequence_loss(three, Xv, yv, np.array(Lv), 4, 3, order=k)
        assert math.isclose(three.history.selected[k]["val_loss_scaled"], by_hand, rel_tol=1e-4)
    cfg = three.history.config
    assert (cfg.objective, cfg.window, cfg.top_k, cfg.segvar, cfg.streamed) == ("sctopk", 4, 3, 0.01, True)


def test_a_sequence_heads_settings_are_saved_and_other_heads_files_unchanged(tmp_path):
    X, y, L = _problem(60, 4)
    Xv, yv, Lv = _problem(30, 5)
    kw = dict(degree=2, rank=2, epochs=2, verbose=False)
    seq = tpc.fit(X, y, Xv, yv, objective="sctopk", sequences=L, val_sequences=Lv, **kw)
    rows = tpc.fit(X, y, Xv, yv, **kw)
    for head, name in ((seq, "seq"), (rows, "rows")):
        head.save_pretrained(tmp_path / name)
    saved = json.loads((tmp_path / "seq" / "config.json").read_text())["history"]["config"]
    assert (saved["objective"], saved["window"], saved["top_k"], saved["segvar"]) == ("sctopk", 16, 8, 0.01)
    assert saved["streamed"] is True
    assert "objective" not in json.loads((tmp_path / "rows" / "config.json").read_text())["history"]["config"]
    back = tpc.TPC.from_pretrained(tmp_path / "seq")
    assert back.history.config == seq.history.config
    # a record written before streamed existed was trained on each sequence's final aggregate
    del saved["streamed"]
    assert tpc.FitConfig.from_dict(saved).streamed is False


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(sequences=[60]), "sequences and val_sequences are read by objective='sctopk'"),
        (dict(objective="sctopk"), "pass sequences= (rows per training sequence)"),
        (dict(objective="sctopk", sequences=[10, 10], val_sequences=[30]), "sequences counts 20 rows in 2 sequences"),
        (dict(objective="sctopk", sequences=[60, 0], val_sequences=[30]), "non-empty list of positive integers"),
        (dict(objective="sctopk", sequences="60", val_sequences=[30]), "non-empty list of positive integers"),
        (dict(objective="sctopk", sequences=[60], val_sequences=[30], mode="joint"), "needs mode='progressive'"),
        (dict(objective="sctopk", sequences=[60], val_sequences=[30], pairs=[[0, 1]]), "cannot be combined"),
        (dict(objective="sctopk", top_k=0), "top_k must be a positive integer"),
        (dict(objective="sctopk", segvar=-1.0), "segvar must be a finite number >= 0"),
        (dict(objective="segments"), "objective must be one of ['token', 'sctopk']"),
    ],
)
def test_bad_sequences_are_clear_errors(kw, message):
    rng = np.random.default_rng(0)
    X, Xv = rng.normal(size=(60, 4)).astype(np.float32), rng.normal(size=(30, 4)).astype(np.float32)
    y, yv = np.repeat([0, 1], 30), np.repeat([0, 1], 15)
    with pytest.raises(TPCHooksError, match=None) as err:
        tpc.fit(X, y, Xv, yv, degree=2, rank=2, epochs=1, verbose=False, **kw)
    assert message in str(err.value)


HARMFUL = ["how do i make bomb", "steal car fast", "hurt someone now", "make poison", "rob a bank", "hack the mail"]
BENIGN = ["bread recipe", "tell me about weather", "hello world", "write poem", "cake recipe please", "python code"]


def test_train_monitor_with_sctopk_trains_the_sequences_it_decides_on(monkeypatch):
    """Each prompt's tokens after the fixed prefix are one sequence, in order; ``objective="token"``
    keeps the per-token fit; the objective needs the aggregate and the monitor's segments."""
    seen, fit = [], tpc_hooks.training._train.fit

    def spy_fit(X, y, X_val, y_val, *a, **kw):
        seen.append(dict(n=len(y), n_val=len(y_val), **{k: kw.get(k) for k in ("sequences", "val_sequences")}))
        return fit(X, y, X_val, y_val, *a, **kw)

    monkeypatch.setattr(tpc_hooks.training._train, "fit", spy_fit)
    hf, tok = named(hf_llama()), tokenizer()
    prompts, labels = HARMFUL + BENIGN, [1] * 6 + [0] * 6
    kw = dict(pooling="token", degree=2, rank=2, epochs=2, val_fraction=0.25, target_fpr=0.25, verbose=False)
    mon = tpc.train_monitor(hf, prompts, labels, SITE, aggregate="sctopk", window=2, top_k=2, tokenizer=tok, **kw)
    cfg = mon.head.history.config
    assert (cfg.objective, cfg.window, cfg.top_k) == ("sctopk", 2, 2)
    call = seen[-1]
    assert sum(call["sequences"]) == call["n"] and sum(call["val_sequences"]) == call["n_val"]
    # every prompt is one sequence: its chat's tokens after the fixed prefix
    templated = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True) for p in prompts]
    sizes = sorted(len(c["input_ids"]) - mon.skip for c in templated)
    assert sorted(list(call["sequences"]) + list(call["val_sequences"])) == sizes
    n_val = len(call["val_sequences"])  # the validation prompts
    seen.clear()  # hosted chats: each chat's rows one more sequence, harmful when its request is
    hosted = tpc.train_monitor(
        hf, prompts, labels, SITE, aggregate="sctopk", contexts=chats(8), context_tokens=(24, 40), tokenizer=tok, **kw
    )
    call, report = seen[-1], hosted.report["contexts"]
    assert sum(call["sequences"]) == call["n"] and sum(call["val_sequences"]) == call["n_val"]
    assert len(call["sequences"]) == len(prompts) - n_val + report["n_train"]
    assert len(call["val_sequences"]) == n_val + report["n_val"]
    seen.clear()
    rows = tpc.train_monitor(
        hf, prompts, labels, SITE, aggregate="sctopk", window=2, top_k=2, objective="token", tokenizer=tok, **kw
    )
    assert seen[-1]["sequences"] is None and rows.head.history.config.objective == "token"
    for extra, message in (
        (dict(aggregate="rolling", objective="sctopk"), "it needs pooling='token' and aggregate='sctopk'"),
        (dict(aggregate="sctopk", config=tpc.FitConfig(objective="sctopk", window=3)), "differ from the monitor's"),
    ):
        with pytest.raises(TPCHooksError, match=None) as err:
            tpc.train_monitor(hf, prompts, labels, SITE, tokenizer=tok, **extra, **kw)
        assert message in str(err.value)
