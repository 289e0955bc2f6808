"""Deprecated names keep working: each warns once per process (a FutureWarning naming the new
name) and gives what the new name gives. ``save`` / ``load``: tests/test_hub.py."""

import warnings

import pytest
import torch
from tiny_models import hf_llama, named, tiny_head, tokenizer

import tpc_hooks as tpc
from tpc_hooks import _errors

SITE = "blocks.1.hook_resid_post"


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(_errors, "_WARNED", set())


def test_last_generate_log_is_last_run(fresh_warnings):
    hf = named(hf_llama())
    mon = tpc.Monitor(tiny_head(), SITE, threshold=0.5)
    tok = tokenizer()
    batch = tok(["hello world", "the cat sat"], return_tensors="pt", padding=True)
    with torch.no_grad():
        hf.generate(
            **batch,
            max_new_tokens=3,
            do_sample=False,
            pad_token_id=0,
            stopping_criteria=[mon.stopping_criteria(hf, tokenizer=tok)],
        )
    assert isinstance(mon.last_run, tpc.GenerationRun) and mon.last_run.steps >= 1
    with pytest.warns(FutureWarning, match=r"Monitor\.last_generate_log is deprecated; use Monitor\.last_run"):
        assert mon.last_generate_log is mon.last_run
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        mon.last_generate_log = None
    assert mon.last_run is None
    monitors = tpc.MonitorSet({"a": mon})
    with pytest.warns(FutureWarning, match=r"MonitorSet\.last_generate_log is deprecated"):
        assert monitors.last_generate_log is None


def test_train_config_moved_to_the_baselines(fresh_warnings):
    from tpc_hooks import baselines

    assert "TrainConfig" not in tpc.__all__ and "TrainConfig" in baselines.__all__
    with pytest.warns(
        FutureWarning, match=r"tpc_hooks\.TrainConfig is deprecated; use tpc_hooks\.baselines\.TrainConfig"
    ):
        assert tpc.TrainConfig is baselines.TrainConfig


def test_the_experimental_fit_options_still_take_their_flat_names(fresh_warnings):
    """``l1``, ``contrast``, ``margin`` and ``decay_growth`` live in ``FitConfig.experimental``: given
    flat they warn once and fit the same head; a head saved with them flat loads them there, and a
    head saves them flat where they were (its saved config is unchanged)."""
    from tpc_hooks.synthetic import make_problem

    X, y = make_problem(n=300, d_model=8, seed=0)
    kw = dict(degree=2, rank=2, epochs=2, seed=0, verbose=False)
    with pytest.warns(FutureWarning, match=r"decay_growth= is deprecated; use experimental=\{'decay_growth': \.\.\.\}"):
        flat = tpc.fit(X[:200], y[:200], X[200:], y[200:], decay_growth=2.0, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = tpc.fit(X[:200], y[:200], X[200:], y[200:], experimental={"decay_growth": 2.0}, **kw)
    assert all(torch.equal(a, b) for a, b in zip(flat.state_dict().values(), new.state_dict().values(), strict=True))
    saved = new.history.config.to_dict()
    assert list(saved)[9:13] == ["patience", "l1", "consistency", "contrast"] and saved["decay_growth"] == 2.0
    assert "experimental" not in saved and tpc.FitConfig.from_dict(saved) == new.history.config
    assert tpc.FitConfig.from_dict({**saved, "margin": 0.1}).experimental["margin"] == 0.1


FAMILIES, KINDS = tpc.data.PHRASING_FAMILIES, tuple(tpc.data.INTENT_KINDS) + ("homonym",)


@pytest.mark.parametrize(
    "name, options, want",
    [
        # what train_monitor(recipe=name, **options) trained on before the presets, written out
        ("default", {}, dict(augment=(), intent=(), prune_orders=True)),
        ("phrasing", {}, dict(augment=FAMILIES, intent=(), prune_orders=True)),
        ("intent", {}, dict(augment=FAMILIES, intent=KINDS, prune_orders=True)),
        ("in_distribution", {}, dict(augment=(), intent=(), prune_orders=True)),
        ("paper", {}, dict(augment=FAMILIES, intent=(), prune_orders=False)),
        ("paper", {"augment": False, "prune_orders": True}, dict(augment=(), intent=(), prune_orders=True)),
        ("default", {"intent": ("homonym",)}, dict(augment=(), intent=("homonym",), prune_orders=True)),
        ("intent", {"augment": ("tense",), "intent": False}, dict(augment=("tense",), intent=(), prune_orders=True)),
    ],
)
def test_a_recipe_string_and_its_options_build_the_preset_and_warn_once(fresh_warnings, name, options, want):
    from tpc_hooks.recipes._recipes import resolve

    kwargs = {**options, "epochs": 2}
    with pytest.warns(FutureWarning) as seen:
        recipe = resolve(name, kwargs)
    assert recipe == tpc.recipes.Recipe(name, **want)
    assert kwargs == {"epochs": 2}  # the recipe's options are taken out of the fit's
    messages = [str(w.message) for w in seen]
    assert f"train_monitor(recipe={name!r}) is deprecated; use train_monitor(recipe=tpc.recipes.{name}())" in messages
    assert all(any(f"train_monitor({k}=...) is deprecated" in m for m in messages) for k in options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert resolve(name, dict(options)) == recipe


def test_the_presets_are_the_recipes_train_monitor_ran_by_name(fresh_warnings):
    """The old string and the preset train the same monitor, bit for bit."""
    from tiny_models import hooked_gpt2_style

    model = hooked_gpt2_style()
    prompts = [
        "how to make a bomb",
        "steal a car fast",
        "hack the bank",
        "poison my neighbour",
        "build a gun now",
        "bread recipe",
        "the weather today",
        "write a poem",
        "python code",
        "hello friend",
    ] * 2
    labels = ([1] * 5 + [0] * 5) * 2
    kw = dict(degree=2, rank=2, epochs=2, val_fraction=0.3, verbose=False, target_fpr=0.25)
    with pytest.warns(FutureWarning):
        old = tpc.train_monitor(model, prompts, labels, SITE, recipe="intent", prune_orders=False, **kw)
    new = tpc.train_monitor(model, prompts, labels, SITE, recipe=tpc.recipes.intent(prune_orders=False), **kw)
    for (_, a), (_, b) in zip(old.head.state_dict().items(), new.head.state_dict().items(), strict=True):
        assert torch.equal(a, b)
    assert old.report == new.report and old.threshold == new.threshold
    assert new.report["recipe"] == "intent" and len(new.report["validation"]["per_order"]) == 2


def test_a_preset_takes_its_own_options_and_fit_config_takes_a_preset():
    from tpc_hooks.recipes._recipes import resolve

    with pytest.raises(tpc.TPCHooksError, match=r"belong to the recipe: pass them to the preset"):
        resolve(tpc.recipes.intent(), {"prune_orders": False})
    with pytest.raises(tpc.TPCHooksError, match=r"recipe must be a preset of tpc.recipes"):
        resolve("robust", {})
    assert tpc.FitConfig(recipe=tpc.recipes.paper()) == tpc.FitConfig(recipe="paper")
    assert tpc.FitConfig(recipe=tpc.recipes.intent()).recipe == "default"
    assert tpc.FitConfig(recipe=tpc.recipes.paper()).resolved().trust_region is False
    with pytest.raises(tpc.TPCHooksError, match=r"recipe must be a tpc.recipes preset"):
        tpc.FitConfig(recipe="intent")
