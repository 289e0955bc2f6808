"""Views of tpc-hooks results for people who would rather look than read.

* :func:`generation_html`: a monitored generation (:meth:`tpc_hooks.Monitor.generate`) as
  text with every token coloured by the monitor's score, flagged tokens underlined, the first
  one marked and each token's cascade exit order as a superscript;
* :func:`token_scores_html`: the same for :meth:`tpc_hooks.Monitor.token_scores`;
* :func:`attribution_html`: an :class:`tpc_hooks.Attribution` as small tables (by order, top
  neurons, top pairs) in the same colours;
* :class:`HTML`: what those return; it displays itself in Jupyter and ``save(path)`` writes a
  standalone page;
* :func:`score_color`: the colour scale they share;
* :func:`explanation_html`: an :class:`tpc_hooks.Explanation` (a monitor's logit split over tokens
  and model parts) as tokens coloured by their share, top tables and a layer heatmap;
  :func:`token_spans` colours any tokens by signed values the same way;
* :func:`plot_sweep`: a cascade's F1 against its compute (matplotlib);
* :func:`colored_tokens`: per-token values coloured with circuitsvis (interactive, notebooks);
* :func:`review_html`, :func:`render_review_log`, :func:`review_pages`: a server's review log
  (``tpc-hooks serve --review-log``) as pages: each logged request's steps coloured by score and the
  attribution of the step that flagged it (and, where an entry carries one, its tokens coloured by
  their share of the logit: the split ``tpc-hooks review --monitor`` recomputes), and an index (what
  ``tpc-hooks review LOG`` writes).

:meth:`tpc_hooks.Attribution.plot` draws an attribution (by order and the top pairs).

The HTML views are static HTML and CSS: no script, nothing fetched, no optional dependency,
so a saved page opens offline. Every token goes through :func:`html.escape`, so a prompt
holding ``<script>`` shows as text (checked in headless Chromium by the tests). A saved page
also carries a Content-Security-Policy that forbids scripts and outside resources. The colour
scale is a fixed three-stop interpolation (ColorBrewer's RdBu ends and middle, as in
matplotlib's ``RdBu_r``), bent so that its neutral middle sits at the threshold: blue below,
red above, whatever the threshold.
"""

from ._explain import explanation_html as explanation_html
from ._explain import token_spans as token_spans
from ._html import HTML as HTML
from ._html import NAN_COLOR as NAN_COLOR
from ._html import score_color as score_color
from ._review import FILE as FILE
from ._review import logged_peaks as logged_peaks
from ._review import read_review_log as read_review_log
from ._review import render_review_log as render_review_log
from ._review import review_html as review_html
from ._review import review_pages as review_pages
from ._screenshot import screenshot as screenshot
from ._views import attribution_html as attribution_html
from ._views import colored_tokens as colored_tokens
from ._views import generation_html as generation_html
from ._views import plot_sweep as plot_sweep
from ._views import token_scores_html as token_scores_html

__all__ = [
    "generation_html",
    "token_scores_html",
    "attribution_html",
    "HTML",
    "score_color",
    "NAN_COLOR",
    "plot_sweep",
    "colored_tokens",
    "review_html",
    "render_review_log",
    "explanation_html",
    "token_spans",
]
