"""The ``tpc-hooks`` command line's grammar: one function per verb adds that verb's options.

What each verb does is in ``_verbs``; this module holds only what it accepts, so a
verb's options can be read in one place and its help text stays beside them."""

import argparse

from .. import recipes
from ..monitoring import ACTIONS
from ..pooling import POOLINGS
from ._explain import BY

TOOLKITS = ("transformer_lens", "nnsight", "transformers")


def parser(description: str) -> argparse.ArgumentParser:
    """The parser of every verb but ``serve``'s options."""
    parser = argparse.ArgumentParser(prog="tpc-hooks", description=description)
    sub = parser.add_subparsers(dest="verb", required=True)
    for verb in (_demo, _collect, _train, _evaluate, _monitor, _attribute, _serve, _review):
        verb(sub)
    return parser


def _demo(sub: argparse._SubParsersAction) -> None:
    """``tpc-hooks demo``: the whole pipeline on the offline default (or a model and dataset you name)."""
    p = sub.add_parser("demo", help="collect, train, evaluate, monitor and attribute on the offline default model")
    p.add_argument("--quick", action="store_true", help="a small run for CI (about 3 minutes on 2 CPU cores)")
    p.add_argument("--toolkit", choices=TOOLKITS, default="transformer_lens")
    p.add_argument(
        "--model",
        default=None,
        help="a packaged model (SmolLM2-135M-Instruct, gemma-3-270m), a hub id or a "
        "local folder (default: the packaged SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--layer",
        type=int,
        default=None,
        help="residual-stream layer the monitor reads (default: two thirds up, 20 of SmolLM2's 30)",
    )
    _data_args(p, test_fraction=0.2)
    p.add_argument("--out", help="run directory (default: runs/demo-<timestamp>)")
    p.add_argument(
        "--intent",
        nargs="+",
        metavar="KIND",
        default=None,
        help="train_monitor's intent kinds for the deployed monitor (default: its default; the opt-in "
        "'stated' must be named with the others)",
    )
    p.add_argument(
        "--no-sae",
        action="store_true",
        help="skip the attribution in the features of a small SAE trained on the packaged prompts (trained "
        "once, a few minutes, then cached)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _collect(sub: argparse._SubParsersAction) -> None:
    """``tpc-hooks collect``: activations of a prompt set into resumable stores, with labels."""
    p = sub.add_parser("collect", help="pooled (or per-token) activations of a prompt set into stores, with labels")
    _model_args(p)
    p.add_argument("--out", required=True, help="directory for the stores (resumable)")
    _data_args(p, test_fraction=0.0)
    p.add_argument("--sites", nargs="+", default=["blocks.20.hook_resid_post"])
    p.add_argument(
        "--pooling",
        choices=(*POOLINGS, "token"),
        default="mean",
        help="how each prompt's tokens are pooled; 'token': every token's row (for a per-token monitor)",
    )
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--no-augment",
        action="store_true",
        help="skip the phrasing rewrites of the train and val splits (splits aug and val-<family>)",
    )
    p.add_argument(
        "--no-intent",
        action="store_true",
        help="skip the intent flips of the harmful train and val prompts and the homonym rows (splits flips, "
        "val-intent and homonyms)",
    )
    p.add_argument(
        "--contexts",
        type=int,
        default=None,
        metavar="N",
        help="--pooling token: also N benign ShareGPT chats, each hosting one train or val prompt (splits "
        "ctx-train, ctx-val; a fifth held out), which train then learns from (1000 as measured)",
    )
    p.add_argument(
        "--context-tokens",
        type=int,
        nargs="+",
        default=[512, 1024],
        help="--contexts: the chats' token budgets, used in turn (default 512 1024)",
    )
    p.add_argument("--no-progress", action="store_true")


def _train(sub: argparse._SubParsersAction) -> None:
    """``tpc-hooks train``: a monitor from the stores ``collect`` wrote (the recipe of ``train_monitor``)."""
    p = sub.add_parser("train", help="train a monitor on collected activations")
    p.add_argument("--acts", required=True)
    p.add_argument("--out", required=True, help="directory for the saved monitor")
    p.add_argument(
        "--site",
        default=None,
        help="default: the first collected site; 'auto': the collected site whose linear probe has the best "
        "worst-group recall at 1%% FPR on validation",
    )
    p.add_argument("--degree", type=int, default=5)
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument(
        "--tau",
        type=float,
        default=None,
        help="give the monitor a cascade with this threshold (default: none, as train_monitor; 0.2 as measured)",
    )
    p.add_argument(
        "--no-intent",
        action="store_true",
        help="ignore the intent flips and homonym rows collect wrote (splits flips, val-intent, homonyms)",
    )
    p.add_argument(
        "--keep-all-orders",
        action="store_true",
        help="keep every trained order, even those that add nothing at the operating point on validation "
        "(default: dropped, except with --recipe paper)",
    )
    p.add_argument(
        "--recipe",
        choices=list(recipes.NAMES),
        default="default",
        help="train_monitor's recipes. 'default': the prompts as given, the phrasing rewrites of the "
        "validation prompts only judge the higher orders (never below order 1, the probe); 'phrasing': "
        "train on the rewrites too; 'intent': the rewrites, intent flips and homonym rows collect wrote "
        "(fewer flags on edgy questions, lower recall elsewhere); 'in_distribution': the prompts as given "
        "only; 'paper': the paper's exact recipe (plain polynomial, 50 epochs per degree, last epoch kept)",
    )
    p.add_argument(
        "--everyday",
        nargs="+",
        metavar="SOURCE",
        default=None,
        help="the benign sources (names in the stores' sources.json) the threshold is set on; the others are "
        "reported beside it (default: every benign validation row)",
    )
    p.add_argument(
        "--target-fpr",
        type=float,
        default=0.01,
        help="set the monitor's threshold to flag at most this share of benign validation rows "
        "(default 0.01; the cascade exits around it)",
    )
    p.add_argument(
        "--aggregate",
        choices=("max", "mean", "ema", "rolling", "sctopk"),
        default=None,
        help="per-token stores only: how the monitor aggregates its token scores over time (default rolling, window "
        "16; max with collect --contexts chats)",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="per-token stores, --aggregate ema: the newest token's weight (default 0.1)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=None,
        help="per-token stores, --aggregate rolling: tokens in the mean; sctopk: tokens in a segment (default 16)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="per-token stores, --aggregate sctopk: the best segments averaged, which must agree (default 8)",
    )
    p.add_argument(
        "--objective",
        choices=("token", "sctopk"),
        help="per-token stores: what the head trains on: each token against its prompt's label (token), or each "
        "prompt's segment top-k against it (sctopk: the default with --aggregate sctopk)",
    )
    p.add_argument(
        "--no-contexts",
        action="store_true",
        help="per-token stores: ignore the ctx-train/ctx-val chats collect --contexts wrote",
    )
    p.add_argument(
        "--no-gate", action="store_true", help="keep the trust region but let inputs that leave it use every order"
    )
    p.add_argument(
        "--escalate-only",
        action="store_true",
        help="higher orders may not clear a prompt the linear probe flags (recall >= the linear probe's)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")


def _evaluate(sub: argparse._SubParsersAction) -> None:
    """``tpc-hooks evaluate``: metrics per order and the cascade sweep on collected splits."""
    p = sub.add_parser(
        "evaluate",
        help="a monitor beside a probe trained on its rows, on sets another hand built "
        "(--model); or metrics per order and the cascade sweep on collected splits "
        "(--acts)",
    )
    p.add_argument("--monitor", required=True)
    p.add_argument("--acts", default=None, help="collected splits to measure on (the splits' form)")
    _model_args(p)
    _data_args(p, test_fraction=None)
    p.add_argument("--prompts", dest="dataset", default=argparse.SUPPRESS, help="the same as --dataset")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the seed of the packaged set, or of the split of your --dataset (default: the one the monitor's "
        "split records)",
    )
    p.add_argument(
        "--calibration",
        default=None,
        help="the calibration prompts the monitor was trained with (train_monitor(calibration=...)): a .txt "
        "file, one prompt a line, or a CSV/JSONL with a text column (with --dataset default: drawn as "
        "tpc-hooks demo draws them)",
    )
    p.add_argument("--limit", type=int, default=None, help="at most this many prompts of each set (a quick look)")
    p.add_argument("--out", default=None, help="write the table here: .md or .html (with --model)")
    p.add_argument("--plot", default=None, help="save the recall-vs-rate curves here, e.g. outside.png (with --model)")
    p.add_argument("--splits", nargs="+", default=["test"])
    p.add_argument(
        "--decision",
        choices=("max", "last"),
        default=None,
        help="per-token monitors: a prompt's score is the max of the aggregate over its tokens (default; "
        "what the threshold is calibrated for) or the aggregate after its last token",
    )
    p.add_argument("--json", default=None)


def _monitor(sub: argparse._SubParsersAction) -> None:
    """``tpc-hooks monitor``: generation with live per-step scores."""
    p = sub.add_parser("monitor", help="generate with live per-step scores")
    _model_args(p)
    _monitor_arg(p)
    p.add_argument("--prompt", nargs="+", required=True)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--action", choices=ACTIONS, default="flag")


def _attribute(sub: argparse._SubParsersAction) -> None:
    """``tpc-hooks attribute``: a prompt's decision by order, neuron and neuron pair, or (``--by``) by
    token and model part (:meth:`tpc_hooks.Monitor.explain`)."""
    p = sub.add_parser(
        "attribute",
        help="a prompt's decision by order, neuron and neuron pair, or (--by token|component) by token and "
        "by model part",
    )
    _model_args(p)
    _monitor_arg(p)
    p.add_argument("--prompt", nargs="+", required=True)
    p.add_argument(
        "--response",
        nargs="+",
        default=None,
        help="an answer per --prompt: attribute the conversation (a response monitor, which reads the answer, "
        "needs it; a prompt monitor reads the conversation whole)",
    )
    p.add_argument(
        "--by",
        nargs="+",
        choices=BY,
        default=None,
        metavar="token|component",
        help="split the monitor's logit exactly, as monitor.explain does: over the tokens it read (token), "
        "or over the model parts that wrote its input: the embedding and each block's attention and MLP "
        "(component); both: --by token component. Prints each prompt's score and flag and the top --k of each "
        "(default, without --by: by order, neuron and neuron pair)",
    )
    p.add_argument(
        "--heads",
        action="store_true",
        help="with --by component: split each attention layer by head (blocks.L.attn.H, the output bias apart)",
    )
    p.add_argument(
        "--k",
        type=int,
        default=8,
        help="how many top neurons and pairs (with --by: tokens and model parts) to list (default 8)",
    )
    p.add_argument(
        "--json",
        default=None,
        help="also write each prompt's result to this file (with --by: the whole split, its top --k and the "
        "score; logit = baseline + the sum of by_token, or of by_component)",
    )


def _serve(sub: argparse._SubParsersAction) -> None:
    """``tpc-hooks serve``: listed for ``--help``; its own module parses its options (the rest are vLLM's)."""
    sub.add_parser(
        "serve",
        help="vLLM's OpenAI-compatible server with a monitor on every request (needs vllm; "
        "tpc-hooks serve MODEL --monitor DIR [--action stop|flag] [vLLM's options])",
    )


def _review(sub: argparse._SubParsersAction) -> None:
    """``tpc-hooks review``: a server's review log as HTML pages."""
    p = sub.add_parser(
        "review",
        help="a server's review log (--review-log DIR) as HTML: an index and one page per "
        "logged request, its steps coloured by score and the flagged step's attribution (with --monitor: "
        "also its tokens coloured by their share of the logit, recomputed from the logged text)",
    )
    p.add_argument("log", help="the --review-log directory (or one of its review.jsonl files)")
    p.add_argument("--out", default=None, help="where the pages go (default: LOG/html)")
    p.add_argument("--flagged-only", action="store_true", help="pages for flagged requests only (not the sample)")
    p.add_argument(
        "--monitor",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a monitor the server ran: its name in the log and its saved directory (DIR alone: the server's "
        "lone monitor; repeat for several; a :stop or :flag suffix, as serve takes it, is ignored). Each "
        "flagged request whose log holds its text (serve --review-log-text) then shows that monitor's logit "
        "split over the tokens and the model parts, recomputed here from the logged text with the "
        "transformers adapter (not read from the server's pass)",
    )
    p.add_argument(
        "--explain-with",
        default=None,
        metavar="MODEL",
        help="with --monitor: the model the split is recomputed on, loaded with transformers' "
        "AutoModelForCausalLM and AutoTokenizer: the server's checkpoint, a local folder or a hub id "
        "(default: the packaged SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--k", type=int, default=8, help="with --monitor: how many top tokens and model parts to list (default 8)"
    )
    p.add_argument("--no-progress", action="store_true", help="with --monitor: hide the progress bar")


def _model_args(p: argparse.ArgumentParser) -> None:
    """The options of the verbs that load a model."""
    p.add_argument("--model", default=None, help="hub id or local folder (default: the packaged SmolLM2-135M-Instruct)")
    p.add_argument("--toolkit", choices=TOOLKITS, default="transformer_lens")


def _data_args(p: argparse.ArgumentParser, *, test_fraction: float | None) -> None:
    """The options of the verbs that read labelled prompts (``demo``, ``collect``, ``evaluate``): one
    way to name a dataset and its columns, and (``test_fraction`` not None) how a user's file is split,
    as ``train_monitor`` splits its prompts."""
    p.add_argument(
        "--dataset",
        default="default",
        help="'default' (the packaged set, with a held-out source), a local .csv/.jsonl/.json file, or a hub "
        "dataset id",
    )
    p.add_argument("--text-column", default="text", help="the column holding each prompt (default: text)")
    p.add_argument(
        "--label-column", default="label", help="the column holding each label, 1 = harmful (default: label)"
    )
    p.add_argument(
        "--source-column",
        default="source",
        help="the column naming each prompt's source, when the file has one (default: source; else the file's name)",
    )
    p.add_argument(
        "--label-names",
        nargs=2,
        metavar=("BENIGN", "HARMFUL"),
        default=None,
        help="the label column's two values when they are not 0/1, benign first (e.g. unharmful harmful)",
    )
    p.add_argument("--split", default=None, help="a hub dataset's split (default: train)")
    if test_fraction is None:
        return
    p.add_argument("--seed", type=int, default=0, help="the seed of the split of a user's data (and of the rewrites)")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.2,
        help="a user's data: the share held out for validation, stratified as train_monitor holds it (default 0.2)",
    )
    p.add_argument(
        "--test-fraction",
        type=float,
        default=test_fraction,
        help=f"a user's data: the share held out first as a test split (default {test_fraction:g})",
    )


def _monitor_arg(p: argparse.ArgumentParser) -> None:
    """``--monitor`` of the verbs that run a monitor on a model they load."""
    p.add_argument(
        "--monitor",
        default=None,
        help="the directory tpc-hooks train saved (default: the pretrained monitor of the packaged --model, "
        "tpc_hooks.offline.load_monitor)",
    )
