"""Settings of object-storage reads, taken from the environment of each process.

Environment variables rather than constructor arguments: a ``TokenFile`` pickles as
``(prefix, options)`` into DataLoader workers and spawned ranks, and the environment reaches them
all without threading one more option through every dataset config. Credentials are never read
here: they stay with the client library (``AWS_*`` variables, ``~/.aws``, instance roles).

==============================  =================================================  ==============
variable                        meaning                                            default
==============================  =================================================  ==============
TOKENLOAD_CHUNK_BYTES           bytes per ranged GET of a ``.bin`` (Megatron's     268435456
                                ``bin_chunk_nbytes``)
TOKENLOAD_CHUNK_CACHE_BYTES     bytes of chunks each process keeps (LRU), at least 1073741824
                                one chunk plus the one read ahead
TOKENLOAD_GET_BYTES             bytes per ranged GET within a chunk: a chunk is    67108864
                                read as several GETs of this size (at most one
                                when as large as the chunk)
TOKENLOAD_GET_THREADS           GETs in flight per file (parts of the chunk read   4
                                and of the one read ahead, in order)
TOKENLOAD_PREFETCH              1: a background thread reads the next chunk while  1
                                a sequential reader is in the current one; 0: off
TOKENLOAD_DIRECT_READS          1: a read outside the chunks held and away from    1
                                the previous read GETs only its bytes; 0: every
                                miss fetches its chunk (Megatron's behaviour)
TOKENLOAD_RETRIES               attempts after the first failed one (throttling,   8
                                5xx, timeouts, dropped connections); a
                                ``tokenload`` command gives up on an endpoint it
                                has never reached (refused, unknown host) after 3
TOKENLOAD_RETRY_BACKOFF         seconds before the first retry; doubles each time  0.5
TOKENLOAD_RETRY_MAX_BACKOFF     cap of one wait                                    20
TOKENLOAD_CONNECT_TIMEOUT       seconds to wait for a connection to be accepted    5
TOKENLOAD_READ_TIMEOUT          seconds to wait for the next bytes of an answer    20
                                (the first byte, or the next of a body): a stuck
                                request fails and is retried, never hangs
TOKENLOAD_FIRST_CONTACT_TIMEOUT a ``tokenload`` command gives up on an endpoint    50
                                that has never answered (accepts and stays silent,
                                drops packets, refuses) after at most this long
TOKENLOAD_CACHE_DIR             local folder of cached ``.idx`` copies             ~/.cache/
                                                                                   tokenload
==============================  =================================================  ==============

Bounds. One attempt of a request ends within CONNECT_TIMEOUT + READ_TIMEOUT seconds unless the
server keeps sending bytes (25 s by default); a body that stops for READ_TIMEOUT seconds fails.
A ``tokenload`` command (the CLI) whose endpoint has never answered stops retrying before
FIRST_CONTACT_TIMEOUT: it makes no attempt that could end later (with the defaults, two attempts
against a silent endpoint, about 41 s; a refused connection: 3 retries, about 4 s). Once an
answer came, TOKENLOAD_RETRIES decides. A process whose reads have a time budget (the loader's
``worker_timeout``, set through ``retry_reads_for``) retries for as long as the budget allows,
instead of TOKENLOAD_RETRIES times, and raises the ``StorageError`` before the budget is spent.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from ..errors import ConfigError

T = TypeVar("T")

MIB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class StorageOptions:
    """How remote token files are read (see the module docstring for the variables)."""

    chunk_bytes: int = 256 * MIB
    """Bytes per ranged GET; a multiple of 8 so that no token straddles two chunks."""
    cache_bytes: int = 1024 * MIB
    """Upper bound of the per-process chunk cache."""
    get_bytes: int = 64 * MIB
    """Bytes per ranged GET inside a chunk; a multiple of 8 (parts split no token)."""
    get_threads: int = 4
    """Ranged GETs in flight per file."""
    prefetch: bool = True
    """Read the next chunk in a background thread when reads move forward."""
    direct_reads: bool = True
    """A random read fetches only its own bytes instead of its chunk."""
    retries: int = 8
    """Retries of a failed request that may succeed later."""
    backoff_s: float = 0.5
    """Wait before the first retry, doubled after each."""
    max_backoff_s: float = 20.0
    """Longest single wait."""
    cache_dir: str = ""
    """Folder of cached index files; empty means ``~/.cache/tokenload``."""
    connect_timeout_s: float = 5.0
    """Longest wait for a connection to be accepted."""
    read_timeout_s: float = 20.0
    """Longest wait for the next bytes of an answer."""
    first_contact_s: float = 50.0
    """How long a ``tokenload`` command tries an endpoint that has never answered."""

    def __post_init__(self) -> None:
        if self.chunk_bytes < 8 or self.chunk_bytes % 8:
            raise ConfigError(
                f"chunk size {self.chunk_bytes} bytes, expected a positive multiple of 8",
                hint="set TOKENLOAD_CHUNK_BYTES to e.g. 268435456 (256 MiB)",
            )
        if self.get_bytes < 8 or self.get_bytes % 8 or self.get_threads < 1:
            raise ConfigError(
                f"{self.get_bytes} bytes per GET and {self.get_threads} GETs in flight, expected a"
                " positive multiple of 8 bytes and at least 1 GET",
                hint="set TOKENLOAD_GET_BYTES to e.g. 67108864 (64 MiB) and TOKENLOAD_GET_THREADS"
                " to e.g. 4",
            )
        if self.retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0 or self.cache_bytes < 0:
            raise ConfigError(
                "retries, backoff and cache size must be >= 0",
                hint="check TOKENLOAD_RETRIES, TOKENLOAD_RETRY_BACKOFF and"
                " TOKENLOAD_CHUNK_CACHE_BYTES",
            )
        times = (self.connect_timeout_s, self.read_timeout_s, self.first_contact_s)
        if not all(math.isfinite(t) and t > 0 for t in times):
            raise ConfigError(
                f"timeouts {times[0]}, {times[1]} and {times[2]} s, expected finite numbers > 0",
                hint="set TOKENLOAD_CONNECT_TIMEOUT, TOKENLOAD_READ_TIMEOUT and"
                " TOKENLOAD_FIRST_CONTACT_TIMEOUT to seconds (e.g. 5, 20, 50) or unset them",
            )

    @property
    def attempt_s(self) -> float:
        """Longest time one attempt of a request waits without receiving a byte."""
        return self.connect_timeout_s + self.read_timeout_s

    @property
    def index_cache_dir(self) -> str:
        return self.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "tokenload")

    @classmethod
    def from_env(cls) -> StorageOptions:
        """The options the ``TOKENLOAD_*`` variables of this process set."""
        env = os.environ
        return cls(
            chunk_bytes=_number(env, "TOKENLOAD_CHUNK_BYTES", 256 * MIB, int),
            cache_bytes=_number(env, "TOKENLOAD_CHUNK_CACHE_BYTES", 1024 * MIB, int),
            get_bytes=_number(env, "TOKENLOAD_GET_BYTES", 64 * MIB, int),
            get_threads=_number(env, "TOKENLOAD_GET_THREADS", 4, int),
            prefetch=_flag(env, "TOKENLOAD_PREFETCH"),
            direct_reads=_flag(env, "TOKENLOAD_DIRECT_READS"),
            retries=_number(env, "TOKENLOAD_RETRIES", 8, int),
            backoff_s=_number(env, "TOKENLOAD_RETRY_BACKOFF", 0.5, float),
            max_backoff_s=_number(env, "TOKENLOAD_RETRY_MAX_BACKOFF", 20.0, float),
            cache_dir=env.get("TOKENLOAD_CACHE_DIR", ""),
            connect_timeout_s=_number(env, "TOKENLOAD_CONNECT_TIMEOUT", 5.0, float),
            read_timeout_s=_number(env, "TOKENLOAD_READ_TIMEOUT", 20.0, float),
            first_contact_s=_number(env, "TOKENLOAD_FIRST_CONTACT_TIMEOUT", 50.0, float),
        )

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        return min(self.backoff_s * (2.0**attempt), self.max_backoff_s)


#: Seconds a failing request of this process may be retried for, from its first attempt (None:
#: TOKENLOAD_RETRIES times). Set by ``retry_reads_for``; a forked child inherits it.
_read_window_s: float | None = None


def retry_reads_for(seconds: float | None) -> None:
    """From now on, in this process, retry a failing storage request for as long as ``seconds``
    allows instead of TOKENLOAD_RETRIES times: a request that has not succeeded is given up, as a
    ``StorageError``, when one more attempt (``attempt_s``, after its backoff) could end more than
    ``seconds`` after its first attempt began. Each retry logs a warning saying how much of the
    budget is left. None restores the count. The loader calls it in each worker (and in the
    training process for in-process reads) with its ``worker_timeout``, so that a read of a stuck
    server ends as a typed error before the watchdog takes the worker for a stalled one."""
    global _read_window_s
    if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(
            f"a read retry budget of {seconds} s, expected a number > 0 or None",
            hint="pass worker_timeout as seconds > 0, or None to disable it",
        )
    _read_window_s = None if seconds is None else float(seconds)


def read_retry_window() -> float | None:
    """The budget ``retry_reads_for`` set in this process (None: retries are counted)."""
    return _read_window_s


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def _number(env: Mapping[str, str], name: str, default: T, kind: Callable[[str], T]) -> T:
    text = env.get(name)
    if text is None or not text.strip():
        return default
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(
            f"{name}={text!r} is not a number", hint=f"set {name} to a number or unset it"
        ) from None
