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
TOKENLOAD_CACHE_DIR             local folder of cached ``.idx`` copies             ~/.cache/tokenload
==============================  =================================================  ==============
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ConfigError

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

    def __post_init__(self) -> None:
        if self.chunk_bytes < 8 or self.chunk_bytes % 8:
            raise ConfigError(
                f"chunk size {self.chunk_bytes} bytes, expected a positive multiple of 8",
                hint="set TOKENLOAD_CHUNK_BYTES to e.g. 268435456 (256 MiB)",
            )
        if self.get_bytes < 8 or self.get_bytes % 8 or self.get_threads < 1:
            raise ConfigError(
                f"{self.get_bytes} bytes per GET and {self.get_threads} GETs in flight, expected a positive"
                " multiple of 8 bytes and at least 1 GET",
                hint="set TOKENLOAD_GET_BYTES to e.g. 67108864 (64 MiB) and TOKENLOAD_GET_THREADS to e.g. 4",
            )
        if self.retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0 or self.cache_bytes < 0:
            raise ConfigError(
                "retries, backoff and cache size must be >= 0",
                hint="check TOKENLOAD_RETRIES, TOKENLOAD_RETRY_BACKOFF and TOKENLOAD_CHUNK_CACHE_BYTES",
            )

    @property
    def index_cache_dir(self) -> str:
        return self.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "tokenload")

    @classmethod
    def from_env(cls) -> "StorageOptions":
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
        )

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        return min(self.backoff_s * (2.0**attempt), self.max_backoff_s)


def _flag(env, name: str) -> bool:
    return env.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def _number(env, name: str, default, kind):
    text = env.get(name)
    if text is None or not text.strip():
        return default
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number", hint=f"set {name} to a number or unset it") from None
