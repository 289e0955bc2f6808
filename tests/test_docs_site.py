"""The built docs site (``make docs``) shows what it promises: every tutorial page holds the
outputs of its executed notebook (printed results, plots, the coloured views) and the
contributing page the picture of the layers.

Runs on a site already built: ``TPC_DOCS_SITE=site python -m pytest tests/test_docs_site.py``
(``make docs`` does); skipped otherwise, since building executes every tutorial at full size."""

import os
import re
from pathlib import Path

import pytest
from test_tutorials import SHOWS, TUTORIALS

SITE = os.environ.get("TPC_DOCS_SITE")
# built from the tutorials' small runs (`make docs TUTORIALS=small`): their monitors train on a few
# prompts, so which requests they flag is checked on the full-size site only
full_size = pytest.mark.skipif(
    os.environ.get("TPC_HOOKS_DOCS_SMALL") == "1", reason="what the monitors flag is checked at full size (make docs)"
)
pytestmark = pytest.mark.skipif(not SITE, reason="set TPC_DOCS_SITE to a site built by `make docs`")

# a fragment of each tutorial's printed output, as its page shows it
PRINTS = {
    "01": "tensor(",
    "02": "order 1: F1",
    "03": "top neurons",
    "04": "scores per step",
    "05": "logit",
    "06": "finish_reason:",
    "07": "= baseline",
}


def page(path: str) -> str:
    return (Path(SITE) / path / "index.html").read_text()


@pytest.mark.parametrize("tutorial", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_pages_show_their_outputs(tutorial):
    html = page(f"tutorials/{tutorial.stem}")
    outputs = html.count("jp-OutputArea-output")
    assert outputs >= 2, f"{tutorial.stem}: {outputs} output areas"
    assert PRINTS[tutorial.stem[:2]] in html
    shows = SHOWS[tutorial.stem[:2]]
    assert ("image/png" in shows) == bool(re.search(r'<img[^>]+src="data:image/png;base64,', html))
    assert ("text/html" in shows) == ('class="tpc-view"' in html)
    assert "In&nbsp;[&nbsp;]" not in html and "In [ ]:" not in html  # no cell left unexecuted


@full_size
def test_the_quickstart_page_shows_the_lock_picking_request_flagged():
    """The first example a user reads: the default monitor, at its own threshold, flags the
    lock-picking request and not the bread recipe."""
    html = page("tutorials/01_quickstart")
    assert re.search(r"FLAGGED\s+\d\.\d{3}\s+How do I pick the lock", html)
    assert re.search(r"\bok\s+\d\.\d{3}\s+How do I bake sourdough bread", html)


def test_the_quickstart_page_shows_the_monitor_beside_the_probe_on_sets_another_hand_built():
    html = page("tutorials/01_quickstart")
    for row in ("probe", "monitor, deployed", "order 1"):
        assert re.search(rf"<td[^>]*>{row}</td>", html), row
    for column in ("counterparts (recall)", "past (recall)", "edgy (flagged)", "sharegpt (flagged)"):
        assert re.search(rf"<th[^>]*>{re.escape(column)}</th>", html), column


def test_the_serving_page_shows_the_servers_answers_and_counters():
    """The server's answers as a client reads them (a finish reason for each), both monitors'
    counters in /metrics, a review-log page."""
    html = page("tutorials/06_serving")
    assert re.search(r"How do I pick the lock.*?\n\s*finish_reason: ", html, re.S)
    for name in ("harm", "intent"):
        assert re.search(
            rf'tpc_hooks_requests_scored_total\{{[^}}]*monitor=(&quot;|"){name}(&quot;|")[^}}]*\}} 2\.0', html
        ), name
    assert 'class="tpc-view"' in html


@full_size
def test_the_serving_page_shows_the_server_stopping_the_lock_picking_request():
    """The lock-picking request stopped by the `harm` monitor, the bread recipe answered."""
    html = page("tutorials/06_serving")
    assert re.search(r"How do I pick the lock.*?\n\s*finish_reason: content_flagged:harm", html, re.S)
    assert re.search(r"How do I bake sourdough bread\?\n\s*finish_reason: (stop|length)", html)


def test_contributing_page_shows_the_layers():
    svg = (Path(SITE) / "contributing" / "layers.svg").read_text()
    assert "head/" in svg and "runs back up" not in svg
    assert "layers.svg" in page("contributing")


def test_home_page_lists_vllm_and_serve():
    html = page("")
    assert "concepts/vllm/" in html and "tpc-hooks serve" in html


API_PAGES = {
    "tpc_hooks": "api/tpc_hooks",
    "tpc_hooks.adapters": "api/adapters",
    "tpc_hooks.baselines": "api/baselines",
    "tpc_hooks.data": "api/data",
    "tpc_hooks.metrics": "api/metrics",
    "tpc_hooks.offline": "api/offline",
    "tpc_hooks.pooling": "api/pooling",
    "tpc_hooks.recipes": "api/recipes",
    "tpc_hooks.synthetic": "api/synthetic",
    "tpc_hooks.views": "api/views",
}


@pytest.mark.parametrize("module", sorted(API_PAGES))
def test_the_api_pages_render_every_documented_public_name(module):
    """Each public module's page has an entry (an anchor) for every class and function of its
    ``__all__`` (constants are described on the concept pages)."""
    import importlib
    import inspect

    mod = importlib.import_module(module)
    html = page(API_PAGES[module])
    documented = [n for n in mod.__all__ if inspect.isclass(getattr(mod, n)) or inspect.isfunction(getattr(mod, n))]
    missing = [n for n in documented if f'id="{module}.{n}"' not in html]  # a name without a docstring has none
    assert documented and missing == [], missing


def test_the_monitor_entry_shows_every_method_wherever_it_is_defined():
    """Monitor's methods from its mixins (generation, calibration) are on its entry, beside its own."""
    html = page(API_PAGES["tpc_hooks"])
    methods = ("score", "explain", "token_scores", "generate", "watch", "stopping_criteria", "logits_processor")
    missing = [m for m in (*methods, "calibrate", "calibrate_activations") if f'id="tpc_hooks.Monitor.{m}"' not in html]
    assert missing == []
