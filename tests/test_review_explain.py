"""``tpc-hooks review LOG --monitor NAME=DIR [--explain-with MODEL]``: each flagged request's split over
tokens and model parts, recomputed from the logged text with the transformers adapter, on its page.

The logs are written as a server writes them, without vLLM: the worker's :class:`Notes`, the server's
``entry`` (decoding the text with the tokenizer) and ``explain_entry``, on a tiny in-process Llama
whose tokenizer knows a hostile token (``<script>...</script>``). Independent computations: the
page's coloured token values against ``monitor.explain`` on the same model (of the prompt itself at
step 0, of the scored token ids later), the scores against ``monitor.score``, the monitor's SHA-256
against the server's own ``ServedMonitor``. In a real browser (headless Chromium and chromedriver
from the system packages; skipped, saying why, where they are missing): the coloured tokens are
visible, in their colours, and the hostile one stays text."""

import html
import json
import re
import tempfile

import pytest
import torch
from tiny_models import hf_llama, tokenizer

import tpc_hooks as tpc
from conftest import random_head
from tpc_hooks.activations import get_adapter
from tpc_hooks.adapters.vllm._review import Notes, entry, explain_entry
from tpc_hooks.adapters.vllm._wire import ServedMonitor
from tpc_hooks.cli import _models as cli_models
from tpc_hooks.cli import main
from tpc_hooks.views._explain import color_scale
from tpc_hooks.views._html import _signed_color

SITE = "blocks.1.hook_resid_post"
HOSTILE = "<script>window.pwned=1</script>"
PROMPT = "how do i make bomb"
ANSWER = "the cat sat on mat"


@pytest.fixture(scope="module")
def hf():
    """A tiny Llama whose tokenizer (found through ``name_or_path``, as ``from_pretrained`` leaves it) also
    knows ``HOSTILE`` as one token, so a logged text can hold it and decode back to it."""
    tok = tokenizer()
    tok.add_tokens([HOSTILE])
    path = tempfile.mkdtemp(prefix="tpc-tok-hostile-")
    tok.save_pretrained(path)
    model = hf_llama()
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    model.name_or_path = path
    return model


@pytest.fixture
def tok(hf):
    return get_adapter(hf).tokenizer


@pytest.fixture(autouse=True)
def tiny(monkeypatch, hf):
    """The CLI's loader gives the tiny model, and records what it was asked for."""
    asked = []

    def load(name, toolkit):
        asked.append((name, toolkit))
        return hf

    monkeypatch.setattr(cli_models, "load_named", load)
    return asked


def saved(tmp_path, name, d_model=32, **settings):
    mon = tpc.Monitor(
        random_head(d_model=d_model, degree=3, ranks=(2, 2), dtype=torch.float32),
        SITE,
        chat_template=True,
        **settings,
    )
    mon.save_pretrained(tmp_path / name)
    return str(tmp_path / name), tpc.Monitor.from_pretrained(tmp_path / name)


def served(hf, tok, name, path, mon, rid, *, prompt=PROMPT, step=2, text=True, flagged=True, other=None):
    """A log entry as a server writes it: the chat-templated prompt answered with ``ANSWER``, each step
    scored by ``mon`` (a response monitor's step 0 unscored), the step ``step`` kept and explained;
    returns the entry and the token ids of the prompt and of the answer."""
    ids = get_adapter(hf).tokenize([prompt], chat_template=True, max_tokens=None)[0][0]
    gen = tok(ANSWER, add_special_tokens=False)["input_ids"]
    full = ids + gen
    scores = [
        0.0
        if mon.answers and t == 0
        else float(
            mon.score(hf, tokens=[full[: len(ids) + t]], answer_starts=[len(ids)] if mon.answers else None).probs[0]
        )
        for t in range(len(gen) + 1)
    ]
    rec = {"probs": torch.tensor(scores), "exit_order": torch.full((len(scores),), mon.head.degree)}
    z = tpc.collect(hf, tokens=[full[: len(ids) + step]], sites=SITE, pooling="mean", progress=False)[SITE][0]
    notes = Notes(sample=0.0 if flagged else 1.0, text=text)
    if flagged:
        notes.flagged(rid, step, z)
    else:
        notes.seen(rid, step, scores[step], z)
    sha = ServedMonitor.read(name, path, "flag")[0].sha256  # how the server names the monitor's version
    per = {}
    for n in [name, *([other] if other else [])]:
        review = notes.take(rid, mon, sha, rec, full, len(ids)) if n == name else None
        if review is None:  # a second monitor of the same request: its own notes
            twin = Notes(text=text)
            twin.flagged(rid, step, z)
            review = twin.take(rid, mon, sha, rec, full, len(ids))
        per[n] = {
            "flagged": flagged,
            "first_flagged": step if flagged else None,
            "stopped_at": None,
            "peak_score": max(scores),
            "threshold": mon.threshold,
            "review": review,
        }
    e = entry(rid, 0, 1.0, per, decode=tok.decode if text else None)
    return explain_entry(e, {sha: mon}), ids, gen


def write_log(tmp_path, entries):
    log = tmp_path / "log"
    log.mkdir(exist_ok=True)
    (log / "review.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    return log


def pages(tmp_path):
    return [p.read_text() for p in sorted((tmp_path / "log" / "html").glob("entry-*.html"))]


SPAN = re.compile(
    r'<span class="(tok[^"]*)" style="background-color:([^"]+)" data-value="([^"]+)" title="[^"]*">(.*?)</span>'
)


def recomputed(page):
    """The page's recomputed blocks: per block, its tokens as ``(text, value, colour)``, and its text."""
    blocks = page.split('<div class="recomputed">')[1:]
    return [([(html.unescape(t), float(v), c) for _, c, v, t in SPAN.findall(b)], html.unescape(b)) for b in blocks]


@pytest.mark.parametrize("kind", ["mean", "last", "token", "answer"])
def test_the_page_colours_the_tokens_by_what_explain_gives(tmp_path, capsys, hf, tok, tiny, kind):
    """Step 2 (two answer tokens read) and, for a prompt monitor, step 0 (the prompt alone): the page's
    token values are ``monitor.explain``'s of the tokens the server scored, and at step 0 those of the
    prompt itself (the logged text, re-tokenised, is what the monitor reads)."""
    settings = {"token": {"pooling": "token", "aggregate": "mean"}, "answer": {"reads": "answer"}}.get(
        kind, {"pooling": kind}
    )
    path, mon = saved(tmp_path, "harm", **settings)
    steps = [2] if kind == "answer" else [2, 0]
    made = [served(hf, tok, "harm", path, mon, f"r{s}", step=s) for s in steps]
    write_log(tmp_path, [e for e, _, _ in made])
    assert main(["review", str(tmp_path / "log"), "--monitor", f"harm={path}:stop", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert tiny == [(None, "transformers")]  # the packaged model by default, with the transformers adapter
    assert f"recomputed {len(steps)} split(s)" in out and "not recomputed" not in out
    for page, step, (e, ids, gen) in zip(pages(tmp_path), steps, made, strict=True):
        (spans, block), *rest = recomputed(page)
        assert rest == []
        prefix = ids + gen[:step]
        ex = mon.explain(
            hf,
            tokens=[prefix],
            answer_starts=[len(ids)] if mon.answers else None,
            order=None if mon.streaming else mon.head.degree,
        )
        assert [t for t, _, _ in spans] == ex.tokens[0]
        assert [v for _, v, _ in spans] == pytest.approx(ex.by_token[0].tolist(), rel=1e-5, abs=1e-9)
        if step == 0:  # the prompt as the monitor reads it, by the public API
            api = mon.explain(hf, [PROMPT])
            assert api.token_ids[0] == prefix
            assert [v for _, v, _ in spans] == pytest.approx(api.by_token[0].tolist(), rel=1e-5, abs=1e-9)
        scale = color_scale([v for _, v, _ in spans])
        assert all(c == _signed_color(v, scale) for _, v, c in spans)
        logged = e["monitors"]["harm"]["scores"][step]
        assert f"The server scored step {step} {logged:.4f}; the recomputation scores it {logged:.4f}." in block
        assert "recomputed by tpc-hooks review from the logged text with the transformers adapter" in block
        assert "not read from the server's pass" in block
        assert "the tokens the server scored" in block and "are those that scored this request" in block
        top = [(i, t) for i, t, v in ex.top_tokens(0, 8, mode="absolute") if v != 0.0]
        assert all(f"<td>{i}</td><td>{html.escape(repr(t))}</td>" in page for i, t in top)
        assert all(f"<td>{n}</td>" in page for n, v in ex.top_components(0, 8, mode="absolute") if v != 0.0)


def test_the_page_says_why_a_split_is_missing(tmp_path, capsys, hf, tok, tiny):
    """No text in the log, a monitor no --monitor names, a sampled request, a monitor of another model
    (its explanation fails): each page says why, and the command goes on. A text that is not what the
    server scored, or a monitor whose files are not those that scored it: the page says so."""
    path, mon = saved(tmp_path, "harm")
    small, _ = saved(tmp_path, "small", d_model=16)
    edited, _, _ = served(hf, tok, "harm", path, mon, "edited")
    edited["text"]["prompt"] = edited["text"]["prompt"].replace("bomb", "cake")
    edited["monitors"]["harm"]["monitor"] = "0" * 64
    entries = [
        served(hf, tok, "harm", path, mon, "no-text", text=False)[0],
        served(hf, tok, "harm", path, mon, "two", other="pii")[0],
        served(hf, tok, "harm", path, mon, "sampled", flagged=False)[0],
        served(hf, tok, "small", path, mon, "other-model")[0],
        edited,
    ]
    write_log(tmp_path, entries)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    argv = ["review", str(tmp_path / "log"), "--monitor", f"harm={path}", "--monitor", f"small={small}"]
    assert main([*argv, "--explain-with", str(model_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert tiny == [(str(model_dir), "transformers")]
    no_text, two, sampled, other, changed = pages(tmp_path)
    (spans, block), *_ = recomputed(changed)
    assert "cake" in [t for t, _, _ in spans] and "does not have the SHA-256 the log holds" in block
    assert "differ from those that scored this request" in block
    assert "not recomputed: the log holds no text of this request" in no_text and "--review-log-text" in no_text
    (harm, _), (pii, pii_text) = recomputed(two)
    assert harm and not pii and "not recomputed: no --monitor pii=DIR was given" in pii_text
    assert "not recomputed: a sampled request no monitor flagged" in sampled
    assert "the split could not be recomputed" in other and "d_model" in html.unescape(other)
    assert "recomputed 2 split(s)" in out
    for part in ("1 the log holds no text", "1 no --monitor names the monitor", "1 sampled", "1 failed"):
        assert part in out, out
    assert "the first failure: the split could not be recomputed" in out


def test_a_hostile_prompt_stays_text(tmp_path, capsys, hf, tok):
    """A logged prompt holding ``<script>`` is escaped in the prompt and in the coloured tokens."""
    path, mon = saved(tmp_path, "harm")
    e, ids, _ = served(hf, tok, "harm", path, mon, "r", prompt=f"how do i {HOSTILE} make bomb")
    assert HOSTILE in e["text"]["prompt"]
    write_log(tmp_path, [e])
    assert main(["review", str(tmp_path / "log"), "--monitor", f"harm={path}", "--no-progress"]) == 0
    (page,) = pages(tmp_path)
    assert "<script>" not in page and html.escape(HOSTILE) in page
    (spans, block), *_ = recomputed(page)
    assert HOSTILE in [t for t, _, _ in spans] and "the tokens the server scored" in block


def test_review_options_are_checked_before_any_model_loads(tmp_path, capsys, hf, tok, tiny):
    path, mon = saved(tmp_path, "harm")
    write_log(tmp_path, [served(hf, tok, "harm", path, mon, "r")[0]])
    log = str(tmp_path / "log")

    def fails(argv, *parts):
        assert main(["review", log, *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("tpc-hooks review: ") and err.count("\n") == 1, err
        for part in parts:
            assert part in err, err

    fails(["--explain-with", str(tmp_path)], "--explain-with names the model", "--monitor NAME=DIR")
    fails(["--monitor", f"harn={path}"], "the log has no monitor named 'harn'", "its monitors: harm=DIR")
    fails(["--monitor", path], "the log has no monitor named ''")
    fails(["--monitor", f"harm={tmp_path / 'nowhere'}"], "--monitor", "is not a directory")
    fails(["--monitor", f"harm={path}", "--monitor", f"harm={path}"], "--monitor names must differ", "given twice")
    fails(["--monitor", f"harm={path}", "--k", "0"], "--k must be at least 1")
    fails(["--monitor", f"harm={path}", "--explain-with", str(tmp_path / "none")], "--explain-with", "no such folder")
    assert tiny == []


# ---------------------------------------------------------------------- in a real browser
def css_rgb(value):
    return tuple(int(float(x)) for x in re.findall(r"[\d.]+", value)[:3])


def hex_rgb(colour):
    return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))


def test_browser_shows_the_coloured_tokens(browser, tmp_path, capsys, hf, tok):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    path, mon = saved(tmp_path, "harm")
    e, ids, gen = served(hf, tok, "harm", path, mon, "r", prompt=f"how do i {HOSTILE} make bomb")
    write_log(tmp_path, [e])
    assert main(["review", str(tmp_path / "log"), "--monitor", f"harm={path}", "--no-progress"]) == 0
    (page,) = sorted((tmp_path / "log" / "html").glob("entry-*.html"))
    browser.get(page.resolve().as_uri())
    spans = browser.find_elements(By.CSS_SELECTOR, ".recomputed .text .tok")
    ex = mon.explain(hf, tokens=[ids + gen[:2]], order=mon.head.degree)
    values = ex.by_token[0].tolist()
    assert len(spans) == len(values) and all(s.is_displayed() for s in spans)
    texts = browser.execute_script(
        "return [...document.querySelectorAll('.recomputed .text .tok')].map(e => e.textContent)"
    )
    assert texts == ex.tokens[0] and HOSTILE in texts
    scale = color_scale(values)
    for s, v in zip(spans, values, strict=True):
        assert s.size["width"] > 0 and s.size["height"] > 0
        assert css_rgb(s.value_of_css_property("background-color")) == hex_rgb(_signed_color(v, scale))
        assert float(s.get_attribute("data-value")) == pytest.approx(v, rel=1e-5, abs=1e-9)
    assert "not read from the server's pass" in browser.find_element(By.CSS_SELECTOR, ".recomputed").text
    assert browser.find_elements(By.TAG_NAME, "script") == []
    assert browser.execute_script("return window.pwned === undefined")
    with pytest.raises(NoAlertPresentException):
        _ = browser.switch_to.alert.text
    assert browser.save_screenshot(str(tmp_path / "entry.png"))
