"""Which tokenizer a ``TokenizerSpec`` names: the byte tokenizer, a native library encoder, or
gigatoken standing in for it where a probe shows identical ids.

This module sits on top of the tokenizer modules so their imports run one way:
``tokenizer`` (base class, byte tokenizer) <- ``backends`` (native encoders) <- ``fast``
(gigatoken) <- ``twin`` (gigatoken and the native tokenizer loaded at once, in two processes,
where it can: a tokenizer.json file) <- ``load``. Before any library parses a tokenizer file,
each file is opened here, so a missing or unreadable file is reported as that (with a
permissions hint), not as a file the library could not parse.
"""

from __future__ import annotations

import errno
import os

from ..errors import ConfigError, StorageError
from .config import TokenizerSpec
from .tokenizer import ByteTokenizer, TextTokenizer


def load_tokenizer(spec: TokenizerSpec) -> TextTokenizer:
    """Build the tokenizer ``spec`` names (gigatoken-accelerated where it is proven equal)."""
    if spec.kind == "byte":
        if spec.model or spec.vocab_file or spec.merge_file:
            raise ConfigError(
                "the byte tokenizer takes no files",
                hint="drop `model=`, `vocab_file=` and `merge_file=`, or pick another `kind=`",
            )
        if spec.engine == "gigatoken":
            raise ConfigError(
                "gigatoken does not encode the byte tokenizer", hint="drop `engine='gigatoken'`"
            )
        if spec.eod_token is not None:  # it has no token text: ids are bytes, EOD an id
            raise ConfigError(
                f"the byte tokenizer has no token named {spec.eod_token!r}: its ids are the"
                " UTF-8 bytes and its EOD is an id (256 unless `eod_id=` says otherwise)",
                hint="drop `eod_token=`, or give `eod_id=N` (256 or more)",
            )
        return ByteTokenizer(spec.eod_id)
    for path in (spec.model, spec.vocab_file, spec.merge_file):
        if path is not None:
            check_readable(path)
    from . import backends, fast, twin

    if twin.can_fork_for(spec):
        accelerated = twin.accelerate_twins(spec)
        if accelerated is not None:
            return accelerated
    native, giga_source = backends.load_native(spec)
    if spec.engine == "native" or giga_source is None:
        if spec.engine == "gigatoken":
            raise ConfigError(
                f"gigatoken cannot encode this {spec.kind} tokenizer",
                hint="drop `engine='gigatoken'`",
            )
        return native
    return fast.accelerate(native, giga_source, spec)


def check_readable(path: str) -> None:
    """Raise unless ``path`` (a tokenizer file, or a model folder and its files) can be read."""
    if not os.path.exists(path):
        raise ConfigError(
            f"tokenizer file {path!r} does not exist",
            path=path,
            hint="tokenizers are read from local files only; check the path",
        )
    targets = [path]
    if os.path.isdir(path):
        targets = [os.path.join(path, n) for n in _listing(path) if not n.startswith(".")]
        targets = [t for t in targets if os.path.isfile(t)]
    for target in targets:
        try:
            with open(target, "rb") as f:
                f.read(1)
        except OSError as exc:
            raise _unreadable(target, exc) from None


def _listing(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError as exc:
        raise _unreadable(folder, exc) from None


def _unreadable(path: str, exc: OSError) -> StorageError:
    if exc.errno in (errno.EACCES, errno.EPERM):
        hint = (
            "this user may not read it: fix its permissions (e.g. chmod a+r, or the owner)"
            " or copy the tokenizer somewhere readable"
        )
    else:
        hint = "check the disk or mount that holds it, or copy the tokenizer elsewhere"
    return StorageError(
        f"cannot read the tokenizer file ({exc.strerror or exc})", path=path, hint=hint
    )
