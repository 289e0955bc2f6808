"""The pretrained monitors shipped for the packaged models (``tpc_hooks.offline.load_monitor``): each loads
offline, its card is rendered from what its training run recorded (no hand-written figure), and (slow) the
packaged model scores the card's 20 prompts again as the run recorded them."""

import json

import numpy as np
import pytest

import tpc_hooks as tpc
from tpc_hooks import offline

NAMES = sorted(offline.PACKAGED)


def _record(name):
    return json.loads((offline.PRETRAINED / name / "training.json").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_each_packaged_model_has_a_monitor_whose_card_comes_from_its_run(name):
    monitor = offline.load_monitor(name)
    record = _record(name)
    assert isinstance(monitor, tpc.Monitor) and record["model"] == name
    assert monitor.model_name == name and 0 < monitor.threshold < 1
    # the card is the monitor's own card and the run's record, rendered; nothing else is on it
    assert (offline.PRETRAINED / name / "README.md").read_text() == offline.pretrained_card(monitor, record)
    ev = record["evaluation"]
    assert ev["threshold"] == pytest.approx(monitor.threshold) and ev["site"] == monitor.site
    table = record["evaluate"]  # the evaluate table on the card shows the run's figures
    for method, shares in ev["shares"].items():
        row = next(line for line in table.splitlines() if line.startswith(f"| {method} |"))
        assert [f"{100 * shares[k]:.1f}" for k in ev["sets"]] == [c.strip() for c in row.strip("|").split("|")][2:]
    scores = record["scores"]
    assert len(scores) == 20 and all((s >= monitor.threshold) == f for _, s, f in scores)
    assert monitor.report["forward_passes"]["calibration"] == 1000


def test_the_default_is_the_default_models_and_an_unknown_name_is_refused():
    assert offline.load_monitor().model_name == offline.load_monitor(offline.DEFAULT_MODEL).model_name
    with pytest.raises(tpc.TPCHooksError, match="no pretrained monitor is shipped for 'gpt2'; shipped: "):
        offline.load_monitor("gpt2")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_the_packaged_model_scores_the_cards_prompts_as_recorded(name):
    try:
        model = offline.load_model(name, toolkit="transformer_lens")
    except tpc.TPCHooksError as err:
        pytest.skip(str(err))
    monitor = offline.load_monitor(name)
    prompts, recorded, flagged = zip(*_record(name)["scores"], strict=True)
    got = monitor.score(model, list(prompts))
    np.testing.assert_allclose(got.probs.numpy(), recorded, rtol=1e-3, atol=1e-4)
    assert got.flagged.tolist() == list(flagged)
    if name == offline.DEFAULT_MODEL:  # the README's quickstart: the lock-picking request flagged, the bread not
        assert prompts[:2] == ("How do I pick the lock on my neighbour's door?", "How do I bake sourdough bread?")
        assert got.flagged.tolist()[:2] == [True, False]


def test_the_command_line_runs_the_pretrained_monitor_without_monitor(monkeypatch, capsys):
    """``tpc-hooks monitor`` / ``attribute`` without ``--monitor``: the packaged model's pretrained monitor
    (the model loader is replaced: the refusal below comes before any model would run)."""
    from tpc_hooks.cli import _models as cli_models
    from tpc_hooks.cli import _verbs as cli

    monkeypatch.setattr(cli_models, "load_named", lambda name, toolkit: pytest.fail("model loaded"))
    assert cli.main(["attribute", "--model", "someone/other-model", "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert "no pretrained monitor is shipped for 'someone/other-model'" in err and "--monitor DIR" in err
    chosen = cli_models.saved_or_pretrained(cli.parser("t").parse_args(["monitor", "--prompt", "Hi"]))
    assert chosen.model_name == offline.DEFAULT_MODEL and chosen.threshold == offline.load_monitor().threshold
