"""The settings a :class:`~tpc_hooks.Monitor` reads as attributes, declared one by one (IDEs and
type checkers see them): each is ``config.<name>`` (:class:`~tpc_hooks.MonitorConfig`), and assigning
one replaces ``config`` with a copy that is validated (``monitor.threshold = float("nan")`` is an
error, not a monitor that never flags)."""

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from ._monitor_config import MonitorConfig

_F = TypeVar("_F", bound=Callable[..., Any])


def _checked_by_config(setter: _F) -> _F:
    """Leave the value's check to :class:`~tpc_hooks.MonitorConfig`: a runtime type checker
    (beartype, jaxtyping's import hook) would otherwise answer ``monitor.threshold = "0.5"`` with
    its own error before the library's. Static checkers still read the annotation."""
    setter.__no_type_check__ = True  # type: ignore[attr-defined]
    return setter


class Settings:
    """``monitor.site``, ``monitor.threshold``, ...: :class:`~tpc_hooks.MonitorConfig`'s fields."""

    config: MonitorConfig

    def _replace(self, **change: Any) -> None:
        self.config = replace(self.config, **change)  # MonitorConfig checks each value

    @property
    def site(self) -> str:
        """``config.site``: the hook point read (TransformerLens name, e.g. ``blocks.6.hook_resid_post``)."""
        return self.config.site

    @site.setter
    @_checked_by_config
    def site(self, value: str) -> None:
        self._replace(site=value)

    @property
    def pooling(self) -> str:
        """``config.pooling``: how a prompt's tokens become one row: ``mean``, ``last``, ``max`` or
        ``token`` (per-token)."""
        return self.config.pooling

    @pooling.setter
    @_checked_by_config
    def pooling(self, value: str) -> None:
        self._replace(pooling=value)

    @property
    def chat_template(self) -> bool:
        """``config.chat_template``: whether prompts are wrapped in the model's chat template."""
        return self.config.chat_template

    @chat_template.setter
    @_checked_by_config
    def chat_template(self, value: bool) -> None:
        self._replace(chat_template=value)

    @property
    def prepend_bos(self) -> bool | None:
        """``config.prepend_bos``: whether a BOS token is prepended (None: the tokenizer's default)."""
        return self.config.prepend_bos

    @prepend_bos.setter
    @_checked_by_config
    def prepend_bos(self, value: bool | None) -> None:
        self._replace(prepend_bos=value)

    @property
    def max_tokens(self) -> int | None:
        """``config.max_tokens``: prompts are truncated to this many tokens (None: no truncation)."""
        return self.config.max_tokens

    @max_tokens.setter
    @_checked_by_config
    def max_tokens(self, value: int | None) -> None:
        self._replace(max_tokens=value)

    @property
    def model_name(self) -> str | None:
        """``config.model_name``: the model the monitor was trained on, as recorded."""
        return self.config.model_name

    @model_name.setter
    @_checked_by_config
    def model_name(self, value: str | None) -> None:
        self._replace(model_name=value)

    @property
    def threshold(self) -> float:
        """``config.threshold``: a row is flagged when its probability reaches this."""
        return self.config.threshold

    @threshold.setter
    @_checked_by_config
    def threshold(self, value: float) -> None:
        self._replace(threshold=value)

    @property
    def aggregate(self) -> str:
        """``config.aggregate``: a per-token monitor's aggregation of its token scores."""
        return self.config.aggregate

    @aggregate.setter
    @_checked_by_config
    def aggregate(self, value: str) -> None:
        self._replace(aggregate=value)

    @property
    def alpha(self) -> float:
        """``config.alpha``: the ``ema`` aggregation's weight of the newest token."""
        return self.config.alpha

    @alpha.setter
    @_checked_by_config
    def alpha(self, value: float) -> None:
        self._replace(alpha=value)

    @property
    def window(self) -> int:
        """``config.window``: the ``rolling`` aggregation's window, in tokens."""
        return self.config.window

    @window.setter
    @_checked_by_config
    def window(self, value: int) -> None:
        self._replace(window=value)

    @property
    def skip(self) -> int:
        """``config.skip``: a per-token monitor's leading tokens that are never scored."""
        return self.config.skip

    @skip.setter
    @_checked_by_config
    def skip(self, value: int) -> None:
        self._replace(skip=value)
