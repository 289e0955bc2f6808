"""Sharing heads and monitors: ``save_pretrained`` with a model card, ``from_pretrained`` and ``push_to_hub``."""

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from . import _format
from ._errors import TPCHooksError
from ._monitor import Monitor
from ._polynomial import TPC

CARD_FILE = "README.md"
HUB_FILES = [_format.CONFIG_FILE, _format.WEIGHTS_FILE, CARD_FILE]
TAGS = ["tpc-hooks", "activation-probe", "safety-monitor", "interpretability"]

def is_repo_id(name: str, *, need_org: bool = False) -> bool:
    """Whether ``name`` is a valid hub repository id (``"name"`` or ``"org/name"``), by
    ``huggingface_hub``'s own rule."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return "/" in name or not need_org


# ---------------------------------------------------------------------- saving
def save_pretrained(obj: TPC | Monitor, directory: str | os.PathLike, *, card: bool = True,
                    repo_id: str | None = None) -> Path:
    """Saves a head or monitor with ``obj.save`` and, when ``card``, a model card ``README.md``.

    Args:
        obj: a :class:`~tpc_hooks.TPC` or :class:`~tpc_hooks.Monitor`.
        directory: created if needed; ``config.json`` and ``model.safetensors`` are written
            exactly as :meth:`~tpc_hooks.TPC.save` writes them.
        card: also write the generated model card (see :func:`model_card`).
        repo_id: the hub id the card's loading snippet names (default: a placeholder path).

    Returns:
        ``Path(directory)``.

    Example:
        >>> import tempfile, tpc_hooks as tpc
        >>> d = save_pretrained(tpc.TPC(d_model=8, degree=2, rank=2), tempfile.mkdtemp())
        >>> sorted(p.name for p in d.iterdir())
        ['README.md', 'config.json', 'model.safetensors']
    """
    _check_obj(obj)
    out = Path(directory)
    obj.save(out)
    if card:
        text = model_card(obj, repo_id=repo_id)
        _format._atomic_write(out / CARD_FILE, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return out


def _check_obj(obj: Any) -> None:
    if not isinstance(obj, (TPC, Monitor)):
        raise TPCHooksError(f"expected a tpc_hooks.TPC or tpc_hooks.Monitor to save or share; got {type(obj).__name__}. "
                            "Pass the trained head or monitor")


# ---------------------------------------------------------------------- the model card
def _line(value: Any) -> str:
    """``value`` as one line of text (newlines and runs of whitespace become one space)."""
    return " ".join(str(value).split())


def _text(value: Any) -> str:
    """``value`` as inert Markdown text: one line, Markdown punctuation and HTML escaped."""
    s = _line(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|#])", r"\\\1", s)


def _code(value: Any) -> str:
    """``value`` as an inline code span that is safe inside a table cell."""
    s = _line(value).replace("|", "\\|")
    ticks = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (ticks + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _block(code: str, lang: str = "python") -> str:
    """A fenced code block whose fence no line of ``code`` can close."""
    ticks = max((len(m) for m in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, ticks + 1)
    return f"{fence}{lang}\n{code}\n{fence}"


def _num(value: Any) -> str:
    """A metric with 3 decimals, "n/a" for NaN, "not recorded" when missing or not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "not recorded"
    return "n/a" if math.isnan(value) else f"{value:.3f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _front_matter(obj: TPC | Monitor) -> str:
    lines = ["---", "library_name: tpc-hooks", "tags:"] + [f"- {t}" for t in TAGS]
    name = obj.model_name if isinstance(obj, Monitor) else None
    if isinstance(name, str) and is_repo_id(name, need_org=True):
        lines.append(f"base_model: {name}")
    return "\n".join(lines + ["---"])


def _head_section(head: TPC) -> str:
    if head.has_bounds:
        trust = f"yes (gate {'on' if head.gate else 'off'})"
    else:
        trust = "no"
    props = [
        ["d_model", str(head.d_model)],
        ["degree", str(head.degree)],
        ["ranks (R_2..R_N)", ", ".join(map(str, head.ranks)) or "none (linear probe)"],
        ["trust region", trust],
        ["escalate_only", "yes" if head.escalate_only else "no"],
    ]
    costs = [head.cost(n) for n in range(1, head.degree + 1)]
    cost_rows = [[str(c.order), str(c.params), str(c.flops)] for c in costs]
    return "\n\n".join([
        "## The head",
        _table(["property", "value"], props),
        "Parameters and FLOPs of each truncation (order n uses degrees 1..n):",
        _table(["order", "params", "FLOPs"], cost_rows),
    ])


def _monitor_section(mon: Monitor) -> str:
    bos = "auto (when the tokenizer has a BOS token)" if mon.prepend_bos is None else ("yes" if mon.prepend_bos else "no")
    if mon.cascade is None:
        cascade = "none (scores with the full polynomial)"
    else:
        cascade = f"exit benign at p <= {mon.cascade.lower:g}, harmful at p >= {mon.cascade.upper:g}"
    rows = [
        ["model", _code(mon.model_name) if mon.model_name else "not recorded"],
        ["site", _code(mon.site)],
        ["pooling", _code(mon.pooling)],
        ["chat_template", "yes" if mon.chat_template else "no"],
        ["prepend_bos", bos],
        ["max_tokens", "no truncation" if mon.max_tokens is None else str(mon.max_tokens)],
        ["threshold", f"{mon.threshold:g}"],
        ["cascade", cascade],
    ]
    if mon.sae_identity:
        ident = mon.sae_identity
        name = "/".join(str(v) for v in (ident.get("release"), ident.get("sae_id")) if v) or ident.get("class", "SAE")
        sha = str(ident.get("weights_sha256") or "not recorded")[:12]
        rows.append(["SAE", f"{_code(name)} (d_sae={_text(ident.get('d_sae'))}, weights sha256 {_code(sha)}...)"])
    return "\n\n".join(["## The monitor", _table(["setting", "value"], rows)])


def _recipe(head: TPC) -> str | None:
    config = getattr(getattr(head, "history", None), "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    d = config.to_dict()
    keys = ("mode", "recipe", "epochs", "lr", "weight_decay", "trust_region", "gate", "shrink", "seed")
    parts = [f"{k}={d[k]!r}" for k in keys if k in d]
    return "Training recipe (`tpc.fit`): " + _code(", ".join(parts)) + "."


def _report_section(mon: Monitor) -> str:
    report = mon.report if isinstance(mon.report, dict) else {}
    val = report.get("validation") if isinstance(report.get("validation"), dict) else {}
    per_order = val.get("per_order")
    parts = ["## Training data and metrics"]
    data = report.get("data")
    parts.append(f"Data: {_text(data)}" if isinstance(data, str) and data.strip() else "Data: not recorded.")
    n_train, n_val = report.get("n_train"), val.get("n")
    parts.append(f"Training prompts: {n_train if isinstance(n_train, int) else 'not recorded'}; "
                 f"validation prompts: {n_val if isinstance(n_val, int) else 'not recorded'}.")
    if isinstance(per_order, list) and per_order:
        rows = []
        for i, m in enumerate(per_order, start=1):
            m = m if isinstance(m, dict) else {}
            rows.append([str(i)] + [_num(m.get(k)) for k in ("f1", "recall", "frr", "auroc")])
        parts.append(f"Validation metrics per truncation order (flagged at p >= {mon.threshold:g}):")
        parts.append(_table(["order", "F1", "recall", "FRR", "AUROC"], rows))
    else:
        parts.append("Validation metrics: not recorded.")
    recipe = _recipe(mon.head)
    if recipe:
        parts.append(recipe)
    return "\n\n".join(parts)


def _history_section(head: TPC) -> str:
    parts = ["## Training"]
    history = getattr(head, "history", None)
    selected = getattr(history, "selected", None)
    if isinstance(selected, dict) and selected:
        rows = []
        for n in range(1, head.degree + 1):
            rec = selected.get(n, selected.get(str(n)))
            rows.append([str(n), _num(rec.get("val_f1")) if isinstance(rec, dict) else "not recorded"])
        parts.append("Validation F1 of each degree when it was selected during training:")
        parts.append(_table(["order", "validation F1"], rows))
    else:
        parts.append("Training data and metrics: not recorded.")
    recipe = _recipe(head)
    if recipe:
        parts.append(recipe)
    return "\n\n".join(parts)


def _usage_section(obj: TPC | Monitor, repo_id: str | None) -> str:
    target = json.dumps(repo_id if repo_id else "path/to/this/directory")
    if isinstance(obj, Monitor):
        sae = ", sae=sae  # the SAE it was trained with" if obj.sae_identity else ""
        model = _line(obj.model_name) if obj.model_name else "the model it was trained on"
        code = "\n".join([
            "import tpc_hooks as tpc",
            "",
            f"monitor = tpc.Monitor.from_pretrained({target}{sae})",
            f"# model: a TransformerLens or nnsight model of {model}",
            "result = monitor.score(model, prompts)  # result.probs: probability of the harmful class",
            'run = monitor.generate(model, prompts, max_new_tokens=32, action="stop")',
        ])
    else:
        code = "\n".join([
            "import tpc_hooks as tpc",
            "",
            f"head = tpc.TPC.from_pretrained({target})",
            "logits = head(z)  # z: [batch, d_model] activations; head(z, order=1) is the linear probe",
        ])
    return "\n\n".join(["## How to load", _block(code)])


def model_card(obj: TPC | Monitor, *, repo_id: str | None = None) -> str:
    """A Hugging Face model card (Markdown with YAML front matter) describing a head or monitor.

    It states only what the object records (shape, costs, monitor settings, ``monitor.report``
    or ``head.history``); anything missing reads "not recorded".

    Args:
        obj: a :class:`~tpc_hooks.TPC` or :class:`~tpc_hooks.Monitor`.
        repo_id: the hub id the loading snippet names (default: a placeholder path).

    Example:
        >>> import tpc_hooks as tpc
        >>> card = model_card(tpc.TPC(d_model=8, degree=2, rank=2))
        >>> card.splitlines()[:2]
        ['---', 'library_name: tpc-hooks']
    """
    _check_obj(obj)
    head = obj.head if isinstance(obj, Monitor) else obj
    kind = "linear probe" if head.degree == 1 else f"degree-{head.degree} truncated polynomial classifier (TPC)"
    if isinstance(obj, Monitor):
        title = "# tpc-hooks safety monitor" + (f" for {_text(obj.model_name)}" if obj.model_name else "")
        intro = (f"A {kind} on a language model's activations at {_code(obj.site)}, packaged as a "
                 "tpc-hooks `Monitor` that scores prompts and watches generation.")
        body = [_monitor_section(obj), _head_section(head), _report_section(obj)]
    else:
        title = "# tpc-hooks head"
        intro = f"A {kind} on a language model's activations (a bare `TPC` head, not bound to a model or site)."
        body = [_head_section(head), _history_section(head)]
    intro += (" Every truncation to orders 1..n is itself a classifier; order 1 is the linear probe, higher orders add"
              " symmetric CP-factored interaction terms.")
    return "\n\n".join([_front_matter(obj), title, intro, *body, _usage_section(obj, repo_id)]) + "\n"


# ---------------------------------------------------------------------- loading and sharing
def _hub_errors(hf: Any) -> tuple[type[BaseException], ...]:
    """The exceptions a failed download raises (no network, unknown repository, invalid id)."""
    found: list[type[BaseException]] = [OSError, ValueError]
    for name in ("HfHubHTTPError", "HTTPError"):
        cls = getattr(hf.errors, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def from_pretrained(cls: type, name_or_path: str | os.PathLike, *, revision: str | None = None,
                    token: str | bool | None = None, cache_dir: str | os.PathLike | None = None, **load_kw: Any) -> Any:
    """Loads ``cls`` (TPC or Monitor) from a local directory or a Hugging Face hub model id.

    A path to an existing directory is loaded with ``cls.load(path, **load_kw)``. A string that
    is not a local path and looks like a hub id (``"name"`` or ``"org/name"``) is downloaded with
    ``huggingface_hub.snapshot_download`` (only ``config.json``, ``model.safetensors`` and
    ``README.md``; needs the network or the local cache) and then loaded. Never unpickles.

    Raises:
        TPCHooksError: the path does not exist, the download failed, or the files are invalid.

    Example:
        >>> import tempfile, tpc_hooks as tpc
        >>> d = save_pretrained(tpc.TPC(d_model=8, degree=2, rank=2), tempfile.mkdtemp())
        >>> from_pretrained(tpc.TPC, d).ranks
        (2,)
    """
    path = Path(name_or_path)
    if path.is_dir():
        return cls.load(path, **load_kw)
    if path.exists():
        raise TPCHooksError(f"expected a directory saved with save_pretrained (holding {_format.CONFIG_FILE} and "
                            f"{_format.WEIGHTS_FILE}); {str(path)!r} is a file. Pass the directory that contains it")
    name = name_or_path if isinstance(name_or_path, str) else None
    if name is None or not is_repo_id(name):
        raise TPCHooksError(f"the directory {str(path)!r} does not exist, and it is not a hub model id (\"org/name\"); "
                            "pass a directory saved with save_pretrained, or a hub repository id")
    import huggingface_hub as hf

    try:
        local = hf.snapshot_download(repo_id=name, revision=revision, token=token, cache_dir=cache_dir,
                                     repo_type="model", allow_patterns=list(HUB_FILES))
    except _hub_errors(hf) as err:
        detail = _line(err).split(". ")[0][:300]
        if isinstance(err, getattr(hf.errors, "RepositoryNotFoundError", ())):
            why = ("the hub has no such repository (or revision) this token can read; check the id, and pass token= "
                   "for a private or gated repository")
        elif isinstance(err, getattr(hf.errors, "RevisionNotFoundError", ())):
            why = f"the hub repository has no revision {revision!r}; check revision="
        else:
            why = "the hub could not be reached or the repository was not found"
        raise TPCHooksError(f"{name!r} is not a local directory, and downloading it as a hub model repository failed: "
                            f"{why} ({type(err).__name__}: {detail}). Pass a local directory saved with "
                            "save_pretrained, or retry with network access") from None
    return cls.load(Path(local), **load_kw)


def push_to_hub(obj: TPC | Monitor, repo_id: str, *, private: bool | None = None, token: str | bool | None = None,
                commit_message: str = "Upload tpc-hooks model", revision: str | None = None) -> Any:
    """Uploads ``save_pretrained``'s files (config, weights, model card) to a hub model repository.

    The repository is created if missing (``private`` applies only then). Needs the network
    and a write token (``token=`` or ``huggingface-cli login``).

    Returns:
        ``huggingface_hub``'s commit info of the upload.

    Example:
        >>> push_to_hub(monitor, "user/smollm2-harm-monitor", private=True)  # doctest: +SKIP
    """
    _check_obj(obj)
    if not isinstance(repo_id, str) or not is_repo_id(repo_id):
        raise TPCHooksError(f"expected a hub model id like \"user/name\"; got {repo_id!r}. Pass the repository to create "
                            "or update")
    import huggingface_hub as hf

    with tempfile.TemporaryDirectory(prefix="tpc-hooks-push-") as tmp:
        save_pretrained(obj, tmp, card=True, repo_id=repo_id)
        api = hf.HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        return api.upload_folder(repo_id=repo_id, folder_path=tmp, commit_message=commit_message, revision=revision,
                                 repo_type="model")
