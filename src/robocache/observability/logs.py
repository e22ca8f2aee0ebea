"""Structured logs: one event per line, as JSON objects or ``key=value`` text.

    from robocache.observability import logs
    logs.configure("json")                 # robocache ... --log-format json
    logs.event("ingest.episode", status="cached", dataset="panda", episode=3)

Events go to the ``robocache`` logger (INFO; problems at WARNING/ERROR), so an application's own
logging configuration receives them too. Their fields use the names and label values of the
metrics (``metric`` names the counter an event increments, ``dataset``, ``reason``, ``stage``...).
Unconfigured, Python drops INFO events and prints warnings as plain lines on stderr.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
from typing import Any

LOGGER = logging.getLogger("robocache")
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "event", ...fields}`` per record, one line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": _dt.datetime.fromtimestamp(record.created, _dt.timezone.utc)
               .isoformat(timespec="milliseconds"),
               "level": record.levelname.lower()}
        out["event"] = getattr(record, "event", None) or record.getMessage()
        if out["event"] != record.getMessage():
            out["message"] = record.getMessage()
        out.update(getattr(record, "fields", {}))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """``<level> <event> key=value ...`` per record."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, "fields", {}).items())
        name = getattr(record, "event", None) or record.getMessage()
        text = "" if name == record.getMessage() else f" {record.getMessage()}"
        return f"{record.levelname.lower()} {name}{text} {fields}".rstrip()


_handler: logging.Handler | None = None


def configure(fmt: str = "text", level: int = logging.INFO, stream=None) -> None:
    """Send RoboCache events to ``stream`` (default stderr) in ``fmt`` (``text`` or ``json``).

    Raises:
        DataError: an unknown format.
    """
    from robocache.errors import DataError

    global _handler
    if fmt not in FORMATS:
        raise DataError(f"`--log-format` must be one of {', '.join(FORMATS)}; got {fmt!r}.")
    if _handler is not None:
        LOGGER.removeHandler(_handler)
    _handler = logging.StreamHandler(stream or sys.stderr)
    _handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    LOGGER.addHandler(_handler)
    LOGGER.setLevel(level)
    LOGGER.propagate = False


def configured() -> bool:
    """Whether :func:`configure` installed RoboCache's handler."""
    return _handler is not None


def reset() -> None:
    """Undo :func:`configure`: events go to the application's logging setup again."""
    global _handler
    if _handler is not None:
        LOGGER.removeHandler(_handler)
        _handler = None
    LOGGER.setLevel(logging.NOTSET)
    LOGGER.propagate = True


def event(name: str, level: int = logging.INFO, message: str | None = None,
          **fields: Any) -> None:
    """Log event ``name`` with ``fields`` (free when the level is off). ``message``, a sentence
    for people, is what an unconfigured logger prints (warnings and errors)."""
    if LOGGER.isEnabledFor(level):
        LOGGER.log(level, message or name, extra={"event": name, "fields": fields})
