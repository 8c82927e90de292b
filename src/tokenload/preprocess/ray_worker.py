"""What runs inside the Ray workers of preprocess: the task body, the live-progress actor, and the
tokenizer's files shipped from the driver and rebuilt on each node.

A task gets a small ``PartTask`` and, in a list so Ray fetches it only on a worker's first task,
the reference to the tokenizer's files as bytes; the worker writes them once per content under
its temporary folder and loads the tokenizer once per process. Apart from ``cluster`` (the
driver: planning, submitting, committing) because this is the code Ray pickles by reference and
runs on every node, and it needs nothing of the driver's.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from .config import TokenizerSpec
from .encode import _TOKENIZERS, register_tokenizer
from .load import load_tokenizer
from .parts import PartResult, PartTask, encode_part


# -- tokenizer shipping ---------------------------------------------------------------------------
def tokenizer_files(spec: TokenizerSpec) -> dict[str, bytes]:
    """The bytes of every file the spec names (a model folder: its tokenizer files), keyed by
    their path relative to the spec's own paths, so a worker can rebuild the spec anywhere."""
    from .tokenizer import _is_tokenizer_file

    files: dict[str, bytes] = {}
    for role in ("model", "vocab_file", "merge_file"):
        path = getattr(spec, role)
        if path is None:
            continue
        if os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                full = os.path.join(path, name)
                if os.path.isfile(full) and _is_tokenizer_file(name):
                    files[f"{role}/{os.path.basename(path)}/{name}"] = Path(full).read_bytes()
        else:
            files[f"{role}/{os.path.basename(path)}"] = Path(path).read_bytes()
    return files


def local_spec(spec: TokenizerSpec, files: dict[str, bytes]) -> TokenizerSpec:
    """``spec`` with its paths pointing at copies of ``files`` on this machine (written once per
    content into the temporary folder; file names are kept, as tiktoken reads its pattern there)."""
    import tempfile

    import xxhash

    digest = xxhash.xxh3_64()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name] + b"\0")
    root = Path(tempfile.gettempdir()) / "tokenload-tokenizers" / digest.hexdigest()
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root.parent))
        for name, data in files.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(data)
        try:
            staging.rename(root)
        except OSError:  # another worker process of this node was first
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
    changes: dict[str, Any] = {}
    for role in ("model", "vocab_file", "merge_file"):
        path = getattr(spec, role)
        if path is not None:
            changes[role] = str(root / role / os.path.basename(path))
    return replace(spec, **changes)


def _worker_tokenizer(spec: TokenizerSpec, shipped: list[Any]) -> None:
    """Load the tokenizer in this worker process once (cached under the driver's spec)."""
    if spec in _TOKENIZERS:
        return
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if spec.kind == "byte":
        register_tokenizer(spec, load_tokenizer(spec))
        return
    import ray

    files = ray.get(shipped[0])
    register_tokenizer(spec, load_tokenizer(local_spec(spec, files)))


# -- the Ray side ---------------------------------------------------------------------------------
def _run_part(task: PartTask, shipped: list[Any], tally: list[Any]) -> PartResult:
    """The body of a Ray task (``shipped`` and ``tally`` sit in a list so Ray does not fetch the
    tokenizer's bytes for every task, only on a worker's first one)."""
    _worker_tokenizer(task.encode.tokenizer, shipped)
    key = f"{task.index}.{task.k}"

    def report(nbytes: int, tokens: int, documents: int) -> None:
        if tally:
            tally[0].report.remote(key, nbytes, tokens, documents)

    return encode_part(task, report)


class _Tally:
    """Running counts of the tasks under way (a Ray actor): per task, its latest report, so a
    retried task starts again from zero instead of counting twice."""

    def __init__(self) -> None:
        self.live: dict[str, tuple[int, int, int]] = {}
        self.gone: set[str] = set()

    def report(self, key: str, nbytes: int, tokens: int, documents: int) -> None:
        if key not in self.gone:
            self.live[key] = (nbytes, tokens, documents)

    def forget(self, keys: list[str]) -> None:
        for key in keys:
            self.gone.add(key)
            self.live.pop(key, None)

    def total(self) -> tuple[int, int, int]:
        return tuple(sum(v[i] for v in self.live.values()) for i in range(3))  # type: ignore[return-value]
