"""One way for every ``robocache`` command to fail: one line on stderr and a documented exit code.

    error: <the problem>; <the fix>

Exit codes shared by the data commands (``ingest``, ``inspect`` and the commands built on them):

====  ==========================================================================
0     success (``ingest``: every episode read is cached)
1     internal error (a bug: the line says so; ``--verbose`` shows the traceback)
2     bad usage or input: a missing or malformed dataset, a bad option, an unwritable or
      busy destination, a full disk
3     completed, but some episodes were quarantined (the summary lists them)
4     nothing cached: every episode read was quarantined, or the source has none
130   interrupted (Ctrl-C); what was committed stays, re-running resumes
143   terminated (SIGTERM, e.g. a job scheduler's stop); as 130
====  ==========================================================================

Commands wrap their body in :func:`cli_errors`; expected failures (:class:`RoboCacheError`,
``OSError``) become the one line, anything else is reported as an internal error. ``--verbose``
prints the traceback before the line.
"""

from __future__ import annotations

import errno
import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import typer

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_QUARANTINED = 3
EXIT_NOTHING_CACHED = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM

VERBOSE_OPTION_HELP = "On failure, print the traceback before the one-line error."

STORAGE_OPTION_HELP = ("An object-store setting for a cache at s3://, gs:// or az:// (Lance's "
                       "names: aws_endpoint, aws_region, aws_access_key_id...); repeat for "
                       "several. Otherwise the standard environment variables (AWS_REGION, "
                       "AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL...) are used.")

# What to do about an OSError, by errno (the rest: check the path and its permissions).
_OS_FIXES = {
    errno.ENOENT: "check the path",
    errno.EACCES: "choose a location you can write to, or fix its permissions",
    errno.EPERM: "choose a location you can write to, or fix its permissions",
    errno.EROFS: "choose a destination on a writable file system",
    errno.ENOSPC: "free disk space (or choose another destination), then re-run to resume",
    errno.EFBIG: "raise the file-size limit (ulimit -f) or free space, then re-run to resume",
    errno.EDQUOT: "free space within your quota, then re-run to resume",
    errno.ENOTDIR: "pass a directory",
    errno.EISDIR: "pass a file, not a directory",
}


class CommandError(Exception):
    """An expected failure a command detects itself: ``problem`` and ``fix`` form the line."""

    def __init__(self, problem: str, fix: str, code: int = EXIT_USAGE):
        super().__init__(f"{problem}; {fix}")
        self.code = code


def storage_option_flag():
    """The ``--storage-option KEY=VALUE`` option (repeatable) of the commands that read a cache
    given as a URI; :func:`storage_options` parses what it collects."""
    return typer.Option(None, "--storage-option", metavar="KEY=VALUE", help=STORAGE_OPTION_HELP)


def storage_options(items: list[str] | None) -> dict[str, str] | None:
    """``--storage-option`` values as the mapping :class:`~robocache.data.location.Location`
    takes (``None`` when none was given).

    Raises:
        CommandError: an item is not ``KEY=VALUE`` with a non-empty key.
    """
    if not items:
        return None
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not (sep and key.strip()):
            raise CommandError(f"--storage-option {item!r} is not KEY=VALUE",
                               "pass e.g. --storage-option aws_region=us-west-2")
        out[key.strip()] = value
    return out


def cache_argument(text: str):
    """A command's cache argument as :class:`~robocache.data.location.Location` takes it: a
    URI (``s3://bucket/prefix``; an unknown scheme too, for Location to name it) as given,
    anything else as a local :class:`~pathlib.Path` (a typer ``Path`` argument would turn
    ``s3://b/x`` into ``s3:/b/x``)."""
    from pathlib import Path

    return text if "://" in text else Path(text)


# A Rust library's source location in its error text (pylance: ", /home/.../commit.rs:1663:50")
_RUST_LOCATION = re.compile(r",?\s*\S+\.rs:\d+:\d+")


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space, and
    without the source locations a Rust library appends to its errors."""
    return " ".join(_RUST_LOCATION.sub("", str(text)).split())


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that a command stops as on Ctrl-C."""


# the signals received while a command body runs: a library may catch the exception a handler
# raises inside its own call and raise another (Lance: ``ArrowInvalid: External error:
# Terminated``), and the signal must still decide the exit code
_received: list[int] = []


def _on_sigterm(signum, frame):
    _received.append(signum)
    raise Terminated()


def _on_sigint(signum, frame):
    _received.append(signum)
    raise KeyboardInterrupt()


def _stopped(sig: int, verbose: bool) -> typer.Exit:
    """The exit of a command stopped by SIGTERM (143) or Ctrl-C (130)."""
    import signal

    what, code = ("terminated", EXIT_TERMINATED) if sig == signal.SIGTERM else \
        ("interrupted", EXIT_INTERRUPTED)
    return fail(f"{what}; re-run the same command to resume", code, verbose=verbose)


def fail(message: str, code: int, *, verbose: bool = False) -> typer.Exit:
    """Print ``error: <message>`` (one line) to stderr (after the traceback when ``verbose``)
    and return the :class:`typer.Exit` to raise."""
    if verbose and sys.exc_info()[0] is not None:
        traceback.print_exc(file=sys.stderr)
    typer.echo(f"error: {one_line(message)}", err=True)
    return typer.Exit(code)


def _os_message(e: OSError) -> str:
    if e.strerror is None:  # raised with a message: ours, or a library's ("... (os error 27)")
        what = str(e).rstrip(". ")
        found = re.search(r"\(os error (\d+)\)", what)
        code = errno.ENOENT if isinstance(e, FileNotFoundError) else \
            int(found.group(1)) if found else e.errno
    else:
        what = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
        code = e.errno
    return f"{what}; {_OS_FIXES.get(code or -1, 'check the path and its permissions')}"


@contextmanager
def cli_errors(verbose: bool = False) -> Iterator[None]:
    """Turn the failures of a command body into one line on stderr and an exit code.

    :class:`CommandError` → its own code; :class:`~robocache.errors.RoboCacheError` (messages
    name the problem and the fix) and ``OSError`` → 2; ``KeyboardInterrupt`` → 130; SIGTERM →
    143 (handled as Ctrl-C while the body runs, in the main thread); anything else → 1,
    reported as an internal error.
    """
    import signal
    import threading

    from robocache.errors import RoboCacheError

    main = threading.current_thread() is threading.main_thread()
    if main:  # a handler installed outside Python reads as None: restore the default then
        previous = {sig: signal.getsignal(sig) or signal.SIG_DFL
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        signal.signal(signal.SIGTERM, _on_sigterm)
        if previous[signal.SIGINT] is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_sigint)
    _received.clear()
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except CommandError as e:
        raise fail(str(e), e.code, verbose=verbose) from e
    except RoboCacheError as e:
        raise fail(str(e), EXIT_USAGE, verbose=verbose) from e
    except OSError as e:
        raise fail(_os_message(e), EXIT_USAGE, verbose=verbose) from e
    except Terminated as e:
        raise _stopped(signal.SIGTERM, verbose) from e
    except KeyboardInterrupt as e:
        raise _stopped(signal.SIGINT, verbose) from e
    except Exception as e:
        for sig in (signal.SIGTERM, signal.SIGINT):
            if sig in _received:  # the signal's exception, wrapped by a library
                raise _stopped(sig, verbose) from e
        # a bug: say so in one line, keep the traceback for --verbose
        raise fail(f"internal error ({type(e).__name__}: {e}); re-run with --verbose and "
                   "report the traceback", EXIT_INTERNAL, verbose=verbose) from e
    finally:
        if main:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def exit_code(counts: dict) -> int:
    """The exit code of a finished ingest from its manifest ``counts``: 0 every episode read
    is cached, 3 some were quarantined, 4 none is cached."""
    if counts.get("cached", 0) == 0:
        return EXIT_NOTHING_CACHED
    return EXIT_QUARANTINED if counts.get("quarantined", 0) else EXIT_OK
