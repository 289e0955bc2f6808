"""``tpc-hooks attribute --by token|component [--heads]``: a prompt's logit split over the tokens the
monitor read and over the model parts that wrote them, printed and written as JSON, on tiny in-process
models (the CLI's model loader is replaced; nothing is downloaded).

Independent computations: what is printed and written against ``monitor.explain`` on the same model
(the same values, the same top tokens and parts), and the split's sum against ``monitor.score``'s
logit (a separate forward pass through another code path): ``baseline + sum(by_token) == logit``."""

import json
import re

import pytest
import torch
from tiny_models import hf_llama, hooked_gpt2_style, named

import tpc_hooks as tpc
from conftest import random_head
from tpc_hooks.cli import _models as cli_models
from tpc_hooks.cli import main

SITE = "blocks.1.hook_resid_post"
PROMPTS = ["how do i make bomb", "please tell me about weather"]
ANSWERS = ["i cannot help with that", "it is sunny and warm today"]
MODELS = {"transformer_lens": hooked_gpt2_style, "transformers": lambda: named(hf_llama())}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return MODELS[request.param]()


@pytest.fixture(autouse=True)
def tiny(monkeypatch, model):
    monkeypatch.setattr(cli_models, "load_named", lambda name, toolkit: model)


def saved(tmp_path, name="mon", **settings):
    """A degree-3 monitor with every weight drawn at random (nonzero), on the tiny models' 32 dimensions."""
    mon = tpc.Monitor(random_head(d_model=32, degree=3, ranks=(2, 2), dtype=torch.float32), SITE, **settings)
    mon.save_pretrained(tmp_path / name)
    return str(tmp_path / name), tpc.Monitor.from_pretrained(tmp_path / name)


def printed_tables(out):
    """Per prompt, its printed tables: ``{"tokens": [[position, token repr, value]], "parts": [[name, value]]}``
    and its score line's numbers."""
    prompts = []
    title = None
    for line in out.splitlines():
        if line.startswith("prompt "):
            prompts.append({})
        elif line.startswith("  score "):
            prompts[-1]["score"] = float(line.split()[1].rstrip(","))
            prompts[-1]["logit"] = float(re.search(r"logit ([-+.\d]+)", line).group(1))
        elif line.startswith("  top tokens"):
            title = "tokens"
        elif line.startswith("  top model parts"):
            title = "parts"
        elif line.startswith("| ") and not line.startswith(("| position", "| model part")):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            prompts[-1].setdefault(title, []).append(cells)
    return prompts


def top(ex, b, k, what):
    """``explain``'s top ``k`` in size, without a part adding exactly 0 (never listed as a top one)."""
    if what == "tokens":
        return [t for t in ex.top_tokens(b, k, mode="absolute") if t[2] != 0.0]
    return [t for t in ex.top_components(b, k, mode="absolute") if t[1] != 0.0]


@pytest.mark.parametrize("pooling", ["mean", "max", "last"])
def test_by_token_and_component_print_and_write_what_explain_gives(tmp_path, capsys, model, pooling):
    path, mon = saved(tmp_path, pooling=pooling, chat_template=True)
    js = tmp_path / "ex.json"
    argv = ["attribute", "--monitor", path, "--prompt", *PROMPTS, "--by", "token", "component", "--k", "4"]
    assert main([*argv, "--json", str(js)]) == 0
    out = capsys.readouterr().out
    ex = mon.explain(model, PROMPTS)
    score = mon.score(model, PROMPTS)  # another pass, another code path
    got = json.loads(js.read_text())
    assert len(got) == 2
    for b, (d, p) in enumerate(zip(got, printed_tables(out), strict=True)):
        assert d["prompt"] == PROMPTS[b] and d["tokens"] == ex.tokens[b] and d["token_ids"] == ex.token_ids[b]
        assert d["logit"] == pytest.approx(float(ex.logit[b]), rel=1e-6)
        assert d["baseline"] == pytest.approx(float(ex.baseline[b]), rel=1e-9)
        assert d["by_token"] == pytest.approx(ex.by_token[b].tolist(), rel=1e-9, abs=1e-12)
        assert d["by_component"] == pytest.approx(ex.by_component[b].tolist(), rel=1e-9, abs=1e-12)
        assert d["components"] == ex.components and d["pooled"] == ex.pooled[b].tolist()
        assert d["score"] == pytest.approx(float(score.probs[b]), rel=1e-5)
        assert d["flagged"] == bool(score.flagged[b]) and d["threshold"] == pytest.approx(mon.threshold)
        # the split sums to the logit monitor.score gives (float64 parts of the float32 score)
        for split in ("by_token", "by_component"):
            assert d["baseline"] + sum(d[split]) == pytest.approx(float(score.logits[b]), rel=1e-4, abs=1e-4)
        want_tokens, want_parts = top(ex, b, 4, "tokens"), top(ex, b, 4, "parts")
        assert [tuple(t) for t in d["top_tokens"]] == pytest.approx(want_tokens)
        assert [tuple(t) for t in d["top_components"]] == pytest.approx(want_parts)
        # printed: the same rows, in the same order, to the printed precision
        assert [[int(i), t] for i, t, _ in p["tokens"]] == [[i, repr(t)] for i, t, _ in want_tokens]
        assert [float(v) for _, _, v in p["tokens"]] == pytest.approx([v for _, _, v in want_tokens], abs=6e-4)
        assert [n for n, _ in p["parts"]] == [n for n, _ in want_parts]
        assert [float(v) for _, v in p["parts"]] == pytest.approx([v for _, v in want_parts], abs=6e-4)
        assert p["score"] == pytest.approx(float(score.probs[b]), abs=6e-4)
        assert p["logit"] == pytest.approx(float(score.logits[b]), abs=6e-4)
    if pooling == "last":  # one token read: one token listed, carrying the whole split
        assert "the last token alone is read" in out
        assert all(len(d["top_tokens"]) == 1 for d in got)
        assert got[0]["top_tokens"][0][2] == pytest.approx(sum(got[0]["by_token"]))


def test_by_one_view_prints_and_writes_that_view_only(tmp_path, capsys):
    path, mon = saved(tmp_path)
    js = tmp_path / "ex.json"
    assert main(["attribute", "--monitor", path, "--prompt", PROMPTS[0], "--by", "component", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "top model parts by size" in out and "top tokens" not in out and "by order" not in out
    d = json.loads(js.read_text())[0]
    assert "by_component" in d and "by_token" not in d and "top_tokens" not in d
    assert main(["attribute", "--monitor", path, "--prompt", PROMPTS[0], "--by", "token", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "top tokens by size" in out and "top model parts" not in out
    assert "by_token" in json.loads(js.read_text())[0] and "by_component" not in json.loads(js.read_text())[0]
    # without --by: the split by order, neuron and pair, as before
    assert main(["attribute", "--monitor", path, "--prompt", PROMPTS[0], "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "by order (order 1 with the bias)" in out and "top neurons" in out and "top tokens" not in out
    assert set(json.loads(js.read_text())[0]) >= {"by_order", "top_neurons", "top_pairs"}


def test_heads_split_attention_by_head(tmp_path, capsys, model):
    path, mon = saved(tmp_path)
    js = tmp_path / "ex.json"
    argv = ["attribute", "--monitor", path, "--prompt", *PROMPTS, "--by", "component", "--heads", "--k", "5"]
    assert main([*argv, "--json", str(js)]) == 0
    out = capsys.readouterr().out
    ex = mon.explain(model, PROMPTS, heads=True)
    got = json.loads(js.read_text())
    assert got[0]["components"] == ex.components and "blocks.0.attn.3" in ex.components
    for b, d in enumerate(got):
        assert d["by_component"] == pytest.approx(ex.by_component[b].tolist(), rel=1e-9, abs=1e-12)
        assert d["baseline"] + sum(d["by_component"]) == pytest.approx(d["logit"], rel=1e-4, abs=1e-4)
    assert [n for n, _ in printed_tables(out)[0]["parts"]] == [n for n, _ in top(ex, 0, 5, "parts")]


def test_a_per_token_monitor_is_split_with_by(tmp_path, capsys, model):
    """``--by`` splits a per-token monitor's aggregate (no refusal); without ``--by`` the refusal names it."""
    path, mon = saved(tmp_path, pooling="token", aggregate="mean")
    js = tmp_path / "ex.json"
    assert main(["attribute", "--monitor", path, "--prompt", *PROMPTS, "--by", "token", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "a per-token monitor: the logit is its mean aggregate after the last token" in out
    ex = mon.explain(model, PROMPTS)
    score = mon.score(model, PROMPTS)
    for b, d in enumerate(json.loads(js.read_text())):
        assert d["by_token"] == pytest.approx(ex.by_token[b].tolist(), rel=1e-9, abs=1e-12)
        assert d["baseline"] + sum(d["by_token"]) == pytest.approx(float(score.logits[b]), rel=1e-4, abs=1e-4)
    assert main(["attribute", "--monitor", path, "--prompt", PROMPTS[0]]) == 2
    err = capsys.readouterr().err
    assert "is a per-token monitor" in err and "--by token component" in err


def test_a_response_monitor_splits_the_conversation(tmp_path, capsys, model):
    path, mon = saved(tmp_path, reads="answer")
    js = tmp_path / "ex.json"
    argv = ["attribute", "--monitor", path, "--prompt", *PROMPTS, "--response", *ANSWERS, "--by", "token"]
    assert main([*argv, "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "a response monitor: it pools the answer's tokens alone" in out
    ex = mon.explain(model, PROMPTS, responses=ANSWERS)
    score = mon.score(model, PROMPTS, responses=ANSWERS)
    for b, d in enumerate(json.loads(js.read_text())):
        assert d["response"] == ANSWERS[b] and d["tokens"] == ex.tokens[b]
        assert d["by_token"] == pytest.approx(ex.by_token[b].tolist(), rel=1e-9, abs=1e-12)
        assert d["baseline"] + sum(d["by_token"]) == pytest.approx(float(score.logits[b]), rel=1e-4, abs=1e-4)
        start = len(d["tokens"]) - sum(d["pooled"])  # the answer's tokens: the pooled ones, at the end
        assert all(not p for p in d["pooled"][:start]) and all(d["pooled"][start:])
        assert all(v == 0.0 for v in d["by_token"][:start])  # the prompt carries nothing directly
        assert all(i >= start for i, _, _ in d["top_tokens"])
    assert main(["attribute", "--monitor", path, "--prompt", *PROMPTS, "--by", "token"]) == 2
    assert "pass --response" in capsys.readouterr().err


def test_bad_input_is_one_clear_line(tmp_path, capsys):
    path, _ = saved(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["attribute", "--monitor", path, "--prompt", PROMPTS[0], "--by", "neuron"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --by: invalid choice: 'neuron'" in err and "'token', 'component'" in err

    def fails(argv, *parts):
        assert main(["attribute", "--monitor", path, "--prompt", PROMPTS[0], *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tpc-hooks attribute: ") and err.count("\n") == 1, err
        for part in parts:
            assert part in err, err

    fails(["--heads"], "--heads splits each attention layer by head", "goes with --by component")
    fails(["--by", "token", "--heads"], "goes with --by component")
    fails(["--by", "token", "--k", "0"], "--k must be at least 1", "got 0")
    fails(["--by", "token", "--json", str(tmp_path)], "is a directory")
