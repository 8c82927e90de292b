"""The messages between a loader and its worker processes (``workers.py``, ``worker_main.py``).

Each message is a named record (a ``NamedTuple``: immutable, no per-instance dict). On the wire
(``channel.Channel``) a record travels as a plain tuple, its kind's number first: a pickled
``NamedTuple`` names its class and is rebuilt by a Python-level ``__new__``, about 5 us more per
message than a tuple, and the loader sends two per micro-batch group.

Commands go from the training process to a worker, results from a worker back.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeVar, cast

__all__ = [
    "Batches",
    "Command",
    "Credit",
    "Entry",
    "Failed",
    "LoadDataset",
    "Message",
    "Ready",
    "Result",
    "RingMapped",
    "SetWeights",
    "Start",
    "Stop",
    "decode",
    "encode",
]


# -- commands (training process -> worker) ---------------------------------------------------------
class LoadDataset(NamedTuple):
    """The pickled dataset (spawn and forkserver: the first message a worker reads)."""

    payload: bytes


class Start(NamedTuple):
    """Start iteration ``generation`` (ending the one before) at this worker's micro-batch
    ``first`` (its own index, or the one a lost worker still owed)."""

    generation: int
    sampler: Any
    """The batch sampler whose micro-batches the workers make (``sampler.py``)."""
    first: int
    credits: int
    """Micro-batches the worker may make ahead (the prefetch)."""
    freed: list[int]
    """Slots of the worker's ring that nothing refers to any more."""


class Credit(NamedTuple):
    """Micro-batches of iteration ``generation`` taken by the training loop, and freed slots."""

    generation: int
    credits: int
    freed: list[int]


class Stop(NamedTuple):
    """Exit now."""


class SetWeights(NamedTuple):
    """``loader.set_weights``: the blend serves ``weights`` from global sample ``start`` on
    (``contract.MixtureCursors.change_weights``). The worker changes its copy of the dataset;
    the ``Start`` that follows makes it drop what it made ahead and remake it."""

    start: int
    weights: tuple[float, ...] | None


# -- results (worker -> training process) ----------------------------------------------------------
class Ready(NamedTuple):
    """The worker's dataset is loaded (or failed to load: reported at the next ``Start``)."""

    pid: int


class RingMapped(NamedTuple):
    """The worker's ring of shared-memory slots exists (``ring.ConsumerRing``'s arguments)."""

    path: str
    slot_bytes: int
    slots: int


Entry = tuple[int, int | None, Any]
"""One micro-batch of a ``Batches`` message: its number k, its slot (None: the batch itself
travels in the message) and the slot's layout, or the batch."""


class Batches(NamedTuple):
    """Micro-batches of iteration ``generation``, in order."""

    generation: int
    entries: list[Entry]


class Failed(NamedTuple):
    """An exception in the worker: reading micro-batch ``step`` of iteration ``generation``, or
    loading the dataset (``step`` None). ``error`` is None when it cannot be pickled."""

    generation: int
    step: int | None
    error: BaseException | None
    traceback: str


Command = LoadDataset | Start | Credit | Stop | SetWeights
Result = Ready | RingMapped | Batches | Failed
Message = Command | Result
M = TypeVar("M", bound=Message)
"""The messages a channel carries: ``Command`` or ``Result``."""

_KINDS: tuple[type[tuple[Any, ...]], ...] = (
    LoadDataset,
    Start,
    Credit,
    Stop,
    Ready,
    RingMapped,
    Batches,
    Failed,
    SetWeights,
)
_NUMBERS = {kind: number for number, kind in enumerate(_KINDS)}


def encode(message: Message) -> tuple[Any, ...]:
    """The plain tuple that travels: the kind's number, then the fields."""
    return (_NUMBERS[type(message)], *message)


def decode(wire: tuple[Any, ...]) -> Message:
    """The record of an ``encode``d tuple."""
    return cast(Message, tuple.__new__(_KINDS[wire[0]], wire[1:]))
