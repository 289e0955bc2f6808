"""HTML views (issue 14, item 5): a generation, a prompt's token scores and an attribution as
static HTML, every token escaped and coloured by its score.

Without a browser: the HTML parsed with Python's ``html.parser`` (each token span's text is the
token, each token once and in order, no element smuggled in by a token), the colours, flags and
marks, the legend's threshold, the saved page. In a real browser (headless Chromium from the
system packages, driven by selenium through the system chromedriver): the tokens, their
computed colours and flag classes, and hostile tokens staying text. The browser tests skip,
saying why, only where no Chromium or chromedriver binary is installed.
"""

import html
import logging
import math
import re
from html.parser import HTMLParser

import pytest
import torch
from tiny_models import hf_llama, named, tiny_head, tokenizer

import tpc_hooks as tpc
from tpc_hooks import views
from tpc_hooks.metrics._rule import flagged as flag_rule
from tpc_hooks.views import HTML, _html, _screenshot, attribution_html, generation_html, score_color, token_scores_html


def prob_rule(p: torch.Tensor, threshold: float) -> torch.Tensor:
    """The flag rule on probabilities alone (a run built by hand carries no decision logits)."""
    return (p >= threshold) | p.isnan()


SITE = "blocks.1.hook_resid_post"
HOSTILE = [
    "<s>",
    " How",
    " do",
    " I",
    " <script>window.pwned = 1; alert(1)</script>",
    ' <img src=x onerror="window.pwned = 2; alert(2)">',
    " \"quoted\" & 'single'",
    "\n",
    "",
    "  ",
    " héllo ✓",
    "&amp;",
    "</span></div>",
    "<!--",
    "\t",
    " bomb",
    ".",
]
SCRIPT, IMG = HOSTILE[4], HOSTILE[5]


class TokenSpans(HTMLParser):
    """Collects the text, classes and attributes of every ``span.tok``, every tag seen, and any
    element opened inside a token span (there must be none)."""

    def __init__(self, content: str):
        super().__init__(convert_charrefs=True)
        self.texts: list[str] = []
        self.attrs: list[dict[str, str]] = []
        self.tags: set[str] = set()
        self.nested: list[str] = []
        self.parents: list[list[str]] = []  # the classes of the enclosing spans of each token
        self._stack: list[str] = []
        self._in = False
        self.feed(content)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        a = {k: v or "" for k, v in attrs}
        if self._in:
            self.nested.append(tag)
        if tag == "span" and "tok" in a.get("class", "").split():
            self._in = True
            self.texts.append("")
            self.attrs.append(a)
            self.parents.append(list(self._stack))
        if tag == "span":
            self._stack.append(a.get("class", ""))

    def handle_endtag(self, tag):
        if tag == "span":
            self._in = False
            self._stack.pop()

    def handle_data(self, data):
        if self._in:
            self.texts[-1] += data

    def classes(self, i: int) -> set[str]:
        return set(self.attrs[i]["class"].split())


class Words:
    """A tokenizer whose token ``i`` decodes to ``words[i]``."""

    def __init__(self, words):
        self.words = list(words)

    def decode(self, ids):
        return "".join(self.words[i] for i in ids)


def hand_run(rows, threshold=0.5):
    """A GenerationRun built by hand: ``rows`` of ``(words, prompt_length, scores, exit_orders, stopped_at)``,
    token ids numbered across all rows (decoded by ``Words`` of the concatenated words)."""
    seqs, start = [], 0
    for words, *_ in rows:
        seqs.append(list(range(start, start + len(words))))
        start += len(words)
    scores = [torch.tensor(s, dtype=torch.float32) for _, _, s, _, _ in rows]
    firsts = []
    for s in scores:
        hits = prob_rule(s, threshold).nonzero().flatten()
        firsts.append(int(hits[0]) if len(hits) else None)
    run = tpc.GenerationRun(
        sequences=seqs,
        prompt_lengths=[pl for _, pl, *_ in rows],
        scores=scores,
        logits=[torch.logit(s) for s in scores],
        exit_orders=[torch.tensor(o) for *_, o, _ in rows],
        flops=[torch.zeros(len(s), dtype=torch.long) for s in scores],
        flagged=[f is not None for f in firsts],
        first_flagged=firsts,
        stopped_at=[st for *_, st in rows],
    )
    return run, Words([w for words, *_ in rows for w in words])


def hostile_run(threshold=0.6):
    """One row: a prompt of 7 hostile tokens, 10 generated (two of them hostile), a NaN step, an
    unscored last token (as Hugging Face generate leaves it), stopped at its first flagged step."""
    words = HOSTILE[:7] + HOSTILE[7:] + [IMG, SCRIPT]
    n_gen = len(words) - 7
    scores = [0.1 + 0.8 * i / n_gen for i in range(n_gen)]  # one fewer than n_gen + 1: the last token is unscored
    scores[3] = float("nan")
    orders = [1 + i % 3 for i in range(n_gen)]
    return hand_run([(words, 7, scores, orders, 3)], threshold)


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))


def background(style: str) -> str:
    return re.fullmatch(r"background-color:(#[0-9a-f]{6})", style).group(1)


# ---------------------------------------------------------------------- escaping, once each, in order
def test_token_scores_html_escapes_every_token_and_shows_each_once():
    res = tpc.Cascade(tiny_head(d_model=16), 0.2)(torch.randn(len(HOSTILE), 16))
    content = str(token_scores_html(HOSTILE, res, threshold=0.5))
    spans = TokenSpans(content)
    assert spans.texts == HOSTILE  # each token once, in order, as its own text
    assert spans.nested == [] and not spans.tags & {"script", "img", "b", "i"}
    for token in (SCRIPT, IMG, "</span></div>", "<!--", "&amp;", " \"quoted\" & 'single'"):
        assert content.count(html.escape(token, quote=True)) == 1
    assert "<script" not in content and "<img" not in content and "<!--" not in content
    assert [int(a["data-order"]) for a in spans.attrs] == res.exit_order.tolist()


def test_generation_html_escapes_every_token_and_greys_the_prompt():
    run, tok = hostile_run()
    content = str(generation_html(run, tokenizer=tok, threshold=0.6))
    spans = TokenSpans(content)
    words = tok.words
    assert spans.texts == words
    assert spans.nested == [] and not spans.tags & {"script", "img"}
    for token in (SCRIPT, IMG):
        assert content.count(html.escape(token, quote=True)) == 2  # once in the prompt, once generated
    in_prompt = ["prompt" in " ".join(p).split() for p in spans.parents]
    assert in_prompt == [True] * 7 + [False] * (len(words) - 7)
    assert all("gen" in spans.classes(i) for i in range(7, len(words)))


def test_control_characters_show_as_control_pictures():
    spans = TokenSpans(str(token_scores_html(["a\x00b", "c\rd", "e\x1bf", "tab\tnl\n"], [0.1] * 4, threshold=0.5)))
    assert spans.texts == ["a\u2400b", "c\u240dd", "e\u241bf", "tab\tnl\n"]


# ---------------------------------------------------------------------- colours, flags, marks
def test_generated_tokens_are_coloured_by_the_score_one_step_later():
    run, tok = hostile_run(threshold=0.6)
    content = str(generation_html(run, tokenizer=tok, threshold=0.6))
    spans = TokenSpans(content)
    scores = run.scores[0].tolist()
    prompt = re.search(
        r'<span class="prompt[^"]*" style="background-color:(#[0-9a-f]{6})"[^>]*title="([^"]*)"', content
    )
    assert prompt and prompt.group(1) == score_color(scores[0], 0.6) and "exit order 1" in prompt.group(2)
    assert "prompt score 0.1000 (exit order 1)" in content
    gen = list(range(7, len(tok.words)))
    for i, j in enumerate(gen[:-1]):  # generated token i: scores[i + 1]
        assert background(spans.attrs[j]["style"]) == score_color(scores[i + 1], 0.6)
        assert int(spans.attrs[j]["data-step"]) == i + 1
        assert int(spans.attrs[j]["data-order"]) == run.exit_orders[0][i + 1]
        assert ("flag" in spans.classes(j)) == bool(prob_rule(torch.tensor(scores[i + 1]), 0.6))
    last = spans.attrs[gen[-1]]
    assert "unscored" in last["class"] and "style" not in last and "data-score" not in last
    assert '<span class="stop" title="the action stopped this row at step 3">stopped</span></div>' in content


def test_nan_scores_render_as_flagged():
    content = str(token_scores_html(["a", "b", "c"], [0.1, float("nan"), 0.2], threshold=0.5))
    spans = TokenSpans(content)
    assert [("flag" in spans.classes(i), "nan" in spans.classes(i)) for i in range(3)] == [
        (False, False),
        (True, True),
        (False, False),
    ]
    assert "first" in spans.classes(1)
    assert background(spans.attrs[1]["style"]) == views.NAN_COLOR
    assert "NaN" in spans.attrs[1]["title"] and "flagged" in spans.attrs[1]["title"]
    run, tok = hand_run([(["p", "q", "r"], 2, [float("nan"), 0.1], [2, 1], None)])
    content = str(generation_html(run, tokenizer=tok, threshold=0.5))
    assert re.search(r'class="prompt flag nan first"', content)
    assert f"background-color:{views.NAN_COLOR}" in content


def test_the_flag_rule_is_the_monitors():
    scores = torch.tensor([0.0, 0.4999, 0.5, 0.51, 1.0, float("nan"), 0.2])
    spans = TokenSpans(str(token_scores_html(list("abcdefg"), scores, threshold=0.5)))
    assert ["flag" in spans.classes(i) for i in range(7)] == prob_rule(scores, 0.5).tolist()
    res = tpc.CascadeResult(
        logits=torch.logit(scores),
        probs=scores,
        exit_order=torch.ones(7, dtype=torch.long),
        flops=torch.ones(7, dtype=torch.long),
        degree=1,
    )  # decision logits: logit(probs)
    spans = TokenSpans(str(token_scores_html(list("abcdefg"), res, threshold=0.5)))
    assert ["flag" in spans.classes(i) for i in range(7)] == flag_rule(res.decision_logits, 0.5).tolist()
    assert [i for i in range(7) if "first" in spans.classes(i)] == [2]


def test_the_legend_shows_the_threshold():
    run, tok = hand_run([(["p", "g"], 1, [0.1, 0.9], [1, 2], None)])
    for view in (token_scores_html(["a"], [0.9], threshold=0.73), generation_html(run, tokenizer=tok, threshold=0.73)):
        legend = re.search(r'<div class="legend">(.*?)</div>', str(view)).group(1)
        assert "threshold 0.73" in re.sub(r"<[^>]+>", "", legend)


def test_score_colour_scale_bends_at_the_threshold():
    for t in (0.01, 0.5, 0.9, 0.0, 1.0):
        redness = [r - b for r, _, b in (rgb(score_color(s, t)) for s in (0.0, t / 2, t, (1 + t) / 2, 1.0))]
        assert redness == sorted(redness)
        for s in (t, (1 + t) / 2, 1.0):  # flagged scores sit on the red side (or the neutral middle)
            r, _, b = rgb(score_color(s, t))
            assert r >= b
    assert score_color(0.5, 0.5) == "#f7f7f7" and score_color(-3, 0.5) == score_color(0, 0.5)
    assert score_color(float("nan"), 0.5) == views.NAN_COLOR


def test_rows_pick_sequences_and_bad_input_says_what_was_expected():
    run, tok = hand_run([(["a", "b"], 1, [0.1, 0.2], [1, 1], None), (["c", "d", "e"], 2, [0.7, 0.8], [2, 3], 1)])
    assert TokenSpans(str(generation_html(run, tokenizer=tok, threshold=0.5, rows=1))).texts == ["c", "d", "e"]
    assert TokenSpans(str(generation_html(run, tokenizer=tok, threshold=0.5))).texts == ["a", "b", "c", "d", "e"]
    with pytest.raises(tpc.TPCHooksError, match=r"rows must index the run's 2 sequences \(0..1\); got 2"):
        generation_html(run, tokenizer=tok, threshold=0.5, rows=[2])
    with pytest.raises(tpc.TPCHooksError, match=r"threshold must be a probability in \[0, 1\]"):
        token_scores_html(["a"], [0.1], threshold=1.5)
    with pytest.raises(tpc.TPCHooksError, match="got 2 tokens, 1 scores"):
        token_scores_html(["a", "b"], [0.1], threshold=0.5)
    bad, tok = hand_run([(["a", "b"], 1, [0.1, 0.2, 0.3], [1, 1, 1], None)])
    with pytest.raises(tpc.TPCHooksError, match="row 0 has 3 scores and 3 exit orders for 1 generated tokens"):
        generation_html(bad, tokenizer=tok, threshold=0.5)


def test_save_writes_a_standalone_utf8_page(tmp_path):
    view = token_scores_html([" héllo ✓", "<b>"], [0.2, 0.9], threshold=0.5)
    assert isinstance(view, HTML) and view._repr_html_() == str(view)
    path = view.save(tmp_path / "sub" / "page.html")
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in page
    assert "script-src" not in page and "default-src 'none'" in page  # no script may run, nothing is fetched
    assert str(view) in page and " héllo ✓" in page and "<title>tpc-hooks: token scores</title>" in page
    assert HTML("x", title="<a & b>").page().count("<title>&lt;a &amp; b&gt;</title>") == 1


# ---------------------------------------------------------------------- attribution
def test_attribution_html_tables_by_order_neurons_and_pairs():
    head = tiny_head(d_model=8, degree=3)
    attr = tpc.attribute(head, torch.randn(7, 8))
    content = str(attribution_html(attr, inputs=[0, 2], k=3, labels=[f"<p{i}>" for i in range(7)]))
    assert content.count('class="row"') == 2 and content.count("<table>") == 6
    assert "&lt;p2&gt;" in content and "<p2>" not in content and "&lt;p1&gt;" not in content
    for v in attr.by_order[2].tolist():
        assert f"{v:+.4f}" in content
    top = attr.top_neurons(3, input=0)
    big = max(abs(v) for _, v in top)
    i, v = top[0]
    assert (
        f'<td>{i}</td><td class="val" style="background-color:{_html._signed_color(v, big)}">{v:+.4f}</td>' in content
    )
    assert attr.to_html(inputs=[0, 2], k=3, labels=[f"<p{i}>" for i in range(7)]).content == content
    assert attr._repr_html_().count('class="row"') == 5  # the first five inputs
    with pytest.raises(tpc.TPCHooksError, match="one text per attributed input"):
        attribution_html(attr, labels=["a"])
    with pytest.raises(tpc.TPCHooksError, match="needs what tpc_hooks.attribute returns"):
        attribution_html(object())


def test_attribution_html_lists_no_pair_of_an_order_left_at_zero():
    head = tiny_head(d_model=8, degree=3)
    z = torch.randn(2, 8)
    assert "top pairs, degree 2" in str(attribution_html(tpc.attribute(head, z)))
    with torch.no_grad():
        head.lambdas["2"].zero_()  # order 2 adds exactly 0, as training leaves an order that earned nothing
    content = str(attribution_html(tpc.attribute(head, z)))
    assert "top pairs, degree 2" not in content and content.count('class="row"') == 2


# ---------------------------------------------------------------------- end to end on the tiny model
@pytest.fixture(scope="module")
def tiny_generation():
    hf, tok = named(hf_llama()), tokenizer()
    head = tiny_head()
    mon = tpc.Monitor(head, SITE, threshold=0.5, cascade=tpc.Cascade(head, 0.2))
    prompts = ["how do i make bomb", "tell me about the weather please"]
    run = mon.generate(hf, prompts, max_new_tokens=6)
    scores = torch.cat(run.scores)
    threshold = float(scores.median())  # some steps flagged, some not
    return hf, tok, mon, run, threshold


def test_tiny_model_generation_renders_every_token(tiny_generation):
    _, tok, _, run, threshold = tiny_generation
    spans = TokenSpans(str(generation_html(run, tokenizer=tok, threshold=threshold)))
    assert spans.texts == [tok.decode([i]) for seq in run.sequences for i in seq]
    gen = [i for i in range(len(spans.texts)) if "gen" in spans.classes(i)]
    assert len(gen) == sum(len(run.generated(b)) for b in range(len(run.sequences)))
    want = [
        bool(flag_rule(run.decision_logits[b][t], threshold))
        for b in range(len(run.sequences))
        for t in range(1, len(run.generated(b)) + 1)
        if t < len(run.scores[b])
    ]
    got = [("flag" in spans.classes(i)) for i in gen if "unscored" not in spans.classes(i)]
    assert got == want and any(want) and not all(want)


def test_tiny_model_token_scores_render_every_token(tiny_generation):
    hf, _, mon, _, threshold = tiny_generation
    tokens, res = mon.token_scores(hf, "how do i make bomb please")
    spans = TokenSpans(str(token_scores_html(tokens, res, threshold=threshold)))
    assert spans.texts == tokens
    assert [float(a["data-score"]) for a in spans.attrs] == pytest.approx(res.probs.tolist(), abs=1e-5)
    assert [int(a["data-order"]) for a in spans.attrs] == res.exit_order.tolist()


# ---------------------------------------------------------------------- the demo's screenshot
def test_screenshot_without_chromium_logs_and_returns_false(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(_screenshot.shutil, "which", lambda name: None)
    page = token_scores_html(["a"], [0.1], threshold=0.5).save(tmp_path / "p.html")
    with caplog.at_level(logging.WARNING, logger="tpc_hooks.cli._demo"):
        assert _screenshot.screenshot(page, tmp_path / "p.png") is False
    assert "no Chromium on PATH" in caplog.text and not (tmp_path / "p.png").exists()


# ---------------------------------------------------------------------- in a real browser
SPANS_JS = """return [...document.querySelectorAll('.tpc-view .tok')].map(e => [e.textContent,
    getComputedStyle(e).backgroundColor, [...e.classList]]);"""


def css_rgb(value: str) -> tuple[int, ...]:
    return tuple(int(float(x)) for x in re.findall(r"[\d.]+", value)[:3])


def assert_nothing_ran(driver):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    assert driver.find_elements(By.TAG_NAME, "script") == [] and driver.find_elements(By.TAG_NAME, "img") == []
    assert driver.execute_script("return window.pwned === undefined")
    with pytest.raises(NoAlertPresentException):
        _ = driver.switch_to.alert.text
    text = driver.find_element(By.CSS_SELECTOR, ".tpc-view").text
    assert "<script>window.pwned = 1; alert(1)</script>" in text and '<img src=x onerror="window.pwned = 2;' in text


def test_browser_shows_the_tokens_their_colours_and_flags(browser, tmp_path):
    run, tok = hostile_run(threshold=0.6)
    page = generation_html(run, tokenizer=tok, threshold=0.6).save(tmp_path / "generation.html")
    browser.get(page.resolve().as_uri())
    spans = browser.execute_script(SPANS_JS)
    assert [text for text, _, _ in spans] == tok.words  # each token once, in order (the newline and tab kept)
    scores = run.scores[0].tolist()
    for i, (_, colour, classes) in enumerate(spans[7:-1]):
        assert css_rgb(colour) == rgb(score_color(scores[i + 1], 0.6))
        assert ("flag" in classes) == (math.isnan(scores[i + 1]) or scores[i + 1] >= 0.6)
    assert css_rgb(spans[-1][1]) == (0, 0, 0) and "unscored" in spans[-1][2]  # transparent: not scored
    prompt = browser.execute_script(
        "return getComputedStyle(document.querySelector('.tpc-view .prompt')).backgroundColor"
    )
    assert css_rgb(prompt) == rgb(score_color(scores[0], 0.6))
    assert_nothing_ran(browser)
    assert browser.save_screenshot(str(tmp_path / "generation.png"))


def test_browser_keeps_hostile_tokens_as_text_without_the_pages_policy(browser, tmp_path):
    """The bare fragment (as Jupyter shows it, with no Content-Security-Policy): escaping alone
    keeps the tokens text."""
    res = tpc.Cascade(tiny_head(d_model=16), 0.2)(torch.randn(len(HOSTILE), 16))
    view = token_scores_html(HOSTILE, res, threshold=0.5)
    path = tmp_path / "fragment.html"
    path.write_text('<!DOCTYPE html><meta charset="utf-8"><body>' + str(view) + "</body>", encoding="utf-8")
    browser.get(path.resolve().as_uri())
    spans = browser.execute_script(SPANS_JS)
    assert [text for text, _, _ in spans] == HOSTILE
    for p, (_, colour, _) in zip(res.probs.tolist(), spans, strict=True):
        assert css_rgb(colour) == rgb(score_color(p, 0.5))
    assert_nothing_ran(browser)


def test_demo_screenshot_of_a_page(browser, tmp_path):
    run, tok = hostile_run()
    page = generation_html(run, tokenizer=tok, threshold=0.6).save(tmp_path / "live_0.html")
    assert _screenshot.screenshot(page, tmp_path / "live_0.png")
    assert (tmp_path / "live_0.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_and_token_scores_render_themselves():
    """The wiring: ``run.to_html()`` / ``_repr_html_`` and ``monitor.token_scores(...)`` (which
    still unpacks as ``(tokens, result)``) give the same pages as the view functions."""
    hf = named(hf_llama())
    mon = tpc.Monitor(tiny_head(), "blocks.1.hook_resid_post", threshold=0.6)
    run = mon.generate(hf, ["how do i make bomb", "hello world"], max_new_tokens=3)
    assert run.threshold == 0.6 and run.tokenizer is not None
    want = views.generation_html(run, tokenizer=run.tokenizer, threshold=0.6)
    assert str(run.to_html()) == str(want) == run._repr_html_()
    ts = mon.token_scores(hf, "how do i make bomb")
    tokens, result = ts
    assert ts.tokens is tokens and ts.result is result and ts.threshold == 0.6
    assert str(ts.to_html()) == str(views.token_scores_html(tokens, result, threshold=0.6)) == ts._repr_html_()
    fields = (
        "sequences",
        "prompt_lengths",
        "scores",
        "logits",
        "exit_orders",
        "flops",
        "flagged",
        "first_flagged",
        "stopped_at",
        "threshold",
        "decision_logits",
    )
    bare = tpc.GenerationRun(**{k: getattr(run, k) for k in fields})
    with pytest.raises(tpc.TPCHooksError, match="pass tokenizer="):
        bare.to_html()
    assert str(bare.to_html(tokenizer=run.tokenizer)) == str(want)
    assert bare._repr_html_().startswith("<pre>")
