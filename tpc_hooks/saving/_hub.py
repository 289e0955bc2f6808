"""Sharing: ``save_pretrained`` with a model card, ``from_pretrained`` and ``push_to_hub``.

:class:`HubMixin` adds the three to any class that can save itself to a directory, load
itself from one and write its model card; it knows no concrete class.
"""

import os
import tempfile
from pathlib import Path
from typing import Any, no_type_check

from .._errors import TPCHooksError, deprecated
from . import _format

CARD_FILE = "README.md"
HUB_FILES = [_format.CONFIG_FILE, _format.WEIGHTS_FILE, CARD_FILE]


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
def save_pretrained(
    obj: Any, directory: str | os.PathLike, *, card: bool | str = True, repo_id: str | None = None
) -> Path:
    """Saves a head or monitor (``config.json`` + ``model.safetensors``) and, when ``card``, a model card ``README.md``.

    Args:
        obj: a :class:`~tpc_hooks.TPC` or :class:`~tpc_hooks.Monitor`.
        directory: created if needed; ``config.json`` and ``model.safetensors`` in the saved
            format (DESIGN.md), never a pickle.
        card: also write the generated model card (``obj.model_card()``) as ``README.md``, when that file is
            absent or a card this package wrote (``"overwrite"``: replace whatever is there; ``False``: none).
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
    if card not in (True, False, "overwrite"):
        raise TPCHooksError(f"card must be True, False or 'overwrite'; got {card!r}")
    out = Path(directory)
    readme = out / CARD_FILE
    if card is True and readme.is_file() and not _ours(readme):  # checked before anything is written
        raise TPCHooksError(
            f"{readme} exists and is not a tpc-hooks model card; it is left alone: pass card=False to "
            "save without a card, or card='overwrite' to replace it with the generated one"
        )
    obj._save_dir(out)
    if card:
        text = obj.model_card(repo_id=repo_id)
        _format._atomic_write(readme, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return out


def _ours(readme: Path) -> bool:
    """Whether ``readme`` is a model card this package wrote (its front matter names the library)."""
    try:
        head = readme.read_text(encoding="utf-8", errors="replace")[:200]
    except OSError:
        return False
    return head.startswith("---\nlibrary_name: tpc-hooks\n")


def _check_obj(obj: Any) -> None:
    if not isinstance(obj, HubMixin):
        raise TPCHooksError(
            f"expected a tpc_hooks.TPC or tpc_hooks.Monitor to save or share; got {type(obj).__name__}. "
            "Pass the trained head or monitor"
        )


# ---------------------------------------------------------------------- loading and sharing
def _hub_errors(hf: Any) -> tuple[type[BaseException], ...]:
    """The exceptions a failed download raises (no network, unknown repository, invalid id)."""
    found: list[type[BaseException]] = [OSError, ValueError]
    for name in ("HfHubHTTPError", "HTTPError"):
        cls = getattr(hf.errors, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


@no_type_check  # name_or_path is checked here, with a message that names the fix
def from_pretrained(
    cls: type,
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    **load_kw: Any,
) -> Any:
    """Loads ``cls`` (TPC or Monitor) from a local directory or a Hugging Face hub model id.

    A path to an existing directory is loaded strictly (names, shapes, dtype and version must match). A string that
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
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TPCHooksError(
            f'expected a directory saved with save_pretrained or a hub id ("org/name"); got '
            f"{type(name_or_path).__name__}"
        )
    path = Path(name_or_path)
    if path.is_dir():
        return cls._load_dir(path, **load_kw)
    if path.exists():
        raise TPCHooksError(
            f"expected a directory saved with save_pretrained (holding {_format.CONFIG_FILE} and "
            f"{_format.WEIGHTS_FILE}); {str(path)!r} is a file. Pass the directory that contains it"
        )
    name = name_or_path if isinstance(name_or_path, str) else None
    if name is None or not is_repo_id(name):
        raise TPCHooksError(
            f'the directory {str(path)!r} does not exist, and it is not a hub model id ("org/name"); '
            "pass a directory saved with save_pretrained, or a hub repository id"
        )
    import huggingface_hub as hf

    try:
        local = hf.snapshot_download(
            repo_id=name,
            revision=revision,
            token=token,
            cache_dir=cache_dir,
            repo_type="model",
            allow_patterns=list(HUB_FILES),
        )
    except _hub_errors(hf) as err:
        detail = " ".join(str(err).split()).split(". ")[0][:300]
        if isinstance(err, getattr(hf.errors, "RepositoryNotFoundError", ())):
            why = (
                "the hub has no such repository (or revision) this token can read; check the id, and pass token= "
                "for a private or gated repository"
            )
        elif isinstance(err, getattr(hf.errors, "RevisionNotFoundError", ())):
            why = f"the hub repository has no revision {revision!r}; check revision="
        else:
            why = "the hub could not be reached or the repository was not found"
        raise TPCHooksError(
            f"{name!r} is not a local directory, and downloading it as a hub model repository failed: "
            f"{why} ({type(err).__name__}: {detail}). Pass a local directory saved with "
            "save_pretrained, or retry with network access"
        ) from None
    return cls._load_dir(Path(local), **load_kw)


def push_to_hub(
    obj: Any,
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | bool | None = None,
    commit_message: str = "Upload tpc-hooks model",
    revision: str | None = None,
) -> Any:
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
        raise TPCHooksError(
            f'expected a hub model id like "user/name"; got {repo_id!r}. Pass the repository to create or update'
        )
    import huggingface_hub as hf

    with tempfile.TemporaryDirectory(prefix="tpc-hooks-push-") as tmp:
        save_pretrained(obj, tmp, card=True, repo_id=repo_id)
        api = hf.HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        return api.upload_folder(
            repo_id=repo_id, folder_path=tmp, commit_message=commit_message, revision=revision, repo_type="model"
        )


class HubMixin:
    """Adds :meth:`save_pretrained`, :meth:`from_pretrained` and :meth:`push_to_hub` to a class.

    Subclasses implement ``_save_dir(path)`` (writes ``config.json`` + ``model.safetensors``),
    the classmethod ``_load_dir(path, **kwargs)`` (strict, never unpickles) and ``model_card(*,
    repo_id=None) -> str`` (the ``README.md`` written beside them), and may set
    ``_hub_commit_message``. ``save`` and ``load`` are deprecated aliases (they warn once).
    """

    _hub_commit_message = "Upload tpc-hooks model"

    def _save_dir(self, path: str | os.PathLike) -> Path:
        raise NotImplementedError

    @classmethod
    def _load_dir(cls, path: str | os.PathLike, *args: Any, **kwargs: Any) -> Any:
        # ``*args, **kwargs``: each class takes its own loading options, so any override fits
        raise NotImplementedError

    def save(self, path: str | os.PathLike) -> Path:
        """Deprecated: ``save_pretrained(path, card=False)`` writes the same files."""
        deprecated(
            f"{type(self).__name__}.save", f"{type(self).__name__}.save_pretrained(path) (card=False for no model card)"
        )
        return self._save_dir(path)

    @classmethod
    def load(cls, path: str | os.PathLike, **kwargs: Any) -> Any:
        """Deprecated: ``from_pretrained(path)`` loads the same directory (or a hub id)."""
        deprecated(f"{cls.__name__}.load", f"{cls.__name__}.from_pretrained(path)")
        return cls._load_dir(path, **kwargs)

    def save_pretrained(self, directory: str | os.PathLike, *, card: bool | str = True) -> Path:
        """``config.json`` + ``model.safetensors`` and a generated model card (``README.md``), as ``transformers`` and
        SAELens users expect. Returns the directory.

        Example:
            >>> import tempfile, tpc_hooks as tpc
            >>> d = tpc.TPC(d_model=8, degree=2, rank=2).save_pretrained(tempfile.mkdtemp())
            >>> sorted(p.name for p in d.iterdir())
            ['README.md', 'config.json', 'model.safetensors']
        """
        return save_pretrained(self, directory, card=card)

    @classmethod
    @no_type_check  # as from_pretrained above
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        **load_kwargs: Any,
    ) -> Any:
        """Loads from a local directory or a Hugging Face hub repository id (``"user/repo"``,
        downloaded with ``huggingface_hub``; needs the network). Never unpickles; a monitor
        trained on SAE latents takes its SAE as ``sae=``.

        Example:
            >>> monitor = tpc.Monitor.from_pretrained("user/smollm2-harm-monitor")  # doctest: +SKIP
        """
        return from_pretrained(cls, name_or_path, revision=revision, token=token, cache_dir=cache_dir, **load_kwargs)

    def push_to_hub(
        self,
        repo_id: str,
        *,
        private: bool | None = None,
        token: str | bool | None = None,
        commit_message: str | None = None,
        revision: str | None = None,
    ) -> Any:
        """Uploads :meth:`save_pretrained`'s directory to a hub model repository (created if
        missing) with ``huggingface_hub``; returns its commit info."""
        return push_to_hub(
            self,
            repo_id,
            private=private,
            token=token,
            commit_message=commit_message or self._hub_commit_message,
            revision=revision,
        )
