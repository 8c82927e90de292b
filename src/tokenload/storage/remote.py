"""Objects behind fsspec URLs: one stat, ranged GETs with retries, typed failures, counters.

Every call goes through ``call``: a failure that may pass (throttling, 5xx, timeouts, refused or
dropped connections) is retried with exponential backoff and counted, and logged once per fault:
a request's first retry is a WARNING stating the limit (DEBUG when another request of this
process is already retrying: one outage, one warning), its later retries are DEBUG, and a request
that succeeds after retries says so at INFO; a permanent one
(missing object, denied access, no credentials) raises at once. Either way the caller gets a
``StorageError`` naming the object and a hint, never a botocore or aiohttp exception. For S3 the
client's own retry loops are reduced to one attempt so that ``TOKENLOAD_RETRIES`` is the one
number that decides how long a dead server is waited for, and every retry is counted here. Every
attempt has a connect and a read timeout (``TOKENLOAD_CONNECT_TIMEOUT``/``READ_TIMEOUT``): a server
that accepts and never answers is a failed attempt, retried, then a ``StorageError``, never a hang.
A ``tokenload`` command gives up on an endpoint that never answered within
``TOKENLOAD_FIRST_CONTACT_TIMEOUT``; a process with a read budget (``options.retry_reads_for``,
the loader's ``worker_timeout``) retries by time instead of by count.

Clients (botocore's for every read of ``s3://``: HEADs, ranged GETs, index downloads; an fsspec
filesystem for other protocols and for writes and listings) are created on first use in the
process that reads and kept per process id and digest of the ``AWS_*`` environment, so no client
crosses a fork or a pickle and a changed endpoint or key is seen. botocore's sessions (parsed
service data, no connections, no credentials after a fork) do cross a fork: a forked worker makes
its client from the training process's session in a tenth of the time.

Messages carry the exception type and its first line, never storage options or the environment;
the credentials stay with the client library.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import StorageError, TokenloadError, require
from .options import StorageOptions, read_retry_window

logger = logging.getLogger(__name__)
T = TypeVar("T")

_STATS: Counter[str] = Counter()
_FILESYSTEMS: dict[tuple[Any, ...], Any] = {}
_STATS_LOCK = threading.Lock()
_STAT_NAMES = (
    "gets",
    "bytes",
    "chunk_hits",
    "chunk_misses",
    "prefetched",
    "direct_reads",
    "retries",
    "index_downloads",
    "index_hits",
)

# connections the one client per process keeps: several files' part GETs (TOKENLOAD_GET_THREADS
# each) share it, and a full pool closes the connections it cannot keep (botocore's default is 10)
_POOL = 64

_CONNECT_HINT = (
    "check the endpoint (AWS_ENDPOINT_URL for S3-compatible servers) and the network;"
    " the server did not answer after the retries (TOKENLOAD_RETRIES,"
    " TOKENLOAD_RETRY_BACKOFF, TOKENLOAD_CONNECT_TIMEOUT, TOKENLOAD_READ_TIMEOUT)"
)
_CREDENTIALS_HINT = (
    "check the bucket's name (some servers deny access to a bucket that does not"
    " exist) and the credentials the client library finds"
    " (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/credentials):"
    " they must be allowed to read it, and to write it for outputs"
)


def is_url(path: str) -> bool:
    """Whether ``path`` names an object behind an fsspec protocol (``s3://``, ``gs://``, ...)."""
    return "://" in path


def count(name: str, amount: int = 1) -> None:
    with _STATS_LOCK:
        _STATS[name] += amount


def stats() -> dict[str, int]:
    """This process's storage counters: GETs, bytes, chunk cache hits/misses, chunks read ahead,
    reads fetched alone (random reads), retries, index downloads and index cache hits."""
    with _STATS_LOCK:
        return {name: int(_STATS[name]) for name in _STAT_NAMES}


def filesystem(url: str, options: StorageOptions | None = None) -> tuple[Any, str]:
    """``(fs, path)`` for ``url``, created in this process on first use (with the timeouts of
    ``options``, by default the environment's)."""
    fsspec = require("fsspec", "s3", f"reading {url}")
    protocol = url.split("://", 1)[0]
    options = options or StorageOptions.from_env()
    kwargs: dict[str, Any] = {}
    if protocol in ("s3", "s3a"):
        require("s3fs", "s3", f"reading {url}")
        kwargs = {"config_kwargs": _client_config(options)}
    # fsspec's instance cache ignores the environment, so a process that changes AWS_* (another
    # endpoint or key) would keep talking to the first server: keyed here by it too, in memory only
    key = (os.getpid(), protocol, _environment(), options.connect_timeout_s, options.read_timeout_s)
    fs = _FILESYSTEMS.get(key)
    try:
        if fs is None:
            fs = _FILESYSTEMS[key] = fsspec.filesystem(protocol, skip_instance_cache=True, **kwargs)
            if kwargs:
                fs.retries = 1  # s3fs's own loop (a class attribute): the retries are ours
        return fs, fs._strip_protocol(url)
    except TokenloadError:
        raise
    except Exception as exc:
        raise StorageError(
            f"cannot resolve the URL ({_reason(exc)})",
            path=url,
            hint="check the URL's protocol and that its fsspec package is installed",
        ) from None


def _client_config(options: StorageOptions) -> dict[str, Any]:
    """botocore's settings: one attempt (``total_max_attempts``; its ``max_attempts`` counts
    retries, and 1 made every attempt two, 2 x 60 s against a silent server) and our timeouts."""
    return {
        "retries": {"total_max_attempts": 1, "mode": "standard"},
        "connect_timeout": options.connect_timeout_s,
        "read_timeout": options.read_timeout_s,
    }


def ranged_get(
    url: str, start: int, end: int, options: StorageOptions | None = None
) -> tuple[bytes, str | None]:
    """Bytes ``[start, end)`` of ``url`` and the ETag the answer carried (None if unknown).

    ``s3://`` goes straight to botocore (the client boto3 wraps): measured on SeaweedFS, s3fs's
    aiohttp body reads reach 50-70% of botocore's MB/s for 8-64 MiB GETs. Other protocols go
    through fsspec."""
    protocol, rest = url.split("://", 1)
    if protocol in ("s3", "s3a"):
        bucket, _, key = rest.partition("/")
        try:
            answer = _botocore(options).get_object(
                Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}"
            )
        except Exception as exc:
            raise _translated(exc) from None
        _check_range(answer, url, start, end)
        try:
            return answer["Body"].read(), str(answer.get("ETag", "")).strip('"') or None
        except Exception as exc:
            raise _translated(exc) from None
    fs, path = filesystem(url, options)
    return fs.cat_file(path, start=start, end=end), None


def _check_range(answer: Any, url: str, start: int, end: int) -> None:
    """A ranged GET's answer holds the bytes asked for: its ``Content-Range`` starts at
    ``start``. An endpoint may ignore ``Range`` and answer 200 with the whole object (HTTP
    allows it): only an object that begins at ``start = 0`` and fits the range is then the same
    bytes; any other such answer is a StorageError, never bytes from another place."""
    told = answer.get("ContentRange")
    if told is not None:
        first = str(told).removeprefix("bytes ").split("-", 1)[0]
        if first.isdigit() and int(first) == start:
            return
    elif start == 0 and int(answer.get("ContentLength", end + 1)) <= end:
        return
    with contextlib.suppress(Exception):
        answer["Body"].close()
    got = f"bytes {told}" if told else "the whole object (no Content-Range: it ignored the range)"
    raise StorageError(
        f"a read of bytes [{start}, {end}) was answered with {got}; expected those bytes (206"
        " Partial Content)",
        path=url,
        hint="use an S3-compatible endpoint (or proxy) that serves Range requests",
    )


def ranged_get_into(
    url: str, start: int, out: memoryview, options: StorageOptions | None = None
) -> tuple[int, str | None]:
    """Bytes ``[start, start + len(out))`` of ``url`` written into ``out``: how many the server
    sent (fewer when the object is now shorter) and the answer's ETag (None if unknown).

    For ``s3://`` the body goes from the socket straight into ``out`` through the ``readinto`` of
    the ``http.client`` response under botocore's body (private attributes, checked, with a
    read-and-copy fallback): no bytes object of the part's size to allocate and fault in, no copy
    (urllib3's own ``readinto`` reads into a temporary and copies). A body that ends early is a
    dropped connection, raised as ``ConnectionError`` so that ``call`` retries it."""
    end = start + len(out)
    protocol, rest = url.split("://", 1)
    if protocol not in ("s3", "s3a"):
        data, tag = ranged_get(url, start, end, options)
        out[: len(data)] = data
        return len(data), tag
    bucket, _, key = rest.partition("/")
    try:
        answer = _botocore(options).get_object(
            Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}"
        )
    except Exception as exc:
        raise _translated(exc) from None
    _check_range(answer, url, start, end)
    tag = str(answer.get("ETag", "")).strip('"') or None
    sent = min(int(answer.get("ContentLength", len(out))), len(out))
    body = answer["Body"]
    stream: Any = getattr(body, "_raw_stream", None)
    source: Any = getattr(stream, "_fp", None)
    if not hasattr(source, "readinto") or not hasattr(stream, "release_conn"):
        data = body.read()
        out[: len(data)] = data
        return len(data), tag
    try:
        _fill(source, out[:sent])
    except BaseException:
        stream.close()  # a half-read answer: its connection is not reused
        raise
    if source.isclosed():
        stream.release_conn()
    else:
        stream.close()
    return sent, tag


def get_to_file(url: str, local: str, options: StorageOptions) -> str | None:
    """The object ``url`` written to the local file ``local`` (replaced), one GET streamed in
    8 MiB pieces; the ETag its answer carried (None if unknown). ``s3://`` through botocore's
    client, other protocols through fsspec."""
    protocol, rest = url.split("://", 1)
    if protocol not in ("s3", "s3a"):
        fs, path = filesystem(url, options)
        fs.get_file(path, local)
        return None
    bucket, _, key = rest.partition("/")
    try:
        answer = _botocore(options).get_object(Bucket=bucket, Key=key)
    except Exception as exc:
        raise _translated(exc) from None
    body = answer["Body"]
    try:
        f = open(local, "wb")  # noqa: SIM115 (its errors are the local file's, told apart)
    except OSError as exc:
        raise LocalWriteError(exc) from None
    with f:
        for piece in iter(lambda: body.read(8 << 20), b""):  # a dropped connection: retried
            try:
                f.write(piece)
            except OSError as exc:
                raise LocalWriteError(exc) from None
    return str(answer.get("ETag", "")).strip('"') or None


class LocalWriteError(TokenloadError):
    """``get_to_file`` could not write its local file (``os_error``): not a failure of the
    storage, so ``call`` does not retry it."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


def _fill(source: Any, out: memoryview) -> None:
    got = 0
    while got < len(out):
        n = source.readinto(out[got:])
        if not n:
            raise ConnectionError(f"the answer ended after {got} of {len(out)} bytes")
        got += n


def _botocore(options: StorageOptions | None = None) -> Any:
    """This process's botocore S3 client for ``options``' timeouts and the ``AWS_*`` environment,
    made from ``_session()``."""
    options = options or StorageOptions.from_env()
    environment = _environment()
    key = ("botocore", os.getpid(), environment, options.connect_timeout_s, options.read_timeout_s)
    client = _FILESYSTEMS.get(key)
    if client is None:
        config = require("botocore.config", "s3", "reading s3:// token files")
        client = _FILESYSTEMS[key] = _session(environment).create_client(
            "s3", config=config.Config(**_client_config(options), max_pool_connections=_POOL)
        )
    return client


#: botocore sessions by digest of the ``AWS_*`` environment. Unlike clients they are kept across
#: a fork: a session holds the service model, endpoint rules and event handlers botocore parses
#: from its data files, and a forked loader worker that makes its client from the training
#: process's session spends ~20 ms of CPU on it instead of 150-500 ms (measured on 2 cores), the
#: bulk of a fresh worker's first read of an ``s3://`` file. Credentials are not kept
#: (``_after_fork``).
_SESSIONS: dict[str, Any] = {}


def _session(environment: str) -> Any:
    session = _SESSIONS.get(environment)
    if session is None:
        botocore_session = require("botocore.session", "s3", "reading s3:// token files")
        session = _SESSIONS[environment] = botocore_session.get_session()
    return session


def _after_fork() -> None:
    """In a forked child: the sessions' resolved credentials are dropped and found again on first
    use (refreshable ones carry a lock that another thread may have held at the fork)."""
    for session in _SESSIONS.values():
        if hasattr(session, "_credentials"):
            session._credentials = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _environment() -> str:
    """A digest of this process's ``AWS_*`` variables: clients are keyed by it, so a changed
    endpoint or key gets a new client, and no secret is kept outside the environment."""
    items = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))
    return hashlib.sha256(repr(items).encode()).hexdigest()


def _translated(exc: Exception) -> Exception:
    """A botocore ClientError as the Python exception s3fs would raise (NoSuchKey ->
    FileNotFoundError, AccessDenied -> PermissionError, ...); others unchanged."""
    if getattr(exc, "response", None) is None:
        return exc
    from s3fs.errors import translate_boto_error

    translated: Exception = translate_boto_error(exc)
    return translated


@dataclass(frozen=True)
class ObjectInfo:
    """What identifies an object's content: its size and ETag (or modification time)."""

    size: int
    tag: str


def info(url: str, options: StorageOptions) -> ObjectInfo:
    """Size and ETag (or mtime) of ``url``, one HEAD, retried like a GET. ``s3://`` goes through
    botocore's client, as the GETs do: a loader worker needs no second client library (s3fs's
    session and event loop thread cost a fresh worker ~0.35 s of CPU before its first read)."""
    protocol, rest = url.split("://", 1)
    if protocol in ("s3", "s3a"):
        bucket, _, key = rest.partition("/")
        try:
            head = call(url, "read the object's size", lambda: _head(bucket, key, options), options)
        except StorageError as exc:
            if "does not exist" in exc.message and _is_folder(url, options):
                raise _folder_error(url) from None
            raise
        tag = head.get("ETag") or head.get("LastModified") or ""
        return ObjectInfo(int(head["ContentLength"]), str(tag).strip('"'))
    fs, path = filesystem(url, options)
    found = call(url, "read the object's size", lambda: fs.info(path, refresh=True), options)
    if found.get("type") == "directory":
        raise _folder_error(url)
    tag = (
        found.get("ETag")
        or found.get("etag")
        or found.get("mtime")
        or found.get("LastModified")
        or ""
    )
    return ObjectInfo(int(found["size"]), str(tag).strip('"'))


def _head(bucket: str, key: str, options: StorageOptions) -> dict[str, Any]:
    try:
        head: dict[str, Any] = _botocore(options).head_object(Bucket=bucket, Key=key)
    except Exception as exc:
        raise _translated(exc) from None
    return head


def _is_folder(url: str, options: StorageOptions) -> bool:
    """Whether a missing object's name is a folder (a prefix of other objects); False when that
    cannot be found out."""
    fs, path = filesystem(url, options)
    try:
        return bool(fs.info(path, refresh=True).get("type") == "directory")
    except Exception:
        return False


def _folder_error(url: str) -> StorageError:
    return StorageError(
        "is a folder, expected an object",
        path=url,
        hint="pass the token file's prefix (PREFIX for PREFIX.bin + PREFIX.idx)",
    )


#: Retries of an endpoint that has not answered (refused, unresolvable host, silent) while this
#: process has had no answer yet; None: all of TOKENLOAD_RETRIES. The CLI sets a few, and then
#: also gives up after TOKENLOAD_FIRST_CONTACT_TIMEOUT: a command whose first request gets no
#: answer has a mistyped or black-holed endpoint far more often than a restarting server, and
#: should not sit through minutes of backoff. A training process keeps every retry, since a
#: server restarting under a running job is what they are for.
_first_contact_retries: int | None = None
_reached_in: int | None = None  # the process id that has had an answer from a server
_silent_since: tuple[int, float] | None = None  # (pid, start of its first attempt without answer)
_gave_up: tuple[int, str] | None = None  # (pid, why): this command gave up on the endpoint

#: Names of the exceptions (or their causes) of a request that got no answer at all.
_NO_ANSWER = {
    "EndpointConnectionError",
    "ConnectionRefusedError",
    "ClientConnectorError",
    "ClientConnectorDNSError",
    "gaierror",
    "NameResolutionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ConnectTimeout",
    "ReadTimeout",
    "TimeoutError",
    "timeout",
    "ServerTimeoutError",
    "ConnectionClosedError",
    "ServerDisconnectedError",
    "RemoteDisconnected",
    "ConnectionResetError",
}


def fail_fast_before_first_contact(retries: int | None) -> None:
    """Until a first answer, retry an endpoint that does not answer only ``retries`` times, and
    no longer than TOKENLOAD_FIRST_CONTACT_TIMEOUT in all (None: no such limit). A first answer
    is waited for from this call on, even if this process heard from an endpoint before."""
    global _first_contact_retries, _silent_since, _gave_up, _reached_in
    _first_contact_retries = retries
    _silent_since = _gave_up = _reached_in = None


def _causes(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 8:
        e = todo.pop()
        if e is not None and all(e is not s for s in seen):
            seen.append(e)
            todo += [e.__cause__, e.__context__]
    return seen


def _no_answer(exc: BaseException) -> bool:
    """Whether the server sent nothing: no connection, or a connection that timed out or closed
    before an answer (as opposed to an HTTP error, which is an answer)."""
    return any(type(e).__name__ in _NO_ANSWER for e in _causes(exc))


def _failing_fast() -> bool:
    """Whether this process is a command that has not heard from its endpoint yet."""
    return _first_contact_retries is not None and _reached_in != os.getpid()


#: (process id, requests of it between their first retry and their end): a request whose first
#: retry finds others retrying logs it at DEBUG only, the fault being reported already.
_retrying: tuple[int, int] = (0, 0)
_RETRYING_LOCK = threading.Lock()


def _retrying_add(step: int) -> int:
    """Add ``step`` to this process's retrying requests; the number before (a forked child
    starts at 0)."""
    global _retrying
    with _RETRYING_LOCK:
        pid = os.getpid()
        before = _retrying[1] if _retrying[0] == pid else 0
        _retrying = (pid, max(before + step, 0))
        return before


def call(url: str, action: str, fn: Callable[[], T], options: StorageOptions) -> T:
    """``fn()`` with retries of transient failures; any failure ends as a StorageError."""
    global _reached_in, _silent_since, _gave_up
    if _failing_fast() and _gave_up is not None and _gave_up[0] == os.getpid():
        raise StorageError(f"cannot {action}: {_gave_up[1]}", path=url, hint=_CONNECT_HINT)
    started = time.monotonic()
    retries = 0
    try:
        for attempt in itertools.count():
            begun = time.monotonic()
            try:
                result = fn()
                _reached_in = os.getpid()
                if retries:
                    logger.info(
                        "%s: %s succeeded after %d %s in %.1f s",
                        url,
                        action,
                        retries,
                        "retry" if retries == 1 else "retries",
                        time.monotonic() - started,
                    )
                return result
            except TokenloadError:
                raise
            except Exception as exc:
                silent = _no_answer(exc)
                if not silent:
                    _reached_in = os.getpid()  # an HTTP error is an answer: the endpoint is there
                if not transient(exc):
                    raise permanent_error(exc, url, action) from None
                wait = options.backoff(attempt)
                first_silence = _silent_since is None or _silent_since[0] != os.getpid()
                if silent and _failing_fast() and first_silence:
                    _silent_since = (os.getpid(), begun)
                stop, limit = _stop(attempt, wait, started, silent, options)
                if stop is not None:
                    if silent and _failing_fast():
                        why = f"no answer from the endpoint ({_reason(exc)}), {stop}"
                        _gave_up = (os.getpid(), why)
                    raise StorageError(
                        f"cannot {action}: {_reason(exc)}, {stop}", path=url, hint=_CONNECT_HINT
                    ) from None
                count("retries")
                # once per fault: this request's first retry, unless another one is retrying
                alone = retries == 0 and _retrying_add(1) == 0
                retries += 1
                logger.log(
                    logging.WARNING if alone else logging.DEBUG,
                    "%s: cannot %s (%s); retry %d %s in %.1f s%s",
                    url,
                    action,
                    _reason(exc),
                    attempt + 1,
                    limit,
                    wait,
                    " (further retries are logged at DEBUG level)" if alone else "",
                )
                time.sleep(wait)
        raise AssertionError("unreachable")
    finally:
        if retries:
            _retrying_add(-1)


def _stop(
    attempt: int, wait: float, started: float, silent: bool, options: StorageOptions
) -> tuple[str | None, str]:
    """Why a request that failed ``attempt + 1`` times is given up (None: retried), and how the
    retry warning states the limit."""
    now = time.monotonic()
    since, first_retries = _silent_since, _first_contact_retries
    if silent and _failing_fast() and first_retries is not None and since is not None:
        quiet = now - since[1]
        most = min(options.retries, first_retries)
        if attempt >= most:
            return f"still after {attempt} retries", ""
        if quiet + wait + options.attempt_s > options.first_contact_s:
            return (
                f"still after {attempt} retries and {quiet:.1f} s without an answer (a command"
                " gives up on an endpoint that never answered within"
                f" TOKENLOAD_FIRST_CONTACT_TIMEOUT, {options.first_contact_s:g} s)"
            ), ""
        return None, f"of {most}"
    window = read_retry_window()
    if window is not None:
        spent = now - started
        if spent + wait + options.attempt_s > window:
            return (
                f"still after {attempt} retries in {spent:.1f} s (reads are retried for up to"
                f" {window:g} s, the loader's worker_timeout)"
            ), ""
        return None, f"(retrying for up to {window - spent:.0f} s more)"
    if attempt >= options.retries:
        return f"still after {attempt} retries", ""
    return None, f"of {options.retries}"


def transient(exc: BaseException) -> bool:
    """Whether a failure may pass on retry: anything but a missing object, denied access, missing
    credentials or a malformed request (those fail the same way every time)."""
    if isinstance(
        exc,
        (
            FileNotFoundError,
            PermissionError,
            IsADirectoryError,
            NotADirectoryError,
            ValueError,
            TypeError,
            AttributeError,
        ),
    ):
        return False
    if isinstance(exc, OSError) and exc.errno in (errno.EINVAL, errno.EPERM, errno.EACCES):
        return False  # s3fs's InvalidRange (a shorter object), denied or malformed requests
    name = type(exc).__name__
    return name not in (
        "NoCredentialsError",
        "PartialCredentialsError",
        "ParamValidationError",
        "NoRegionError",
    )


def permanent_error(exc: BaseException, url: str, action: str) -> StorageError:
    if isinstance(exc, FileNotFoundError):
        if url.endswith((".idx", ".bin")):
            hint = (
                "check the URL (PREFIX.idx and PREFIX.bin must both exist) and the bucket; a"
                " .bin without its .idx is an interrupted upload: rerun the command that wrote"
                " it"
            )
        else:
            hint = "check the URL and the bucket (the object may have been deleted meanwhile)"
        return StorageError(f"cannot {action}: the object does not exist", path=url, hint=hint)
    if isinstance(exc, OSError) and exc.errno == errno.EINVAL:
        return StorageError(
            f"cannot {action}: the request was refused ({_reason(exc)})",
            path=url,
            hint="the object may have been truncated or replaced; check it",
        )
    if isinstance(exc, PermissionError) or "Credentials" in type(exc).__name__:
        return StorageError(
            f"cannot {action}: access denied ({_reason(exc)})", path=url, hint=_CREDENTIALS_HINT
        )
    return StorageError(
        f"cannot {action} ({_reason(exc)})",
        path=url,
        hint="check the URL, the endpoint and the credentials",
    )


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
