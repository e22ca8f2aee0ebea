"""Where a cache lives: a local directory or an object-store URI (``s3://``, ``gs://``, ``az://``).

    >>> loc = Location("s3://robot-data/droid-cache", {"aws_region": "us-west-2"})
    >>> manifest = json.loads(loc.read_text("manifest.json"))
    >>> frames = loc.lance("frames/observation.images.wrist.lance")

A cache is a directory of JSON files (``manifest.json``, ``stats.json``) and Lance tables. Lance
reads and writes its tables through its own object store; the JSON files go through
``pyarrow.fs``. Both get their settings from one ``storage_options`` mapping with Lance's key
names (``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``, ``aws_region``,
``aws_endpoint``, ``allow_http``; ``google_service_account``; ``azure_storage_account_name``,
``azure_storage_account_key``, ...), given to Lance as is and translated for ``pyarrow.fs``,
and from the standard environment variables where a key is not given (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL``; ``GOOGLE_APPLICATION_CREDENTIALS``; ``AZURE_STORAGE_ACCOUNT_NAME``,
``AZURE_STORAGE_ACCOUNT_KEY``). Every failure of the store reaches the caller as one
:class:`~robocache.errors.DataError` naming the URI and what to check (a missing bucket or
object, refused credentials, a wrong region, an unreachable endpoint after Lance's retries).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from robocache._optional import require
from robocache.errors import DataError

#: URI schemes served through an object store (``gcs`` and ``abfs`` are aliases Lance takes).
SCHEMES = ("s3", "gs", "gcs", "az", "abfs")

# The object store's request policy when the caller sets none: a stopped server costs a few
# seconds of retries with backoff (Lance's object store doubles its wait between attempts), then
# one error, never a hang.
DEFAULT_OPTIONS = {"client_max_retries": "4", "client_retry_timeout": "60",
                   "connect_timeout": "10s", "timeout": "120s"}


class _ForkGate:
    """Fork-safety of Lance calls. RoboCache's Lance calls run inside :meth:`call`, which
    records that this process made one (:attr:`used`). A fork of this process (``os.fork``,
    multiprocessing's ``fork`` start method, DataLoader workers) first waits until no call is
    in flight and keeps new ones out until the child exists; the child starts with a gate of
    its own, :attr:`forked_after_use` set when this process (or an ancestor it was forked
    from) had made Lance calls: such a child makes its serving calls through a reader process
    (:mod:`robocache.data.reader`), since Lance's runtime does not survive the fork."""

    def __init__(self):
        self.used = self.forked_after_use = False
        self._reset()

    def _reset(self) -> None:
        self.cond = threading.Condition()
        self.active, self.forking = 0, False
        self.local = threading.local()

    def _after_fork_in_child(self) -> None:
        self.forked_after_use = self.forked_after_use or self.used
        self.used = False
        self._reset()

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Hold the gate for one Lance call (or several: re-entered by the same thread)."""
        depth = getattr(self.local, "depth", 0)
        if depth:
            self.local.depth = depth + 1
            try:
                yield
            finally:
                self.local.depth = depth
            return
        with self.cond:
            while self.forking:
                self.cond.wait()
            self.active += 1
            self.used = True
        self.local.depth = 1
        try:
            yield
        finally:
            self.local.depth = 0
            with self.cond:
                self.active -= 1
                if not self.active:
                    self.cond.notify_all()

    def before_fork(self) -> None:
        self.cond.acquire()  # held through the fork: no call starts meanwhile
        self.forking = True
        while self.active:
            self.cond.wait()

    def after_fork_in_parent(self) -> None:
        self.forking = False
        self.cond.notify_all()
        self.cond.release()


#: Every Lance call of RoboCache's serving runs in ``LANCE.call()``.
LANCE = _ForkGate()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=LANCE.before_fork, after_in_parent=LANCE.after_fork_in_parent,
                        after_in_child=LANCE._after_fork_in_child)


def is_uri(where: str | Path) -> bool:
    """Whether ``where`` names an object store (``s3://...``), not a local path."""
    return isinstance(where, str) and urlparse(where).scheme in SCHEMES


class Location:
    """A cache's directory: local, or a prefix in an object store.

    Args:
        where: a local directory, or ``s3://bucket/prefix`` (``gs://``, ``az://``).
        storage_options: object-store settings, Lance's key names (see the module docstring);
            ignored for a local directory.

    Raises:
        DataError: an unknown URI scheme, a URI without a bucket, or storage options that are
            not a mapping of strings.
    """

    def __init__(self, where: str | Path, storage_options: Mapping[str, Any] | None = None):
        text = str(where)
        parsed = urlparse(text)
        if parsed.scheme and len(parsed.scheme) > 1 and parsed.scheme not in SCHEMES \
                and "://" in text:
            raise DataError(f"{text}: unknown storage scheme {parsed.scheme!r}; use a local "
                            f"path or one of {', '.join(s + '://' for s in SCHEMES)}.")
        if storage_options is not None and (not isinstance(storage_options, Mapping) or not all(
                isinstance(k, str) for k in storage_options)):
            raise DataError("`storage_options` must be a mapping of option names to values "
                            f"(e.g. {{'aws_region': 'us-west-2'}}); got {storage_options!r}.")
        self.remote = parsed.scheme in SCHEMES
        self.options = {k: str(v) for k, v in (storage_options or {}).items()}
        if self.remote:
            if not parsed.netloc:
                raise DataError(f"{text}: the URI names no bucket; write "
                                f"{parsed.scheme}://BUCKET/PREFIX.")
            self.scheme, self.bucket = parsed.scheme, parsed.netloc
            self.prefix = parsed.path.strip("/")
            self.uri = f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
            self.path = None
        else:
            self.scheme, self.bucket, self.prefix = "file", "", ""
            self.path = Path(where).expanduser().absolute()
            self.uri = str(self.path)
        self._fs = None

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    def __str__(self) -> str:
        return self.uri

    def __eq__(self, other) -> bool:
        return isinstance(other, Location) and (self.uri, self.options) == \
            (other.uri, other.options)

    def __hash__(self) -> int:
        return hash(self.uri)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None}  # a filesystem handle is per process

    @property
    def name(self) -> str:
        """The last component of the path (the cache's folder name)."""
        return self.path.name if self.path is not None else self.prefix.rsplit("/", 1)[-1]

    def child(self, rel: str) -> str:
        """The URI (or local path) of ``rel`` inside this location."""
        return str(self.path / rel) if self.path is not None else f"{self.uri}/{rel}"

    # ── Lance tables ──────────────────────────────────────────────────

    def lance_options(self) -> dict[str, str] | None:
        """The storage options Lance gets (None for a local directory)."""
        if not self.remote:
            return None
        return {**DEFAULT_OPTIONS, **_env_options(self.scheme), **self.options}

    def lance(self, rel: str, version: int | None = None):
        """The Lance table ``rel`` (at ``version``, else its latest).

        Raises:
            FileNotFoundError: no table there (or not that version).
            DataError: the object store failed (see :func:`store_error`).
        """
        lance = require("lance", "data", "The Lance cache", "pylance")
        uri = self.child(rel)
        try:
            with LANCE.call():
                return lance.dataset(uri, version=version,
                                     storage_options=self.lance_options())
        except (OSError, ValueError) as e:
            if _not_found(e):
                what = f"version {version} of " if version is not None else ""
                raise FileNotFoundError(f"{uri}: no {what}Lance table there") from e
            raise self.error(e, rel) from e

    def lance_exists(self, rel: str) -> bool:
        """Whether a committed Lance table is at ``rel``."""
        try:
            self.lance(rel)
            return True
        except FileNotFoundError:
            return False

    # ── small files (JSON) ────────────────────────────────────────────

    def _filesystem(self):
        if self._fs is None:
            self._fs = _filesystem(self.scheme, {**_env_options(self.scheme), **self.options})
        return self._fs

    def _key(self, rel: str) -> str:
        return "/".join(p for p in (self.bucket, self.prefix, rel) if p)

    def read_bytes(self, rel: str) -> bytes:
        """The file ``rel``'s bytes.

        Raises:
            FileNotFoundError: no such file (naming its URI).
            DataError: the store failed.
        """
        if self.path is not None:
            return (self.path / rel).read_bytes()
        try:
            with self._filesystem().open_input_stream(self._key(rel)) as f:
                return f.read()
        except FileNotFoundError:
            self.check_bucket()
            raise FileNotFoundError(f"{self.child(rel)}: no such object") from None
        except OSError as e:
            raise self.error(e, rel) from e

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode()

    def exists(self, rel: str) -> bool:
        """Whether the file ``rel`` exists."""
        if self.path is not None:
            return (self.path / rel).exists()
        pafs = require("pyarrow.fs", "data", "Object storage")
        try:
            return self._filesystem().get_file_info(self._key(rel)).type != pafs.FileType.NotFound
        except OSError as e:
            raise self.error(e, rel) from e

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write the file ``rel`` whole: locally through a temporary file and a rename, in an
        object store as one object (a reader never sees part of it either way)."""
        if self.path is not None:
            path = self.path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            return
        try:
            with self._filesystem().open_output_stream(self._key(rel)) as f:
                f.write(data)
        except OSError as e:
            raise self.error(e, rel) from e

    def upload(self, local: Path, rel: str) -> None:
        """Copy the local file ``local`` to ``rel`` (an object store only)."""
        pafs = require("pyarrow.fs", "data", "Object storage")
        try:
            pafs.copy_files(str(local), self._key(rel), destination_filesystem=self._filesystem(),
                            source_filesystem=pafs.LocalFileSystem())
        except OSError as e:
            raise self.error(e, rel) from e

    def delete(self, rels: list[str]) -> None:
        """Delete the files ``rels`` (relative to this location), in order; absent ones are
        skipped."""
        for rel in rels:
            if self.path is not None:
                (self.path / rel).unlink(missing_ok=True)
                continue
            try:
                self._filesystem().delete_file(self._key(rel))
            except FileNotFoundError:
                continue
            except OSError as e:
                raise self.error(e, rel) from e

    def sizes(self, rel: str = "") -> dict[str, int]:
        """Every file under ``rel`` (relative to this location) and its size in bytes."""
        if self.path is not None:
            root = self.path / rel
            return {str(p.relative_to(self.path)): p.stat().st_size
                    for p in root.rglob("*") if p.is_file()} if root.is_dir() else {}
        pafs = require("pyarrow.fs", "data", "Object storage")
        base = self._key(rel)
        try:
            infos = self._filesystem().get_file_info(pafs.FileSelector(base, recursive=True,
                                                                       allow_not_found=True))
        except OSError as e:
            raise self.error(e, rel) from e
        top = self._key("")
        return {i.path[len(top) + 1:]: i.size for i in infos if i.type == pafs.FileType.File}

    def manifest(self) -> dict[str, Any]:
        """The cache's ``manifest.json`` as written (see
        :func:`robocache.data.snapshot.servable` for the version a reader serves).

        Raises:
            FileNotFoundError: no ``manifest.json`` there (not a cache, or a wrong path).
            DataError: the manifest is not valid JSON, or the store failed (one line).
        """
        try:
            raw = self.read_bytes("manifest.json")
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(f"{self} is not a RoboCache cache (no manifest.json); "
                                    "build one with `robocache ingest SOURCE DEST`.") from None
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{self.child('manifest.json')} is not valid JSON ({e}); the cache "
                            "is damaged: rebuild it with `robocache ingest SOURCE DEST "
                            "--overwrite`.") from e

    @contextlib.contextmanager
    def reading(self, rel: str) -> Iterator[None]:
        """Reads of the Lance table ``rel``: a failure of the object store (Lance raises
        ``OSError``, ``ValueError`` or ``RuntimeError`` by cause) becomes its one-line
        :class:`~robocache.errors.DataError`; a local cache's errors pass as they are."""
        try:
            yield
        except DataError:
            raise
        except (OSError, ValueError, RuntimeError) as e:
            if not self.remote:
                raise
            raise self.error(e, rel) from e

    # ── errors ────────────────────────────────────────────────────────

    def check_bucket(self) -> None:
        """Raise the one-line error for a bucket that does not exist (an object store)."""
        if not self.remote:
            return
        pafs = require("pyarrow.fs", "data", "Object storage")
        try:
            missing = self._filesystem().get_file_info(self.bucket).type == \
                pafs.FileType.NotFound
        except OSError as e:
            raise self.error(e, "") from e
        if missing:
            raise DataError(f"{self.uri}: the bucket {self.bucket!r} does not exist (or these "
                            "credentials cannot see it); check the URI's bucket name.")

    def error(self, e: BaseException, rel: str = "") -> DataError:
        """``e`` (from the object store, about ``rel``) as one line naming the URI and the
        fix: :func:`store_error`."""
        return store_error(self.child(rel) if rel else self.uri, e)


def open_version(location: Location, rel: str, version: int):
    """Table ``rel`` at ``version``, or at its latest when that version's manifest was removed
    since (the build that extended or compacted the cache cleaned old versions up): the rows a
    reader of ``version`` reads by address are in the latest version too, unless compaction
    rewrote them (then their addresses are gone and a read says so)."""
    try:
        return location.lance(rel, version)
    except FileNotFoundError:
        return location.lance(rel)


def store_error(uri: str, e: BaseException) -> DataError:
    """One line for an object store's failure ``e`` at ``uri``, by its cause: refused
    credentials, a wrong region, a missing bucket, an unreachable endpoint, else the store's
    own first line."""
    text = str(e)
    low = text.lower()
    if any(s in low for s in ("invalidaccesskeyid", "signaturedoesnotmatch", "accessdenied",
                              "access_denied",
                              "access denied", "forbidden", "403", "invalidclienttokenid",
                              "expiredtoken", "authorizationfailure", "authenticationfailed",
                              "unauthenticated", "401")):
        why = ("the store refused the credentials; check AWS_ACCESS_KEY_ID / "
               "AWS_SECRET_ACCESS_KEY (or the storage options' keys) and their permissions")
    elif any(s in low for s in ("permanentredirect", "authorizationheadermalformed",
                                "wrong region", "incorrect region", "301 moved",
                                "the bucket is in this region", "illegallocationconstraint")):
        why = ("the bucket is in another region; set AWS_REGION (or storage option "
               "`aws_region`) to the bucket's region")
    elif any(s in low for s in ("nosuchbucket", "bucket does not exist",
                                "specified bucket does not exist")):
        why = "the bucket does not exist; check the URI's bucket name"
    elif any(s in low for s in ("connect", "timed out", "timeout", "dns", "resolve",
                                "network", "error sending request", "broken pipe",
                                "connection reset")):
        why = ("the object store did not answer (after retries with backoff); check the "
               "endpoint (AWS_ENDPOINT_URL or storage option `aws_endpoint`) and the network")
    else:
        first = re.sub(r"\s+", " ", text.split(", /")[0]).strip()[:300]
        why = f"the object store failed: {first}"
    return DataError(f"{uri}: {why}.")


def _not_found(e: BaseException) -> bool:
    low = str(e).lower()
    return isinstance(e, FileNotFoundError) or ("not found" in low and (
        "_versions" in low or "dataset at path" in low or "version" in low))


def _env_options(scheme: str) -> dict[str, str]:
    """Storage options from the standard environment variables of ``scheme``'s store (the
    ones ``pyarrow.fs`` and Lance would not both read by the same names)."""
    env = os.environ
    out: dict[str, str] = {}
    if scheme == "s3":
        endpoint = env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT")
        if endpoint:
            out["aws_endpoint"] = endpoint
            if endpoint.startswith("http://"):
                out["allow_http"] = "true"
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if region:
            out["aws_region"] = region
    return out


def _option(options: Mapping[str, str], *names: str) -> str | None:
    for n in names:
        if n in options:
            return options[n]
    return None


def _filesystem(scheme: str, options: Mapping[str, str]):
    """The ``pyarrow.fs`` filesystem of ``scheme`` configured from Lance-named ``options``."""
    pafs = require("pyarrow.fs", "data", "Object storage")
    if scheme == "s3":
        endpoint = _option(options, "aws_endpoint", "aws_endpoint_url", "endpoint",
                           "endpoint_url")
        kwargs: dict[str, Any] = {
            "access_key": _option(options, "aws_access_key_id", "access_key_id"),
            "secret_key": _option(options, "aws_secret_access_key", "secret_access_key"),
            "session_token": _option(options, "aws_session_token", "session_token"),
            "region": _option(options, "aws_region", "region"),
            # one PUT per small file (a multipart upload is what some S3 servers refuse)
            "allow_delayed_open": True,
            "connect_timeout": _seconds(options.get("connect_timeout"), 10.0),
            "request_timeout": _seconds(options.get("timeout"), 120.0),
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(
                max_attempts=int(options.get("client_max_retries", 4)) + 1),
        }
        if endpoint:
            parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
            kwargs["endpoint_override"] = parsed.netloc + parsed.path.rstrip("/")
            kwargs["scheme"] = parsed.scheme
        if kwargs["access_key"] is None or kwargs["secret_key"] is None:
            kwargs.pop("access_key"), kwargs.pop("secret_key"), kwargs.pop("session_token")
        if kwargs["region"] is None:
            kwargs.pop("region")
        return pafs.S3FileSystem(**kwargs)
    if scheme in ("gs", "gcs"):
        kwargs = {}
        endpoint = _option(options, "google_endpoint", "endpoint")
        if endpoint:
            parsed = urlparse(endpoint)
            kwargs.update(endpoint_override=parsed.netloc, scheme=parsed.scheme)
        return pafs.GcsFileSystem(**kwargs)
    if scheme in ("az", "abfs"):
        account = _option(options, "azure_storage_account_name", "account_name") or \
            os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
        if not account:
            raise DataError("an az:// cache needs the storage account: set "
                            "AZURE_STORAGE_ACCOUNT_NAME or storage option "
                            "`azure_storage_account_name`.")
        kwargs = {"account_name": account}
        key = _option(options, "azure_storage_account_key", "account_key") or \
            os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")
        if key:
            kwargs["account_key"] = key
        endpoint = _option(options, "azure_storage_endpoint", "endpoint")
        if endpoint:
            parsed = urlparse(endpoint)
            kwargs.update(blob_storage_authority=parsed.netloc + parsed.path.rstrip("/"),
                          blob_storage_scheme=parsed.scheme)
        return pafs.AzureFileSystem(**kwargs)
    raise DataError(f"unknown storage scheme {scheme!r}.")


def _seconds(value: str | None, default: float) -> float:
    """Lance's duration strings (``"10s"``, ``"500ms"``, ``"2m"``) in seconds."""
    if value is None:
        return default
    m = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s|m|h)?\s*", str(value))
    if not m:
        return default
    return float(m.group(1)) * {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[
        m.group(2)]

