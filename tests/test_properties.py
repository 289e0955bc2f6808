"""Property-based tests (hypothesis; a fixed seed and a bounded number of examples, so CI is
repeatable): the loaders refuse every damaged file with a TPCHooksError, the prompt checks
accept exactly the texts a tokenizer can encode, and the streaming aggregates computed
incrementally, in any chunking and padding, equal the offline ones."""

import json
import math

import pytest
import torch
from tiny_models import tiny_head

import tpc_hooks as tpc
from tpc_hooks.data._split import check_prompts
from tpc_hooks.pooling import RunningAggregate, aggregate

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SITE = "blocks.1.hook_resid_post"
BOUNDED = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    head = tiny_head()
    z = torch.randn(40, 32)
    d = (
        tpc.Monitor(
            head,
            SITE,
            pooling="token",
            aggregate="ema",
            cascade=tpc.Cascade(head, 0.1).calibrate(z, (z[:, 0] > 0).long()),
        )
        .calibrate_activations([z[:7], z[7:20]], 0.1)
        .save_pretrained(tmp_path_factory.mktemp("m") / "m")
    )
    return json.loads((d / "config.json").read_text()), (d / "model.safetensors").read_bytes()


def _paths(cfg, prefix=()):
    """Every key path of the config (the values a damaged file may change)."""
    for k, v in cfg.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _paths(v, prefix + (k,))


@settings(BOUNDED, max_examples=300)
@given(data=st.data())
def test_a_config_with_any_value_changed_loads_valid_or_is_refused(saved, tmp_path, data):
    cfg, weights = json.loads(json.dumps(saved[0])), saved[1]
    path = data.draw(st.sampled_from(sorted(_paths(cfg))))
    where = cfg
    for k in path[:-1]:
        where = where[k]
    where[path[-1]] = data.draw(json_values)
    d = tmp_path / f"c{abs(hash(path))}"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").write_bytes(weights)
    try:
        mon = tpc.Monitor.from_pretrained(d)
    except tpc.TPCHooksError:
        return
    # what loads is usable: settings valid, every policy scores
    assert mon.config == tpc.MonitorConfig.from_dict(mon.config.to_dict())
    z = torch.randn(5, 32)
    for n in range(1, mon.head.degree + 1):
        assert mon.policy(order=n)(z).logits.shape == (5,)
    assert torch.isfinite(mon.policy()(z).logits).all()


@BOUNDED
@given(cut=st.integers(0, 10**6), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=3))
def test_truncated_or_mutated_weights_are_refused(saved, tmp_path, cut, flips):
    cfg, weights = saved
    data = bytearray(weights[: cut % len(weights)] if cut % 3 == 0 else weights)
    for at, x in flips if data else []:
        data[at % len(data)] ^= x
    if bytes(data) == weights:
        return
    d = tmp_path / "w"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(tpc.TPCHooksError):
        tpc.Monitor.from_pretrained(d)


texts = st.text(
    alphabet=st.characters(exclude_categories=()) | st.sampled_from(["\ud800", "\udfff", " ", "a"]), max_size=12
)  # surrogates included
prompt_items = st.one_of(
    texts, st.integers(), st.none(), st.binary(max_size=4), st.lists(st.text(max_size=3), max_size=2)
)


@BOUNDED
@given(prompts=st.one_of(st.lists(prompt_items, max_size=4), st.text(max_size=5), st.integers(), st.none()))
def test_prompt_checks_accept_exactly_encodable_non_empty_texts(prompts):
    try:
        items = check_prompts(prompts)
    except tpc.TPCHooksError:
        ok = (
            isinstance(prompts, list)
            and prompts
            and all(isinstance(p, str) and p.strip() for p in prompts)
            and all(_encodable(p) for p in prompts)
        )
        assert not ok
        return
    assert items == list(prompts) and all(isinstance(p, str) and p.strip() and _encodable(p) for p in items)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@BOUNDED
@given(
    data=st.data(),
    how=st.sampled_from(["mean", "max", "ema", "rolling"]),
    alpha=st.floats(0.05, 1.0),
    window=st.integers(1, 6),
    skip=st.integers(0, 3),
)
def test_streaming_aggregates_incrementally_equal_offline(data, how, alpha, window, skip):
    B = data.draw(st.integers(1, 3))
    lengths = data.draw(st.lists(st.integers(0, 9), min_size=B, max_size=B))
    T = max(lengths + [1])
    side = data.draw(st.sampled_from(["left", "right"]))
    logits = torch.tensor(data.draw(st.lists(st.floats(-30, 30), min_size=B * T, max_size=B * T))).reshape(B, T)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):  # left or right padding
        if n:
            mask[b, T - n :] = 1 if side == "left" else mask[b, T - n :]
            mask[b, :n] = 1 if side == "right" else mask[b, :n]
    want = aggregate(logits.double(), mask, how, alpha, window, skip)
    run, at = RunningAggregate(how, alpha, window, skip), 0
    while at < T:  # the same positions fed in random chunks, as a KV-cached generation feeds them
        n = data.draw(st.integers(1, T - at))
        got = run.update(logits[:, at : at + n].double(), mask[:, at : at + n])
        at += n
        expect = want[:, at - 1]
        for b in range(B):
            if math.isinf(float(expect[b])):
                assert math.isinf(float(got[b])) or math.isnan(float(got[b]))
            else:
                assert float(got[b]) == pytest.approx(float(expect[b]), rel=1e-9, abs=1e-9)
