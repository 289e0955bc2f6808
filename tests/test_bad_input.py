"""Bad input that used to end in a traceback from deep inside (or in a silently wrong result) now
gives a TPCHooksError, or a one-line CLI error, that names the fix."""

import json

import pytest
import torch
from tiny_models import hf_llama, tiny_head, tokenizer

import tpc_hooks as tpc
from tpc_hooks.cli import _verbs as cli

SITE = "blocks.1.hook_resid_post"
LONE = "how do i \ud800 make it"  # a lone surrogate: not encodable text


@pytest.fixture(scope="module")
def hf():
    return hf_llama()


@pytest.mark.parametrize("entry", ["score", "calibrate", "generate", "token_scores", "collect", "train_monitor"])
def test_a_lone_surrogate_is_named_in_every_entry_point(hf, entry):
    mon, tok = tpc.Monitor(tiny_head(), SITE), tokenizer()
    call = {
        "score": lambda: mon.score(hf, [LONE], tokenizer=tok),
        "calibrate": lambda: mon.calibrate(hf, ["fine", LONE], tokenizer=tok),
        "generate": lambda: mon.generate(hf, [LONE], tokenizer=tok),
        "token_scores": lambda: mon.token_scores(hf, LONE, tokenizer=tok),
        "collect": lambda: tpc.collect(hf, ["fine", LONE], SITE, tokenizer=tok, progress=False),
        "train_monitor": lambda: tpc.train_monitor(
            hf, [LONE] * 4 + ["fine"] * 4, [1] * 4 + [0] * 4, SITE, tokenizer=tok, verbose=False
        ),
    }[entry]
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"\]\s?is not valid Unicode text: it holds a lone surrogate '\\ud800' "
        r"at position 9; clean it first",
    ):
        call()


@pytest.mark.parametrize("fpr", ["0.1", float("nan"), 1.0, -0.1, True])
def test_calibrate_refuses_a_rate_that_is_not_one_before_any_forward_pass(hf, fpr, monkeypatch):
    mon = tpc.Monitor(tiny_head(), SITE)
    from tpc_hooks.adapters import Adapter

    monkeypatch.setattr(Adapter, "forward_sites", lambda *a, **k: pytest.fail("a forward pass ran"))
    with pytest.raises(tpc.TPCHooksError, match=r"fpr must be a number in \[0, 1\)"):
        mon.calibrate(hf, ["hello world", "the cat"], fpr=fpr, tokenizer=tokenizer())


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(tau=2.0), r"tau must be in \[0, 0\.5\]; got 2\.0"),
        (dict(tau=-0.1), r"tau must be in \[0, 0\.5\]"),
        (dict(target_fpr=1.5), r"target_fpr"),
        (dict(pooling="token", aggregate="median"), r"aggregate"),
        (dict(pooling="token", aggregate="ema", alpha=2.0), r"alpha"),
    ],
)
def test_train_monitor_refuses_a_bad_cascade_or_rate_before_any_forward_pass(hf, bad, message, monkeypatch):
    """The plan (``TrainPlan``: cascade, operating point, recipe) is checked once, before the model
    runs: a bad ``tau`` used to surface only after every prompt was read and the head trained."""
    from tpc_hooks.adapters import Adapter

    monkeypatch.setattr(Adapter, "forward_sites", lambda *a, **k: pytest.fail("a forward pass ran"))
    with pytest.raises(tpc.TPCHooksError, match=message):
        tpc.train_monitor(hf, ["a b c", "d e f"] * 10, [0, 1] * 10, SITE, tokenizer=tokenizer(), verbose=False, **bad)


def test_train_monitors_options_are_the_fields_of_one_object_checked_when_built():
    """``train_monitor``'s options (every parameter but the model, prompts, labels, site and pooling)
    are :class:`TrainOptions`' fields, with the same defaults, in the same order: one object that
    ``train_monitor`` and ``tpc-hooks train`` build, its checks run when it is built."""
    import inspect

    from tpc_hooks.training import TrainOptions
    from tpc_hooks.training._options import OPTIONS

    params = inspect.signature(tpc.train_monitor).parameters
    given = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]
    assert given == list(OPTIONS)
    defaults = inspect.signature(TrainOptions).parameters
    assert {n: params[n].default for n in given} == {n: defaults[n].default for n in given}
    assert [n for n, p in params.items() if p.kind is p.VAR_KEYWORD] == ["fit_kwargs"]
    with pytest.raises(tpc.TPCHooksError, match=r"tau must be in \[0, 0\.5\]"):
        TrainOptions(tau=0.7)
    with pytest.raises(tpc.TPCHooksError, match="unknown setting"):
        TrainOptions(fit={"epoch": 3})
    o = TrainOptions(degree=2, fit={"epochs": 3, "device": "cpu"})
    assert (o.cfg.degree, o.cfg.epochs, o.fit_args) == (2, 3, {"device": "cpu"})


def test_calibrating_on_too_few_benign_inputs_says_so():
    mon = tpc.Monitor(tiny_head(), SITE)
    with pytest.warns(UserWarning, match=r"on 1 benign input\(s\).*calibrate on at least 100 benign inputs"):
        mon.calibrate_activations(torch.randn(1, 32), 0.01)
    assert mon.report["operating_point"]["n_benign"] == 1


@pytest.mark.parametrize("kind", ["stopping_criteria", "logits_processor"])
def test_an_eos_id_outside_the_vocabulary_is_refused_when_made(hf, kind):
    mon = tpc.Monitor(tiny_head(), SITE)
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"eos_token_id \[1000000\] names no token of this model "
        r"\(vocabulary of \d+\)",
    ):
        getattr(mon, kind)(hf, eos_token_id=10**6, tokenizer=tokenizer())


@pytest.mark.parametrize("arg", [None, 3, b"dir"])
def test_from_pretrained_names_what_it_expected(arg):
    with pytest.raises(tpc.TPCHooksError, match="expected a directory saved with save_pretrained or a hub id"):
        tpc.Monitor.from_pretrained(arg)


def _tampered(tmp_path, **changes):
    head = tiny_head()
    tpc.Monitor(head, SITE, cascade=tpc.Cascade(head, 0.1)).save_pretrained(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    for key, value in changes.items():
        where, _, name = key.partition("__")
        (cfg["monitor"] if where == "monitor" else cfg)[name] = value
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    return tmp_path / "m"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"monitor__cascade": [1]}, "monitor.cascade must be an object"),
        ({"monitor__sae": "x"}, "monitor.sae must be an object"),
        ({"monitor__report": 5}, "monitor.report must be an object"),
        ({"monitor__max_tokens": "512"}, "max_tokens must be a positive integer or None"),
        ({"monitor__max_tokens": 0}, "max_tokens must be a positive integer or None"),
        ({"monitor__chat_template": "false"}, "chat_template must be true or false"),
        ({"monitor__prepend_bos": "no"}, "prepend_bos must be true, false or None"),
        ({"monitor__threshold": 2}, r"threshold must be a number in \(0, 1\)"),
        ({"top__history": {"selected": 5}}, "history.selected must be a JSON object"),
        ({"top__history": [1]}, "history must be an object"),
    ],
)
def test_a_saved_config_of_the_wrong_type_is_refused_on_load(tmp_path, changes, message):
    path = _tampered(tmp_path, **changes)
    with pytest.raises(tpc.TPCHooksError, match=message) as err:
        tpc.Monitor.from_pretrained(path)
    assert str(path / "config.json") in str(err.value)


@pytest.mark.parametrize("depth", [40, 100_000])
def test_a_deeply_nested_config_is_refused_on_load(tmp_path, depth):
    path = _tampered(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    text = json.dumps(cfg)
    nested = "[" * depth + "]" * depth
    (path / "config.json").write_text(text[:-1] + ', "deep": ' + nested + "}")
    with pytest.raises(tpc.TPCHooksError, match="nests its JSON"):
        tpc.Monitor.from_pretrained(path)


def test_the_cli_names_a_truncated_shard_in_one_line(tmp_path, capsys):
    rows = torch.randn(8, 32).numpy()
    store = tpc.ActivationStore.create(tmp_path / "acts" / "all" / SITE, 32, meta={"pooling": "mean"})
    store.append(rows)
    (tmp_path / "acts" / "all" / "labels.json").write_text(json.dumps([0, 1] * 4))
    (tmp_path / "acts" / "collect.json").write_text(
        json.dumps({"model": "tiny", "sites": [SITE], "pooling": "mean", "chat_template": False, "max_tokens": 512})
    )
    shard = next((tmp_path / "acts" / "all" / SITE).glob("*.npy"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    assert cli.main(["train", "--acts", str(tmp_path / "acts"), "--out", str(tmp_path / "m"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the shard is truncated or corrupt; delete the store" in err


@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan"])
def test_the_cli_refuses_a_target_rate_before_training(tmp_path, capsys, value, monkeypatch):

    monkeypatch.setattr(cli, "train", lambda *a, **k: pytest.fail("training ran"))
    (tmp_path / "acts").mkdir()
    (tmp_path / "acts" / "collect.json").write_text(
        json.dumps({"model": "tiny", "sites": [SITE], "pooling": "mean", "chat_template": False, "max_tokens": 512})
    )
    assert (
        cli.main(["train", "--acts", str(tmp_path / "acts"), "--out", str(tmp_path / "m"), "--target-fpr", value]) == 2
    )
    assert "--target-fpr must be a number in [0, 1)" in capsys.readouterr().err
