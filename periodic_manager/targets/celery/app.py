"""The Celery app the celery target publishes with: the user's (``PM_CELERY_APP``) or a bare one.

The target never publishes through the user's app object itself: it copies the app's settings
(broker, transport options, queues, routes, defaults) into an app of its own, with the result
backend switched off. ``send_task`` on an app with a result backend subscribes to every task's
result (Redis, RPC), which would grow without bound in a process that only sends. The copy also
forces what the manager promises whatever the app says: JSON, message protocol 2, no compression.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from typing import Any

from periodic_manager.targets.builtin.celery import CELERY, REDIS_SCHEMES

_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$")
AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://")
# Settings the manager decides, whatever the app says. kombu's own publish retry is off: a
# publish that fails is retried by the scheduler, under the slot's pending claim, so that every
# publish that may reach the broker twice is counted (resent).
FORCED = {
    "task_serializer": "json",
    "task_compression": None,
    "task_protocol": 2,
    "result_backend": None,
    "task_publish_retry": False,
}


def import_celery() -> Any:
    return CELERY.load()


def check_app_path(path: str) -> str:
    """``path`` if it has the form ``package.module:attribute`` (or ``package.module``)."""
    if not _PATH_RE.match(path):
        raise ValueError(
            "must be 'package.module:app' (or 'package.module' holding 'app' or 'celery')"
        )
    return path


def load_app(path: str) -> Any:
    """Import the Celery app ``module:attribute`` (``module`` alone: its ``app`` or ``celery``).

    Raises ValueError with the reason (module not found, no such attribute, not a Celery app).
    """
    check_app_path(path)
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an app module may fail in any way while importing
        raise ValueError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    names = attribute.split(".") if attribute else None
    candidates = [names] if names else [["app"], ["celery"]]
    for chain in candidates:
        obj: Any = module
        try:
            for part in chain:
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if hasattr(obj, "conf") and hasattr(obj, "send_task"):
            return obj
        raise ValueError(f"{module_name}:{'.'.join(chain)} is not a Celery app")
    wanted = attribute or "app' or 'celery"
    raise ValueError(f"module {module_name!r} has no attribute '{wanted}'")


def app_settings(app: Any) -> dict[str, Any]:
    """The settings ``app`` changed from Celery's defaults (secrets included: they are passed on,
    never logged)."""
    table = dict(app.conf.table(with_defaults=False, censored=False))
    table.pop("deprecated_settings", None)
    if app.conf.broker_url:  # may come from the environment (CELERY_BROKER_URL), not the table
        table["broker_url"] = app.conf.broker_url
    return table


def _check_transport(broker: str) -> None:
    """A broker URL kombu has no transport for fails at start, not at the first due slot."""
    from kombu.transport import resolve_transport
    from kombu.utils.url import url_to_parts

    scheme = url_to_parts(broker).scheme
    try:
        resolve_transport(scheme)
    except KeyError:
        raise ValueError(f"kombu has no transport for the broker URL scheme {scheme!r}") from None
    except ImportError as exc:
        raise ValueError(
            f"the broker URL scheme {scheme!r} needs {exc.name or exc}, which is not installed"
        ) from None


def publishing_app(
    main: str, settings: Mapping[str, Any], *, broker_url: str | None, timeout: float
) -> Any:
    """A Celery app of the target's own with ``settings`` (an app's, see :func:`app_settings`),
    ``broker_url`` when given (it wins over the settings'), and the forced settings.

    Broker calls are bounded: ``broker_connection_timeout`` and, on Redis, the socket timeouts
    default to ``timeout`` (the app's ``broker_transport_options`` win). On AMQP, publisher
    confirms are on, whatever the app's transport options say: a claim becomes "sent" only on
    the broker's confirmation.
    """
    celery = import_celery()
    conf = dict(settings)
    if broker_url is not None:
        conf["broker_url"] = broker_url
    broker = conf.get("broker_url")
    if not isinstance(broker, str) or not broker:
        raise ValueError("the Celery app has no broker_url (set it, or PM_CELERY_BROKER_URL)")
    _check_transport(broker)
    transport: dict[str, Any] = {}
    if broker.startswith(REDIS_SCHEMES):
        transport = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    transport.update(conf.pop("broker_transport_options", None) or {})
    if broker.startswith(AMQP_SCHEMES):
        # Publisher confirms: send_task returns once RabbitMQ took the message (and raises when
        # it refused it), so a claim is marked sent only for a message the broker has. Set
        # after the app's options: an app that turns them off would lose slots silently.
        transport["confirm_publish"] = True
    conf = {"broker_connection_timeout": timeout, **conf, "broker_transport_options": transport}
    app = celery.Celery(main, set_as_current=False)
    app.conf.update({**conf, **FORCED})
    return app
