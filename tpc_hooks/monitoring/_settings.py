"""How a :class:`~tpc_hooks.Monitor` reads its settings as attributes: each is ``config.<name>``
(:class:`~tpc_hooks.MonitorConfig`, where each is documented), and assigning one replaces ``config``
with a copy that is validated (``monitor.threshold = float("nan")`` is an error, not a monitor that
never flags). ``Monitor`` declares one typed line per field, so that IDEs and type checkers see
them; a test holds the list to ``MonitorConfig``'s fields."""

from dataclasses import replace
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class Setting(Generic[T]):
    """``monitor.<name>`` is ``monitor.config.<name>``; assigning it replaces ``config`` with a copy
    that :class:`~tpc_hooks.MonitorConfig` checks, so a bad value leaves the monitor as it was."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.__doc__ = f"``config.{name}``: see :class:`~tpc_hooks.MonitorConfig`."

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> "Setting[T]": ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return self if obj is None else getattr(obj.config, self.name)

    def __set__(self, obj: Any, value: T) -> None:
        obj.config = replace(obj.config, **{self.name: value})  # MonitorConfig checks the value

    # a runtime type checker (beartype, jaxtyping's import hook) would answer `monitor.threshold = "0.5"`
    # with its own error before MonitorConfig's, which names the fix; static checkers still read T
    __set__.__no_type_check__ = True  # type: ignore[attr-defined]
