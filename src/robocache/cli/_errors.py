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

Ctrl-C and SIGTERM (sent to a whole process group by a terminal or a scheduler) stop a command
with its one line whatever its worker processes are doing: a process the command forked that
still runs the command's handlers ends as the signal's default would (no traceback; workers set
the defaults at start-up, :func:`robocache.data.cameras.die_with_parent`), and a signal that
comes while the command forks is acted on once the fork is done (raised inside an at-fork hook,
Python would drop it).
"""

from __future__ import annotations

import errno
import re
import sys
import threading
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
# A handler that raises while this process forks runs inside an at-fork hook (logging's,
# Lance's), where Python prints "Exception ignored" and drops the exception: the Ctrl-C is
# lost, or a worker prints a traceback. While a fork is under way a signal is only noted,
# and sent again once the fork is done (``_forking``: this process is forking).
_forking: list[bool] = [False]
_deferred: list[int] = []
_hooked: list[bool] = [False]
# whether a command body runs with these handlers (a deferred signal is sent again only then:
# afterwards the default handler would kill the process), and the lock that orders a resend
# before the handlers are restored
_active: list[bool] = [False]
_resending = threading.Lock()
# the process whose command body runs with these handlers (a process it forks inherits them
# until its own start-up sets its own)
_owner: list[int] = [0]


def _on_sigterm(signum, frame):
    if _inherited(signum):
        return
    _received.append(signum)
    if _forking[0]:
        _deferred.append(signum)
        return
    raise Terminated()


def _on_sigint(signum, frame):
    if _inherited(signum):
        return
    _received.append(signum)
    if _forking[0]:
        _deferred.append(signum)
        return
    raise KeyboardInterrupt()


def _inherited(signum: int) -> bool:
    """Whether this is a process the command forked, running the command's handler it
    inherited (a worker before its start-up set its own): there the signal ends the process
    as its default does, without the traceback the handler's exception would print."""
    import os
    import signal

    if os.getpid() == _owner[0]:
        return False
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return True


def _fork_begins() -> None:
    _forking[0] = True


def _fork_done_parent() -> None:
    """After a fork, in this process: send again the signals that came during it, from a
    thread a moment later (a handler run inside this hook would raise into the void)."""
    import os

    _forking[0] = False
    if _deferred:
        sig = _deferred[-1]
        _deferred.clear()
        threading.Timer(0.05, _resend, (os.getpid(), sig)).start()


def _resend(pid: int, sig: int) -> None:
    import os

    with _resending:
        if _active[0]:  # else the command is done: its exit already says the signal
            os.kill(pid, sig)


def _fork_done_child() -> None:
    """After a fork, in the child: the signals the parent deferred are the parent's (a
    worker's own handlers are set by its start-up)."""
    _forking[0] = False
    _deferred.clear()


def _hook_forks() -> None:
    """Register the at-fork hooks of :data:`_forking` once per process (registered last, the
    ``before`` hook runs first and the ``after`` hooks last: every other hook runs inside)."""
    import os

    if not _hooked[0] and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_fork_begins, after_in_parent=_fork_done_parent,
                            after_in_child=_fork_done_child)
        _hooked[0] = True


def _stopped(sig: int, verbose: bool) -> typer.Exit:
    """The exit of a command stopped by SIGTERM (143) or Ctrl-C (130). Worker processes that
    the signal ended are not errors any more: PyTorch's DataLoader watches its workers with a
    SIGCHLD handler that raises when one died of a signal, and its iterators, collected as
    the interpreter exits, join their workers: a traceback per iterator after the one line.
    That handler is put back to the default here."""
    import os
    import signal

    if hasattr(signal, "SIGCHLD") and os.getpid() == _owner[0] and \
            threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
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

    from robocache.errors import RoboCacheError

    main = threading.current_thread() is threading.main_thread()
    if main:  # a handler installed outside Python reads as None: restore the default then
        _hook_forks()
        previous = {sig: signal.getsignal(sig) or signal.SIG_DFL
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        signal.signal(signal.SIGTERM, _on_sigterm)
        if previous[signal.SIGINT] is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_sigint)
    _received.clear()
    _active[0] = main
    if main:
        import os

        _owner[0] = os.getpid()
    try:
        yield
        for sig in (signal.SIGTERM, signal.SIGINT):
            if sig in _received:  # its exception was dropped (a library's callback): stop
                raise _stopped(sig, verbose)
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
            with _resending:
                _active[0] = False
                for sig, handler in previous.items():
                    signal.signal(sig, handler)


def exit_code(counts: dict) -> int:
    """The exit code of a finished ingest from its manifest ``counts``: 0 every episode read
    is cached, 3 some were quarantined, 4 none is cached."""
    if counts.get("cached", 0) == 0:
        return EXIT_NOTHING_CACHED
    return EXIT_QUARANTINED if counts.get("quarantined", 0) else EXIT_OK
