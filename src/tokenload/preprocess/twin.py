"""gigatoken and the native tokenizer it must match, loaded at the same time in two processes.

Before the first token, a run parses the same tokenizer.json twice: HF ``tokenizers`` for the
reference ids (about 80 ms for a 32k BPE, with the vocabulary size) and gigatoken for the fast
encoder (about 65 ms). Both parsers hold the GIL, so two threads take as long as one after the
other, and the run's other core idles for the whole start. Here the native load runs in a child
forked from this process while this process parses gigatoken; the child sends back only what the
proof needs (the ids of ``PROBE_TEXTS``, the post-processor's affixes, vocabulary size and EOD
id) and exits. The check itself is unchanged: gigatoken is used only where it reproduces the
native ids on the probe texts.

Whatever this cannot do the same way, it leaves to the serial load (``load_tokenizer`` then loads
both in this process): a platform without ``fork``, a process with other Python threads (a fork
copies only the calling thread, so a lock another thread holds would stay held in the child), a
tokenizer that is not one tokenizer.json file, gigatoken not installed, a process of more than
``FORK_RESIDENT_LIMIT`` resident, and any failure in either process. A failure then happens
again in the serial load, which raises the typed error a user sees, so a bad file reports
exactly what it reported before.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pickle
import select
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import TokenizerSpec
from .fast import GigatokenTokenizer, read_tokenizer_json, same_ids
from .tokenizer import PROBE_TEXTS, TextTokenizer

log = logging.getLogger(__name__)

#: Seconds to wait for the child's answer before loading serially (a 128k-vocabulary
#: tokenizer.json parses in well under a second; this only bounds a child that hangs).
CHILD_TIMEOUT = 60.0
#: Resident memory above which a fork is left out: copying the page tables of a large process
#: (a notebook holding data) costs more than the parse it would overlap.
FORK_RESIDENT_LIMIT = 1 << 30


@dataclass(frozen=True)
class NativeFacts:
    """What the native tokenizer told the child: enough to prove gigatoken and stand in for it."""

    engine: str
    vocab_size: int
    eod_id: int | None
    options: dict[str, Any]
    prefix: list[int]
    suffix: list[int]
    probe_ids: np.ndarray
    probe_lengths: np.ndarray


class NativeStandIn(TextTokenizer):
    """The native tokenizer's identity as the child read it; it loads the real one (in this
    process) only if asked to encode, which gigatoken for a tokenizer.json never does."""

    def __init__(self, spec: TokenizerSpec, facts: NativeFacts) -> None:
        assert spec.model is not None  # a tokenizer.json, the only file a twin load reads
        self.spec, self.facts = spec, facts
        self._real: TextTokenizer | None = None
        self.kind, self.engine, self.files = "huggingface", facts.engine, (spec.model,)
        self.vocab_size, self.eod_id, self.options = facts.vocab_size, facts.eod_id, facts.options

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self._real is None:
            from .backends import load_native

            self._real = load_native(self.spec)[0]
        return self._real.encode_batch(texts)


def can_fork_for(spec: TokenizerSpec) -> bool:
    """Whether ``spec`` can be loaded as twins here (see the module docstring)."""
    return (
        hasattr(os, "fork")
        and sys.platform.startswith("linux")
        and spec.kind == "huggingface"
        and spec.engine != "native"
        and spec.model is not None
        and os.path.isfile(spec.model)
        and _only_thread()
        and _resident_bytes() < FORK_RESIDENT_LIMIT
        and importlib.util.find_spec("gigatoken") is not None
    )


def _only_thread() -> bool:
    """Whether the calling thread is this process's only Python thread."""
    return threading.active_count() == 1


def _resident_bytes() -> int:
    """This process's resident memory (a fork copies page tables in proportion to it)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return FORK_RESIDENT_LIMIT


def accelerate_twins(spec: TokenizerSpec) -> TextTokenizer | None:
    """gigatoken proven equal to the native encoder, the two loaded at once in two processes;
    None where the serial load must decide, including a probe that fails (the serial load then
    logs or raises exactly as it always has)."""
    loaded = _load_twins(spec)
    if loaded is None:
        return None
    giga, native = loaded
    facts = native.facts
    try:
        fast = GigatokenTokenizer(native, giga, facts.prefix, facts.suffix)
        same = same_ids((facts.probe_ids, facts.probe_lengths), fast)
    except Exception:  # gigatoken raises RuntimeError/ValueError for what it cannot encode
        return None
    if not same:
        return None
    log.debug("encoding with gigatoken (native tokenizer loaded in a forked child)")
    return fast


def _load_twins(spec: TokenizerSpec) -> tuple[Any, NativeStandIn] | None:
    """(gigatoken's tokenizer, the native tokenizer's stand-in), or None where the serial load
    must decide (any failure, in either process)."""
    child = _Child.start(spec)
    if child is None:
        return None
    try:
        import gigatoken

        giga = read_tokenizer_json(gigatoken, str(spec.model))
    except Exception:  # gigatoken raises ValueError/RuntimeError for what it cannot read
        child.stop()
        return None
    except BaseException:  # an interrupt: leave no child behind
        child.stop()
        raise
    facts = child.facts()
    if facts is None:
        return None
    return giga, NativeStandIn(spec, facts)


class _Child:
    """A forked process that loads the native tokenizer and writes its ``NativeFacts`` (or
    nothing, on any failure) to a pipe."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd = pid, fd

    @classmethod
    def start(cls, spec: TokenizerSpec) -> _Child | None:
        read_fd, write_fd = os.pipe()
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns when native threads exist (NumPy's BLAS pool): the child
                # touches no BLAS and no lock of theirs, and leaves by os._exit.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            return None
        if pid == 0:  # pragma: no cover - runs in the child, checked through its answer
            os.close(read_fd)
            _child_main(spec, write_fd)
        os.close(write_fd)
        return cls(pid, read_fd)

    def facts(self) -> NativeFacts | None:
        """The child's answer (8 bytes of length, then the pickle); None if it failed, died or
        took longer than ``CHILD_TIMEOUT``. The child is reaped by a thread: its exit unmaps a
        copy of this process, which takes a while and need not be waited for."""
        try:
            data = self._answer()
        except BaseException:  # an interrupt: leave no child behind
            self.stop()
            raise
        if data is None:
            self.stop()
            return None
        self._close()
        threading.Thread(target=self._reap, name="tokenload-reap", daemon=True).start()
        try:
            facts = pickle.loads(data[8:])
        except Exception:  # pickle raises several types for damaged input
            return None
        return facts if isinstance(facts, NativeFacts) else None

    def _answer(self) -> bytes | None:
        data, deadline = b"", time.monotonic() + CHILD_TIMEOUT
        while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "little"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                log.debug("the native tokenizer's child did not answer: loading serially")
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:  # failed or died before a whole answer
                return None
            data += chunk
        return data

    def stop(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._close()
        self._reap()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _reap(self) -> None:
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _child_main(spec: TokenizerSpec, fd: int) -> None:  # pragma: no cover - the forked child
    """Load the native tokenizer, write its facts to ``fd`` and leave without running any of
    the parent's exit handlers or flushing its buffers."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        payload = pickle.dumps(_native_facts(spec), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(len(payload).to_bytes(8, "little") + payload)
        while view:
            view = view[os.write(fd, view) :]
        os.close(fd)  # the answer is complete now, not after this process's exit tears it down
        code = 0
    except BaseException:  # the serial load repeats the failure and reports it
        pass
    finally:
        os._exit(code)


def _native_facts(spec: TokenizerSpec) -> NativeFacts:
    from .backends import HFTokenizer, load_native

    native, _ = load_native(spec)
    assert isinstance(native, HFTokenizer)  # a tokenizer.json loads as one
    prefix, suffix = native.affixes()
    flat, lengths = native.encode_batch(list(PROBE_TEXTS))
    return NativeFacts(
        engine=native.engine,
        vocab_size=int(native.vocab_size),
        eod_id=None if native.eod_id is None else int(native.eod_id),
        options=dict(native.options),
        prefix=[int(i) for i in prefix],
        suffix=[int(i) for i in suffix],
        probe_ids=np.asarray(flat, dtype=np.int64),
        probe_lengths=np.asarray(lengths, dtype=np.int64),
    )
