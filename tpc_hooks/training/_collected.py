"""The directory ``tpc-hooks collect`` writes, read back: its checks (each error names the fix)
and the readers that turn its stores into the training recipe's rows.

Layout: ``collect.json`` (model, sites, pooling, tokenisation), one folder per split (``train``,
``val``, ``test`` or ``all``; ``aug`` and ``val-<family>`` with the phrasing rewrites; ``flips`` and
``val-intent`` with the intent flips; ``ctx-train`` and ``ctx-val`` with hosted chats) holding
``labels.json`` and one activation store per site. :func:`rewrite_splits` and :func:`flip_splits`
build the extra splits from the prompt sets, as ``train_monitor`` builds its rows.
"""

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._errors import TPCHooksError
from ..activations import ActivationStore
from ..data import PHRASING_FAMILIES, homonym_examples, intent_flips, rewrites
from ._train import INTENT, PLAIN, Chats, Examples, TrainData, val_sources

COLLECT_KEYS = ("model", "sites", "pooling", "chat_template", "max_tokens")


def read_json(path: Path, fix: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TPCHooksError(f"{path} is not valid JSON ({err}); {fix}") from None


def collect_config(acts: Path) -> dict[str, Any]:
    """``acts/collect.json``, checked for the keys that ``train`` reads."""
    f = acts / "collect.json"
    if not f.is_file():
        raise TPCHooksError(
            f"--acts {acts} has no collect.json; expected the directory written by tpc-hooks collect; "
            f"pass that directory, or run tpc-hooks collect --out {acts} first"
        )
    cfg = read_json(f, f"it is written by tpc-hooks collect; re-run tpc-hooks collect --out {acts}")
    missing = [k for k in COLLECT_KEYS if not isinstance(cfg, dict) or k not in cfg]
    if missing:
        raise TPCHooksError(
            f"{f} lacks {', '.join(missing)}; expected the collect.json written by tpc-hooks collect; "
            f"re-run tpc-hooks collect --out {acts}"
        )
    sites = cfg["sites"]
    if not (isinstance(sites, list) and sites and all(isinstance(s, str) for s in sites)):
        raise TPCHooksError(
            f'{f}: "sites" must be a non-empty list of hook names; got {sites!r}; re-run tpc-hooks collect --out {acts}'
        )
    return cfg


def collected_splits(acts: Path) -> list[str]:
    return sorted(d.name for d in acts.iterdir() if (d / "labels.json").is_file()) if acts.is_dir() else []


def check_split(acts: Path, split: str, site: str, flag: str, site_fix: str) -> list[Any]:
    """The split's labels, after checking that ``acts/split`` was collected, with ``site``; ``flag``
    names the argument that chose the split."""
    d = acts / split
    if not (d / "labels.json").is_file():
        have = ", ".join(collected_splits(acts)) or "none"
        raise TPCHooksError(
            f"{flag} {split!r}: {d} is not a collected split (no labels.json); collected splits in {acts}: "
            f"{have}; pass one of those, or run tpc-hooks collect first"
        )
    labels = read_json(d / "labels.json", f"it is written by tpc-hooks collect; re-run tpc-hooks collect --out {acts}")
    if not isinstance(labels, list) or any(isinstance(v, bool) or v not in (0, 1) for v in labels):
        raise TPCHooksError(
            f"{d / 'labels.json'} is not a list of 0/1 labels; it is written by tpc-hooks collect; "
            f"re-run tpc-hooks collect --out {acts}"
        )
    if not (d / site).is_dir():
        have = ", ".join(sorted(s.name for s in d.iterdir() if s.is_dir())) or "none"
        raise TPCHooksError(f"site {site!r} was not collected in {d}; collected there: {have}; {site_fix}")
    return labels


CONTEXT_SPLITS = {"train": "ctx-train", "val": "ctx-val"}


def pooled_rows(
    acts: Path, split: str, site: str, labels: list[Any], user: str = "a pooled monitor"
) -> tuple[Any, Any]:
    """The split's activations at ``site`` and its labels (checked by :func:`check_split`); ``user``
    names what needs pooled rows, for the error on a store of per-token rows."""
    st = ActivationStore.open(acts / split / site)
    if st.holds_sequences:
        raise TPCHooksError(
            f"{acts / split / site} holds per-token rows (tpc-hooks collect --pooling token), but {user} "
            "reads pooled rows (one per prompt); collect them with --pooling mean|last|max into another "
            "--out, or use a per-token monitor"
        )
    X = st.to_numpy()
    if len(X) != len(labels):
        raise TPCHooksError(
            f"{acts / split}: {len(labels)} labels in labels.json but {len(X)} rows in the {site} store; "
            f"expected one row per label (an interrupted collect?); re-run tpc-hooks collect --out {acts}"
        )
    return X, labels


def token_sequences(
    acts: Path, split: str, site: str, labels: list[Any], user: str
) -> tuple[list[Any], dict[str, Any]]:
    """A per-token store's sequences ``[T_i, d]`` (float32 arrays, one per label) and its metadata
    (``fixed_prefix``: the leading tokens every prompt shares); ``user`` names what needs them,
    for the error on a pooled store."""
    st = ActivationStore.open(acts / split / site)
    if not st.holds_sequences:
        raise TPCHooksError(
            f"{acts / split / site} holds pooled rows (pooling {st.meta.get('pooling')!r}), but {user} "
            "reads per-token rows; collect them with tpc-hooks collect --pooling token into another "
            "--out (a directory holds one kind)"
        )
    if st.n_sequences != len(labels):
        raise TPCHooksError(
            f"{acts / split}: {len(labels)} labels in labels.json but {st.n_sequences} sequences in the "
            f"{site} store; expected one per label (an interrupted collect?); re-run tpc-hooks collect "
            f"--out {acts}"
        )
    return st.sequences(), st.meta


class PooledStores:
    """``train``'s reader of pooled stores: one row per prompt."""

    skip, prepend_bos = 0, None

    def __init__(self, acts: Path, site_fix: str):
        self.acts, self.site_fix = acts, site_fix

    def part(self, split: str, site: str, flag: str) -> tuple[Any, Any]:
        X, y = pooled_rows(self.acts, split, site, check_split(self.acts, split, site, flag, self.site_fix))
        return torch.from_numpy(X), np.asarray(y, dtype=int)

    def cat(self, parts: list[Any]) -> Any:
        return torch.cat(parts)

    def data(
        self,
        site: str,
        train_split: str,
        rewrites: bool,
        families: list[str] | None,
        hosted: list[str],
        intent: bool = False,
        homonyms: bool = False,
    ) -> Any:
        """The :class:`~tpc_hooks.training._train.TrainData` of ``site``: the training split, its rewrites
        (``aug``), its intent flips (``flips``) and homonym rows (``homonyms``), and the validation split
        then each family's (``val-<family>``) then the group ``val-intent``."""
        train = Examples(*self.part(train_split, site, "training split"))
        aug = Examples(*self.part("aug", site, "training split")) if rewrites else None
        flips = Examples(*self.part("flips", site, "training split")) if intent else None
        homonym_rows = Examples(*self.part("homonyms", site, "training split")) if homonyms else None
        val = None
        if families is not None:
            parts = (
                [("val", PLAIN)] + [(f"val-{f}", f) for f in families] + ([("val-intent", INTENT)] if intent else [])
            )
            got = [self.part(p, site, "validation split") for p, _ in parts]
            groups = np.concatenate([np.full(len(y), g) for (X, y), (_, g) in zip(got, parts, strict=True)])
            val = Examples(
                self.cat([X for X, _ in got]),
                np.concatenate([y for _, y in got]),
                groups,
                val_sources(self.sources("val", len(got[0][1])), groups),
            )
        return TrainData(
            train=train, rewrites=aug, val=val, contexts=self.contexts(site, hosted), flips=flips, homonyms=homonym_rows
        )

    def contexts(self, site: str, hosted: list[str]) -> dict[str, Any]:
        return {}

    def sources(self, split: str, n: int) -> np.ndarray | None:
        """The split's ``sources.json`` (one source name per prompt, written by collect), or None for a
        split collected without it."""
        f = self.acts / split / "sources.json"
        if not f.is_file():
            return None
        names = read_json(f, f"it is written by tpc-hooks collect; re-run tpc-hooks collect --out {self.acts}")
        if not isinstance(names, list) or len(names) != n or not all(isinstance(v, str) and v.strip() for v in names):
            raise TPCHooksError(
                f"{f} is not a list of {n} source names (one per prompt of {self.acts / split}); it is "
                f"written by tpc-hooks collect; re-run tpc-hooks collect --out {self.acts}"
            )
        return np.asarray(names, dtype=object)


class TokenStores(PooledStores):
    """``train``'s reader of per-token stores: each prompt's token activations; every store must
    record the same fixed prefix (the monitor's ``skip``)."""

    def __init__(self, acts: Path, site_fix: str):
        super().__init__(acts, site_fix)
        self.skip: Any = None
        self.prepend_bos: Any = None

    def part(self, split: str, site: str, flag: str) -> tuple[Any, Any]:
        labels = check_split(self.acts, split, site, flag, self.site_fix)
        seqs, meta = token_sequences(
            self.acts, split, site, labels, "a per-token monitor (collect.json says pooling 'token')"
        )
        self._prefix(meta, split, site)
        return [torch.from_numpy(z) for z in seqs], np.asarray(labels, dtype=int)

    def _prefix(self, meta: dict[str, Any], split: str, site: str) -> None:
        prefix = meta.get("fixed_prefix")
        if not isinstance(prefix, int) or isinstance(prefix, bool):
            raise TPCHooksError(
                f"the {site} stores in {self.acts} do not record their fixed prefix; re-run tpc-hooks collect"
            )
        if self.skip is None:
            self.skip, self.prepend_bos = prefix, meta.get("prepend_bos")
        elif prefix != self.skip:
            raise TPCHooksError(
                f"the per-token stores in {self.acts} were collected with different fixed prefixes "
                f"({split!r}: {prefix}, others: {self.skip}); re-run tpc-hooks collect --out {self.acts} "
                "with one setting"
            )

    def cat(self, parts: list[Any]) -> Any:
        return [z for p in parts for z in p]

    def contexts(self, site: str, hosted: list[str]) -> dict[str, Any]:
        return {k: hosted_chats(self.acts, CONTEXT_SPLITS[k], site, self.skip, self.site_fix) for k in hosted}


def hosted_chats(acts: Path, split: str, site: str, skip: int, site_fix: str) -> Any:
    """A ``collect --contexts`` split as :class:`~tpc_hooks.training._train.Chats`: its chats' token
    activations, request spans (checked to fit each chat after the fixed prefix) and labels."""
    labels = check_split(acts, split, site, "context split", site_fix)
    seqs, _ = token_sequences(acts, split, site, labels, "a per-token monitor")
    spans = read_json(acts / split / "spans.json", f"it is written by tpc-hooks collect --contexts; {site_fix}")
    ok = (
        isinstance(spans, dict)
        and isinstance(spans.get("tail"), int)
        and isinstance(spans.get("spans"), list)
        and len(spans["spans"]) == len(seqs)
        and all(
            isinstance(p, list) and len(p) == 2 and skip <= p[0] < p[1] <= len(z)
            for p, z in zip(spans["spans"], seqs, strict=True)
        )
    )
    if not ok:
        raise TPCHooksError(
            f"{acts / split / 'spans.json'} does not hold one request span per chat of {acts / split} "
            f"(after the {skip}-token fixed prefix); {site_fix} --contexts ..."
        )
    return Chats(
        [torch.from_numpy(z) for z in seqs],
        [tuple(p) for p in spans["spans"]],
        np.asarray(labels, dtype=int),
        spans["tail"],
    )


def rewrite_splits(sets: dict[str, Any], seed: int) -> dict[str, Any]:
    """``"aug"`` (one phrasing rewrite per training prompt) and ``"val-<family>"`` (every validation
    prompt by each family), as ``train_monitor`` builds them; none for a set without train/val splits."""

    if "train" not in sets or "val" not in sets:
        return {}
    out = {"aug": rewrites(sets["train"].texts, sets["train"].labels, seed=seed)}
    views = rewrites(sets["val"].texts, sets["val"].labels, every_family=True, seed=seed)
    for family in PHRASING_FAMILIES:
        out[f"val-{family}"] = views.subset([i for i, f in enumerate(views.categories) if f == family])
    return out


def flip_splits(sets: dict[str, Any], seed: int) -> dict[str, Any]:
    """``"flips"`` (one intent flip per harmful training prompt, label 0), ``"homonyms"`` (the training
    verbs' homonyms, :func:`tpc_hooks.data.homonym_examples`) and ``"val-intent"``
    (every harmful validation prompt, then every kind's flip of them, then the validation
    homonyms), as ``train_monitor`` builds them; none for a set without train/val splits."""
    if "train" not in sets or "val" not in sets:
        return {}
    val = sets["val"]
    harmful = val.subset([i for i, v in enumerate(val.labels) if v == 1])
    flips = intent_flips(val.texts, val.labels, every_kind=True, seed=seed)
    train = sets["train"]
    return {
        "flips": intent_flips(train.texts, train.labels, seed=seed),
        "val-intent": harmful + flips + homonym_examples(verbs="val"),
        "homonyms": homonym_examples(),
    }
