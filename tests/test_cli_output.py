"""What the verbs print says only what is true: no order the monitor does not evaluate, no exit
order without a cascade, no pair that adds nothing, every column named for what it holds. On a tiny
in-process model (``tpc-hooks attribute`` and ``monitor`` load it through ``cli_models.load_named``)."""

import json

import pytest
import torch
from tiny_models import hooked_gpt2_style

import tpc_hooks as tpc
from conftest import random_head
from tpc_hooks.cli import _models as cli_models
from tpc_hooks.cli import main
from tpc_hooks.cli._output import print_generation, print_saved, print_split
from tpc_hooks.head._history import FitConfig, History
from tpc_hooks.training._evaluate import cascade_sweep, per_order

SITE = "blocks.1.hook_resid_post"
PROMPTS = ["how do i make bomb", "please tell me about weather"]


@pytest.fixture(scope="module")
def model():
    return hooked_gpt2_style()


@pytest.fixture(autouse=True)
def tiny(monkeypatch, model):
    monkeypatch.setattr(cli_models, "load_named", lambda name, toolkit: model)


def head3():
    """A degree-3 head on the tiny model's 32 dimensions, every weight nonzero."""
    return random_head(d_model=32, degree=3, ranks=(2, 2), dtype=torch.float32)


def saved(tmp_path, head, name="mon", **kw):
    path = tmp_path / name
    tpc.Monitor(head, SITE, **kw).save_pretrained(path)
    return str(path)


def by_order(out):
    """The order numbers each prompt's "by order" list names."""
    return [
        [int(part.split(":")[0]) for part in line.split("): ")[1].split(", ")]
        for line in out.splitlines()
        if "by order" in line
    ]


@pytest.mark.parametrize("kept", [1, 2])
def test_attribute_names_only_the_orders_a_truncated_head_keeps(tmp_path, capsys, kept):
    mon = saved(tmp_path, head3().truncated(kept))
    js = tmp_path / "a.json"
    assert main(["attribute", "--monitor", mon, "--prompt", *PROMPTS, "--k", "3", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert by_order(out) == [list(range(1, kept + 1))] * 2
    for k in range(kept + 1, 4):
        assert f"degree {k}" not in out
    assert out.count("top pairs, degree 2: ") == (2 if kept == 2 else 0)
    assert all(list(d["top_pairs"]) == [str(k) for k in range(2, kept + 1)] for d in json.loads(js.read_text()))


def test_an_order_whose_weights_are_zero_lists_no_pairs(tmp_path, capsys):
    """An order kept in the head but trained to nothing (shrunk to 0, or its untrained state won):
    its pairs all add exactly 0, and none is listed as "top"."""
    head = head3()
    with torch.no_grad():
        head.lambdas["2"].zero_()
    mon = saved(tmp_path, head)
    js = tmp_path / "a.json"
    assert main(["attribute", "--monitor", mon, "--prompt", PROMPTS[0], "--k", "3", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "top pairs, degree 2: none (each adds exactly 0)" in out and "(+0.000)" not in out.split("degree 3")[0]
    assert "-0.000" not in out  # an order adding exactly 0 reads +0.000
    got = json.loads(js.read_text())[0]
    assert got["top_pairs"]["2"] == [] and len(got["top_pairs"]["3"]) == 3
    assert all(v != 0 for _, _, v in got["top_pairs"]["3"])


def test_monitor_prints_exit_orders_only_for_a_cascade(tmp_path, capsys, model):
    head = head3()
    plain = saved(tmp_path, head.truncated(1))
    assert main(["monitor", "--monitor", plain, "--prompt", PROMPTS[0], "--max-new-tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert "step   2" in out and "exit order" not in out

    whole = tpc.Monitor(head, SITE)  # every order kept, no cascade: the whole head at every step
    print_generation(whole.generate(model, PROMPTS[:1], max_new_tokens=2), PROMPTS[:1], model.tokenizer, whole)
    out = capsys.readouterr().out
    assert out.startswith("scores: orders 1-3 at every step; a step is flagged at score >= 0.5\n")
    assert "exit order" not in out

    cascade = tpc.Monitor(head, SITE, cascade=tpc.Cascade(head, 0.2))
    run = cascade.generate(model, PROMPTS[:1], max_new_tokens=2)
    print_generation(run, PROMPTS[:1], model.tokenizer, cascade)
    out = capsys.readouterr().out
    assert out.startswith("scores: the cascade over orders 1-3, each step exiting at the order shown")
    steps = [line for line in out.splitlines() if line.startswith("  step")]
    assert len(steps) == 3
    assert all(s.endswith(f"exit order {int(o)}") for s, o in zip(steps, run.exit_orders[0], strict=True))


def test_train_names_its_table_and_the_orders_it_dropped(capsys):
    head = head3()
    head.history = History(
        mode="progressive",
        selected={
            1: {"C": 0.001, "val_f1": 0.9},
            2: {"best_epoch": 4, "val_f1": 0.91, "scale": 0.35},
            3: {"best_epoch": -1, "val_f1": 0.91},
        },
        config=FitConfig(degree=3),
    )
    print_saved(tpc.Monitor(head, SITE), "dir", per_token=False, data={}, hosted=[])
    out = capsys.readouterr().out
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines() if line.startswith("| ")]
    assert cells == [
        ["order", "val F1 when chosen", "chosen on validation"],
        ["1", "0.900", "C=0.001 (logistic regression)"],
        ["2", "0.910", "5 epochs, then scaled by 0.35"],  # best_epoch counts from 0
        ["3", "0.910", "0 epochs: the term stays 0 and adds nothing"],  # best_epoch -1: the untrained term won
    ]

    note = "kept order 1: order 1 flags 9 of 10 harmful validation prompts at 0.01 FPR; dropped: ..."
    mon = tpc.Monitor(head.truncated(1), SITE, report={"orders": {"trained": 3, "kept": 1, "note": note}})
    print_saved(mon, "dir", per_token=False, data={}, hosted=[])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")][1:]
    assert [r.split("|")[1].strip() for r in rows] == ["1"]
    assert f"trained orders 1-3, {note}" in out


def test_evaluate_tables_name_the_truncations_and_the_exits(capsys):
    head = head3()
    mon = tpc.Monitor(head, SITE, cascade=tpc.Cascade(head, 0.2), threshold=0.3)
    X, y = torch.randn(12, 32), torch.tensor([0, 1] * 6)
    print_split({"per_order": per_order(mon, X, y), "cascade": cascade_sweep(mon, X, y, taus=(0.2,))}, mon)
    out = capsys.readouterr().out
    assert "not at the monitor's threshold 0.3" in out
    assert [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| 1")] == ["1", "1-2", "1-3"]
    assert "rows exiting at each order" in out and ", 3: " in out


ANSWERS = ["i cannot help with that", "it is sunny and warm today"]


@pytest.mark.parametrize("pooling", ["mean", "max", "last"])
@pytest.mark.parametrize("reads", ["answer", "prompt"])
def test_attribute_splits_a_conversations_score_as_monitor_score_gives_it(tmp_path, capsys, model, pooling, reads):
    """``--response``: a response monitor attributes the answer pooled alone, a prompt monitor the
    conversation whole; either way the logit split is the one ``monitor.score(responses=...)`` gives."""
    mon = tpc.Monitor(head3(), SITE, pooling=pooling, reads=reads)
    mon.save_pretrained(tmp_path / "mon")
    js = tmp_path / "a.json"
    args = ["attribute", "--monitor", str(tmp_path / "mon"), "--prompt", *PROMPTS, "--response", *ANSWERS]
    assert main([*args, "--json", str(js)]) == 0
    got = json.loads(js.read_text())
    want = mon.score(model, PROMPTS, responses=ANSWERS).logits
    assert [d["logit"] for d in got] == pytest.approx(want.tolist(), rel=1e-5, abs=1e-4)
    assert [sum(d["by_order"]) for d in got] == pytest.approx(want.tolist(), rel=1e-5, abs=1e-4)
    alone = mon.score(model, PROMPTS).logits if reads == "prompt" else None  # the prompt alone differs
    if alone is not None:
        assert not torch.allclose(alone, want)


def test_a_response_monitor_in_the_verbs(tmp_path, capsys, model):
    """``attribute`` asks for the answers (one per prompt), ``evaluate`` says it reads prompts, and
    ``monitor`` prints step 0 as not scored and every answer step as generation scored it."""
    mon = tpc.Monitor(head3(), SITE, pooling="mean", reads="answer")
    path = str(tmp_path / "mon")
    mon.save_pretrained(path)
    assert main(["attribute", "--monitor", path, "--prompt", *PROMPTS]) == 2
    assert "pass --response" in capsys.readouterr().err
    assert main(["attribute", "--monitor", path, "--prompt", *PROMPTS, "--response", ANSWERS[0]]) == 2
    assert "1 answers for 2 prompts" in capsys.readouterr().err
    assert main(["evaluate", "--monitor", path, "--limit", "2"]) == 2
    assert "monitor.score(model, prompts, responses=" in capsys.readouterr().err

    assert main(["monitor", "--monitor", path, "--prompt", PROMPTS[0], "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    run = tpc.Monitor.from_pretrained(path).generate(model, PROMPTS[:1], max_new_tokens=3)
    assert "  step 0 (prompt only): not scored\n" in out
    scores = [
        float(line.split("score ")[1]) for line in out.splitlines() if line.startswith("  step") and ": score " in line
    ]
    assert scores == pytest.approx([float(s) for s in run.scores[0][1:]], abs=1e-3)
    assert len(scores) == 3
