"""The contract of a target plugin: everything the core needs to know about a target, in one
object the target declares itself (:class:`TargetPlugin`).

A target is found by name through the entry-point group ``periodic_manager.targets``
(:mod:`periodic_manager.targets.registry`); the built-in ones are registered the same way in
``pyproject.toml`` and declared in :mod:`periodic_manager.targets.builtin`. The module an entry
point names must be light: the settings load every installed plugin to know their variables, so
the target's own library is imported by ``build`` (or by the target), never at the top.

What a plugin declares (docs/targets.md walks through writing one):

* ``name``: what ``PM_TARGET``, ``PM_TARGETS`` and ``options.target`` call it;
* ``settings``: a pydantic model whose fields are its ``PM_*`` variables (name, type, default,
  description, validators), added to :class:`periodic_manager.settings.Settings`; plugins may
  share a model (the Redis targets share the Redis connection's);
* ``build``: the :class:`~periodic_manager.contracts.Target` from the settings and the manager's
  database engine (opening no connection yet);
* ``where``: where it sends, passwords hidden (the start-up log, the start-up check's errors);
* ``url_setting``: the variable an error about where it sends names;
* ``completion`` and ``failure``: why it cannot tell that a task finished (``options.overlap``
  skip and hold) or failed (``options.pause_after_failures``), None when it can;
* ``task_problem``: its write-time rule, ``"module:function"`` (see
  :mod:`periodic_manager.plugins.task_rules`), imported on the first question;
* ``options``: the keys of a schedule's ``options`` it reads besides the core's (their values
  are judged by its ``task_problem``; another target's schedule may not set them);
* ``library``: the optional library it needs, and how to install it;
* ``refuse``: a setting it cannot run with (the field at fault and why), checked at start.

Its ping, and whether it lives in the manager's database, are capabilities of the target object
itself (:class:`~periodic_manager.contracts.Pingable`,
:class:`~periodic_manager.contracts.InManagerDatabase`), as are its completion and failure
signals at run time (:class:`~periodic_manager.contracts.CompletionSignal`, ...).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, BeforeValidator

from periodic_manager.errors import TargetError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from periodic_manager.contracts import Target

S = TypeVar("S")


class ManagerSettings(Protocol):
    """What every plugin may read of the core settings."""

    database_url: str


@dataclass(frozen=True, slots=True)
class Library:
    """An optional library a target needs: the module to import and the line that installs it."""

    target: str
    module: str
    install: str  # e.g. "pip install 'periodic-manager[rq]'"

    def needs(self) -> str:
        """What is missing, as one line naming how to install it."""
        return f"the {self.target} target needs {self.module}: {self.install}"

    def missing(self) -> str | None:
        """Why the target cannot be built here (its library is not installed), or None."""
        return None if importlib.util.find_spec(self.module) is not None else self.needs()

    def load(self, module: str | None = None) -> Any:
        """Import ``module`` of the library (default: the library itself); TargetError naming
        how to install it if missing."""
        try:
            return importlib.import_module(module or self.module)
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise TargetError(self.needs()) from exc


@dataclass(frozen=True, slots=True)
class Refusal:
    """Settings a target cannot run with: why, and the field at fault (None: the one naming the
    target, ``target`` or ``targets``)."""

    reason: str
    field: str | None = None


def none_if_blank(value: object) -> object:
    """A blank string as None (an empty ``PM_*`` variable is an unset one), anything else as is."""
    return None if isinstance(value, str) and not value.strip() else value


# An optional text setting: an empty variable is an unset one.
OptionalText = Annotated[str | None, BeforeValidator(none_if_blank)]


def can_tell(settings: object) -> None:
    """The default of ``completion`` and ``failure``: the target can tell."""
    return None


def refuses_nothing(settings: object) -> None:
    """The default of ``refuse``: any settings will do."""
    return None


@dataclass(frozen=True, slots=True)
class TargetPlugin(Generic[S]):
    """One target, as the core sees it (see the module doc). ``S`` is what its functions read of
    the settings: its own model, or a protocol the settings satisfy."""

    name: str
    build: Callable[[S, AsyncEngine], Target]
    where: Callable[[S], str]
    url_setting: Callable[[S], str]
    settings: type[BaseModel] | None = None
    completion: Callable[[S], str | None] = can_tell
    failure: Callable[[S], str | None] = can_tell
    task_problem: str | None = None
    options: tuple[str, ...] = ()
    library: Library | None = None
    refuse: Callable[[S], Refusal | None] = refuses_nothing
