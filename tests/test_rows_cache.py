"""``train_monitor(rows_cache=...)``: a second call given the same dict runs the model only on the
texts no earlier call read the same way, and trains the monitor it would have trained without it.

What reaches the model is counted by wrapping the collection ``train_monitor`` calls; what a call
needs is the list of texts it builds (prompts, rewrites, flips), read from the same run."""

import numpy as np
import pytest
import torch
from tiny_models import TINY_BENIGN, TINY_HARMFUL, hooked_gpt2_style

import tpc_hooks as tpc
from tpc_hooks.training import _train_monitor

PROMPTS = TINY_HARMFUL + TINY_BENIGN
LABELS = [1] * len(TINY_HARMFUL) + [0] * len(TINY_BENIGN)
SITE = "blocks.1.hook_resid_post"
FAST = dict(degree=2, rank=2, epochs=2, verbose=False)


@pytest.fixture
def watched(monkeypatch):
    """Each call's texts (what it needs) and the texts each collection pass read (what reached the model)."""
    needed: list[list[str]] = []
    read: list[list[str]] = []
    texts, collect = _train_monitor._texts, _train_monitor.collect

    def wanted(r):
        t = texts(r)
        needed.append(list(t.texts))
        return t

    def counted(adapter, part, *a, **kw):
        read.append(list(part))
        return collect(adapter, part, *a, **kw)

    monkeypatch.setattr(_train_monitor, "_texts", wanted)
    monkeypatch.setattr(_train_monitor, "collect", counted)
    return needed, read


def train(model, **kw):
    return tpc.train_monitor(model, PROMPTS, LABELS, SITE, **{**FAST, "seed": 0, **kw})


def same_monitor(a: tpc.Monitor, b: tpc.Monitor) -> None:
    """The same head (every parameter), threshold, site, and report of the orders and the split."""
    sa, sb = a.head.state_dict(), b.head.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name
    assert a.threshold == b.threshold and a.site == b.site
    for key in ("orders", "split", "operating_point", "n_train"):
        assert a.report.get(key) == b.report.get(key), key


def test_a_second_call_reads_only_the_texts_no_earlier_call_read(watched):
    needed, read = watched
    model, cache = hooked_gpt2_style(), {}
    train(model, rows_cache=cache)
    first = set(needed[0])
    assert sorted(t for part in read for t in part) == sorted(first)  # an empty cache reads each text once
    n_read = len(read)
    train(model, rows_cache=cache, seed=1)  # another split: other validation rewrites
    second = {t for part in read[n_read:] for t in part}
    assert second == set(needed[1]) - first
    assert sum(len(part) for part in read[n_read:]) == len(second)  # each missing text once
    assert second  # the test reads something new
    n_read = len(read)
    train(model, rows_cache=cache, seed=1)
    assert len(read) == n_read  # everything cached: the model does not run


def test_the_cache_trains_the_monitor_a_fresh_collection_trains(watched):
    model = hooked_gpt2_style()
    cache: dict = {}
    same_monitor(train(model, rows_cache=cache), train(model))  # an empty cache reads as without one
    # from a partly filled cache: the texts it lacks are batched apart from the others, so compare
    # one prompt a batch (a pooled row is then the same whatever else is read)
    cache = {}
    train(model, rows_cache=cache, batch_size=1)
    n = len(cache)
    kw = dict(seed=1, batch_size=1, val_fraction=0.3)
    same_monitor(train(model, rows_cache=cache, **kw), train(model, **kw))
    assert len(cache) > n


def test_the_cached_rows_are_the_collected_rows():
    model, cache = hooked_gpt2_style(), {}
    train(model, rows_cache=cache, batch_size=1)
    texts = sorted({text for _, text in cache})
    (reading,) = {k[0] for k in cache}
    assert reading.site == SITE and reading.pooling == "mean" and reading.max_tokens == 512
    want = tpc.collect(model, texts, SITE, "mean", batch_size=1, chat_template=reading.chat_template, progress=False)[
        SITE
    ]
    for i, text in enumerate(texts):
        assert torch.equal(cache[reading, text], want[i])


@pytest.mark.parametrize(
    "change",
    [
        {"pooling": "last"},
        {"site": "blocks.2.hook_resid_post"},
        {"max_tokens": 3},
        {"chat_template": False},  # the tiny tokenizer has a template
        {"model": "another instance"},
    ],
    ids=["pooling", "site", "max_tokens", "chat_template", "model"],
)
def test_another_reading_does_not_reuse_rows(watched, change):
    needed, read = watched
    model, cache = hooked_gpt2_style(), {}
    train(model, rows_cache=cache)
    n_read, n_rows = len(read), len(cache)
    change = dict(change)
    other = hooked_gpt2_style() if change.pop("model", None) else model
    site = change.pop("site", SITE)
    tpc.train_monitor(other, PROMPTS, LABELS, site, **{**FAST, "seed": 0, **change}, rows_cache=cache)
    assert sorted(t for part in read[n_read:] for t in part) == sorted(set(needed[1]))  # all read again
    assert len(cache) == n_rows + len(set(needed[1]))  # beside the first reading's rows, not over them


def test_several_sites_are_cached_each(watched):
    needed, read = watched
    model, cache = hooked_gpt2_style(), {}
    sites = [SITE, "blocks.2.hook_resid_post"]
    tpc.train_monitor(model, PROMPTS, LABELS, sites, **FAST, seed=0, rows_cache=cache)
    assert len(cache) == 2 * len(set(needed[0]))
    n_read = len(read)
    train(model, rows_cache=cache)  # one of the two sites: every row is there
    assert len(read) == n_read


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"rows_cache": [], "pooling": "mean"}, "rows_cache must be a dict"),
        ({"rows_cache": "rows", "pooling": "mean"}, "rows_cache must be a dict"),
        ({"rows_cache": {}, "pooling": "token"}, "rows_cache keeps pooled rows"),
    ],
)
def test_bad_rows_cache(kw, message):
    with pytest.raises(tpc.TPCHooksError, match=message):
        tpc.train_monitor(hooked_gpt2_style(), PROMPTS, LABELS, SITE, verbose=False, **kw)


def test_an_sae_is_part_of_the_reading(watched):
    sae_lens = pytest.importorskip("sae_lens")
    needed, read = watched
    model, cache = hooked_gpt2_style(), {}

    def sae(seed):
        torch.manual_seed(seed)
        out = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=32, d_sae=48))
        with torch.no_grad():
            for p in out.parameters():
                p.normal_(0, 0.3)
        return out

    train(model, rows_cache=cache, sae=sae(0))
    n_read = len(read)
    train(model, rows_cache=cache, sae=sae(0))  # the same weights: cached
    assert len(read) == n_read
    train(model, rows_cache=cache, sae=sae(1))  # other weights: read again
    assert sorted(t for part in read[n_read:] for t in part) == sorted(set(needed[2]))
    assert all(np.shape(v) == (48,) for v in cache.values())
