"""What the model saw: the documents of a training step, and the steps of a document.

``explain(dataset, step=N, global_batch_size=G)`` gives, for each row of global step N in rank
order, the pieces of its S input tokens (its ``tokens`` field): ``source`` (0-based member of
the blend), ``document`` (its index in that source's token file; for Megatron's order the
sequence id in the ``.idx``, megatron-core's "document"), ``start``/``stop`` (token offsets in
the document, stop exclusive). ``where(dataset, source=K, document=D, global_batch_size=G)``
gives every global step whose rows hold a token of document D.

Both are direct: global sample k is a function of k, so ``explain`` asks the dataset for the
pieces of G samples (``contract.PieceSource.sample_pieces``), and ``where`` inverts the order
(``contract.DocumentSamples.samples_of``): the computed order maps the document's tokens to the
windows that cover them, each epoch's positions of those windows by the keyed permutation's
inverse, and the global samples that serve those cursors by the interleave's inverse, phase by
phase; Megatron's order finds the document in its cache arrays with one vectorized pass (the
document index, then the shuffle index and the blend's arrays). docs/PROVENANCE.md gives the
costs.

``state`` is a loader state (``loader.state_dict()``): its skips (skipped samples are in no
step; a skip may fall between the micro-batches of a step), its mixture chain (a schedule,
``set_weights`` changes, a change at a resume) and its topology history (the micro-batch size
and data-parallel size each sample was served with, across resumes on other topologies:
``loader.state.topology_history``; for the rank, micro-batch and row of each sample). Steps
count the global batches the training loop received: a skip moves the later ones. Samples
served before the history's first entry (a state of an older tokenload, which recorded only
its topology at the save) have no known rank: ``explain`` refuses their steps with a
``StateError`` and ``where`` lists them apart (``Steps.unplaced``) with a note, unless both
sizes are given. A state whose mixture changed at a resume describes the run from that resume
on (its chain's origin): ``explain`` refuses earlier steps with a ``StateError``, ``where`` says
in a note which steps it leaves out; ask with the state saved before the change. The
state is checked against the dataset by the loader's own resume check (``load_state_dict``): one
saved for other data, another seed or another packing is the ``StateError`` a resume raises.
"""

from __future__ import annotations

import bisect
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .contract import DocumentSamples, PieceSource
from .errors import ConfigError, StateError
from .loader.ledger import parse_skips
from .loader.mapstyle import loader_dataset
from .loader.state import TOPOLOGIES_KEPT, LoaderState, topology_history

__all__ = ["BatchSchedule", "Piece", "Row", "Steps", "explain", "where"]


@dataclass(frozen=True)
class Piece:
    """Tokens ``[start, stop)`` of document ``document`` of member ``source``."""

    source: int
    document: int
    start: int
    stop: int


@dataclass(frozen=True)
class Row:
    """One row of a global step: who read it and what its ``tokens`` hold."""

    rank: int
    micro_batch: int
    """The rank's micro-batch within the global step (gradient accumulation), from 0."""
    row: int
    """The row within that micro-batch."""
    sample: int
    """The global sample (the dataset index the loader read)."""
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class Steps:
    """Where a document went: the global steps and the samples (rows) that hold its tokens."""

    steps: list[int]
    """Sorted distinct global steps (those of ``rows`` and of ``unplaced``)."""
    rows: list[tuple[int, Row]]
    """(step, row) of every sample that holds a token of it, in order."""
    skipped: list[int]
    """Global samples that held it but were skipped (``loader.skip``): in no step."""
    unplaced: list[tuple[int, int]] = field(default_factory=list)
    """(step, global sample) of samples that hold it in a step whose topology the state does not
    record (``notes`` says why): their rank, micro-batch and row are not known."""
    first_sample: int = 0
    """The first global sample the answer covers: a state whose mixture changed at a resume
    describes the run from there on (0: the whole run)."""
    notes: list[str] = field(default_factory=list)
    """What the answer does not cover, in words (empty: nothing left out)."""


def _integer(name: str, value: Any, least: int, hint: str) -> int:
    """``value`` (a Python or NumPy integer) as an int >= ``least``; else a ``ConfigError`` that
    says what was found and expected."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ConfigError(f"{name} is {value!r}; expected an int >= {least}", hint=hint, field=name)
    return int(value)


class BatchSchedule(Protocol):
    """A global batch that changes with the samples received (``megatron_args.
    StepBatchSchedule``, megatron-core's ``--step-batch-size-schedule``)."""

    @property
    def segments(self) -> Sequence[tuple[int, int, int]]:
        """``(first step, samples received before it, batch)`` of each run of steps of one
        batch, from step 0 (the last run goes on for ever)."""
        ...


def _step_segments(global_batch_size: int | BatchSchedule) -> list[tuple[int, int, int]]:
    """``BatchSchedule.segments`` of a schedule; one run of ``global_batch_size`` steps for a
    constant batch (an int)."""
    hint = "pass the run's global batch size in samples, or its StepBatchSchedule"
    runs = getattr(global_batch_size, "segments", None)
    if runs is None:
        return [(0, 0, _integer("global_batch_size", global_batch_size, 1, hint))]
    try:
        out = [(int(f), int(r), int(b)) for f, r, b in runs]
    except (TypeError, ValueError):
        out = []
    if not out or out[0][:2] != (0, 0) or any(b < 1 for _, _, b in out):
        raise ConfigError(
            f"global_batch_size's schedule has runs {runs!r}; expected (first step, samples"
            " before it, batch) from step 0, batches >= 1",
            hint=hint,
            field="global_batch_size",
        )
    return out


class _Layout:
    """Global steps <-> global samples for a loader state: batch size, topologies, skips."""

    def __init__(
        self,
        dataset: Any,
        global_batch_size: int | BatchSchedule,
        state: dict[str, Any] | None,
        micro_batch_size: int | None,
        dp_size: int | None,
    ) -> None:
        self.segments = _step_segments(global_batch_size)
        g = int(self.segments[0][2])  # the first step's batch (a constant batch: every step's)
        batches = sorted({int(b) for _, _, b in self.segments})
        topology_hint = (
            "pass the run's micro-batch size and data-parallel size (positive ints), or None to"
            " take the state's (without a state: one rank reading the whole global batch)"
        )
        mbs = (
            None
            if micro_batch_size is None
            else _integer("micro_batch_size", micro_batch_size, 1, topology_hint)
        )
        dp = None if dp_size is None else _integer("dp_size", dp_size, 1, topology_hint)
        named = None
        if state is None:
            history = [(0, g if mbs is None else mbs, 1 if dp is None else dp)]
        else:  # the state's topologies; the sizes given place the samples before its history
            history = topology_history(state)
            if mbs is not None or dp is not None:
                _, last_mbs, last_dp = history[-1]
                named = (0, last_mbs if mbs is None else mbs, last_dp if dp is None else dp)
        for start, m, d in [*([named] if named else []), *history]:
            odd = [b for b in batches if b % (m * d)]
            if odd:
                since = f" (the state's topology from global sample {start})" if start else ""
                raise ConfigError(
                    f"global_batch_size {odd[0]} is not a multiple of micro_batch_size {m} x"
                    f" dp_size {d}{since}",
                    hint="pass the run's global batch size, micro-batch size and data-parallel"
                    " size",
                    field="global_batch_size",
                )
        if named and history[0][0] and mbs is not None and dp is not None:
            history = [named, *history]
        first_steps, first_samples, sizes = zip(*self.segments, strict=True)
        self._first_step = np.array(first_steps, dtype=np.int64)
        self._first_sample = np.array(first_samples, dtype=np.int64)
        self._size = np.array(sizes, dtype=np.int64)
        self.topologies = history
        self.starts = np.array([t[0] for t in history], dtype=np.int64)
        self.skips = sorted(
            (int(s["at"]), int(s["samples"])) for s in parse_skips((state or {}).get("skips"))
        )  # checked as a resume checks them: a malformed entry is the loader's StateError
        self.length = len(dataset)
        # each topology's first delivered position and micro-batch group (micro x dp): a resume
        # may start one inside a step (a state saved between its micro-batches), where its
        # micro-batches begin, not at the step's start
        self._begin = [self.delivered(int(start)) for start, _, _ in history]
        self._group = [m * d for _, m, d in history]

    def _topology_at(self, delivered: int) -> int:
        """The history entry in force at a delivered position (the first before the history:
        only a step's first micro-batch is looked up there)."""
        return max(bisect.bisect_right(self._begin, delivered) - 1, 0)

    def _micro_start(self, delivered: int) -> int:
        """The delivered position where the micro-batch holding ``delivered`` begins."""
        i = self._topology_at(delivered)
        begin, group = self._begin[i], self._group[i]
        return begin + (delivered - begin) // group * group

    def _micro_batches_to(self, delivered: int) -> int:
        """Micro-batches begun at or before ``delivered`` (all topologies)."""
        count = 0
        for i, (begin, group) in enumerate(zip(self._begin, self._group, strict=True)):
            if begin > delivered:
                break
            end = self._begin[i + 1] - 1 if i + 1 < len(self._begin) else delivered
            if end >= begin:
                count += (min(end, delivered) - begin) // group + 1
        return count

    @property
    def known_from(self) -> int:
        """The first global sample whose topology is known (the history's first entry)."""
        return int(self.starts[0])

    def step_start(self, step: int) -> tuple[int, int]:
        """(first delivered position, global batch) of step ``step``: samples the training loop
        received before it, and its size."""
        i = int(np.searchsorted(self._first_step, step, side="right")) - 1
        size = int(self._size[i])
        return int(self._first_sample[i]) + (step - int(self._first_step[i])) * size, size

    def step_at(self, delivered: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(step, position in the step) of delivered positions (``delivered``-th received)."""
        i = np.searchsorted(self._first_sample, delivered, side="right") - 1
        step, position = np.divmod(delivered - self._first_sample[i], self._size[i])
        return step + self._first_step[i], position

    def step_end(self, step: np.ndarray) -> np.ndarray:
        """The delivered position after each of ``step`` (steps >= 0)."""
        i = np.searchsorted(self._first_step, step, side="right") - 1
        return self._first_sample[i] + (step - self._first_step[i] + 1) * self._size[i]

    def step_samples(self, step: int) -> np.ndarray:
        """The global samples step ``step`` received, in the order served: the step's
        delivered positions, each moved past the skips at or before it (a skip may fall between
        the micro-batches of a step)."""
        start, size = self.step_start(step)
        k = np.arange(start, start + size, dtype=np.int64)
        for at, samples in self.skips:
            k = np.where(k >= at, k + samples, k)
        return k

    def global_of(self, delivered: int) -> int:
        """The global sample the training loop received as its ``delivered``-th (from 0)."""
        k = delivered
        for at, samples in self.skips:
            if at <= k:
                k += samples
        return k

    def delivered(self, sample: int) -> int:
        """Samples the training loop received before global sample ``sample``."""
        return sample - sum(min(n, max(sample - at, 0)) for at, n in self.skips)

    def step_of(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(step, position in the step) of each served global sample; -1 for a skipped one."""
        shift = np.zeros(samples.size, dtype=np.int64)
        skipped = np.zeros(samples.size, dtype=bool)
        for at, n in self.skips:
            skipped |= (samples >= at) & (samples < at + n)
            shift += np.where(samples >= at + n, n, 0)
        step, position = self.step_at(samples - shift)
        return np.where(skipped, -1, step), position

    def row(self, sample: int, position: int, pieces: tuple[Piece, ...]) -> Row:
        """Rank, micro-batch and row of the sample at ``position`` of its global step, by the
        topology in force at ``sample`` (``placed`` first): its rank and row by its place in
        its micro-batch (micro-batches of a topology begin where it began), its micro-batch
        counted among those holding samples of the step (one begun in the step before counts
        first)."""
        delivered = self.delivered(sample)
        i = self._topology_at(delivered)
        _, mbs, _ = self.topologies[i]
        rank, row = divmod((delivered - self._begin[i]) % self._group[i], mbs)
        first = self._micro_start(delivered - int(position))  # the step's first micro-batch
        micro = self._micro_batches_to(delivered) - self._micro_batches_to(first)
        return Row(rank, micro, row, sample, pieces)

    def placed(self, sample: int) -> bool:
        """Whether the state records the topology that served global sample ``sample``."""
        return sample >= self.known_from


_UNPLACED_HINT = (
    "pass both micro_batch_size= and dp_size= of the run that served it (the CLI's"
    " --micro-batch-size and --data-parallel-size): they place the samples before the state's"
    " topology history; or pass the loader state saved before that sample"
)


def _unplaced_why(layout: _Layout) -> str:
    """Why the rows of samples before the state's topology history have no known place."""
    return (
        f"the loader state records the micro-batch and data-parallel sizes only from global"
        f" sample {layout.known_from} on (a state saved by a tokenload before it kept a topology"
        " history, a loader started at consumed_samples without a state, or a history past its"
        f" {TOPOLOGIES_KEPT} newest entries), and the run may have served the samples before it"
        " on another topology, whose ranks and micro-batches differ"
    )


def _prepared(dataset: Any, state: dict[str, Any] | None, needs: type, what: str) -> Any:
    """The dataset the loader reads, put where ``state``'s run left its mixture; a
    ``ConfigError`` unless it answers the query (the protocol ``needs``)."""
    data = loader_dataset(dataset)
    if not isinstance(data, needs):
        raise ConfigError(
            f"{what} needs a tokenload dataset of the Megatron or computed order; this is a"
            f" {type(dataset).__name__}",
            hint="build the data with tokenload.datasets.build_datasets",
        )
    if state is not None:
        _check_state(data, state)
    return data


def _check_state(data: Any, state: dict[str, Any]) -> None:
    """The loader's own resume check on ``state`` (``TokenloadDataLoader.load_state_dict``: the
    fingerprint of the data and its order, or for a computed blend its mixture's order) and,
    as a resume does, ``data``'s mixture put where the state's run left it. A state saved for
    other data, another seed or another packing is a ``StateError`` here as at a resume: its
    steps are not this dataset's."""
    from .loader.dataloader import build_dataloader

    saved = LoaderState.from_dict(state)
    loader = build_dataloader(
        data,
        micro_batch_size=saved.micro_batch_size,
        dp_rank=0,
        dp_size=saved.dp_size,
        num_workers=0,
    )
    loader.load_state_dict(state)  # its refusal's hint says what this dataset reads


def explain(
    dataset: Any,
    *,
    step: int,
    global_batch_size: int | BatchSchedule,
    state: dict[str, Any] | None = None,
    micro_batch_size: int | None = None,
    dp_size: int | None = None,
) -> list[Row]:
    """The rows of global step ``step`` (from 0) in rank order (rank, then its micro-batches,
    then their rows), each with the pieces of its ``tokens``. ``state``: the loader's state
    (module docstring): each step is laid out with the topology the state's history records for
    it. ``micro_batch_size``/``dp_size``: without a state, the topology of every step (default:
    one rank reading the whole global batch); with one, both given, the topology of the samples
    before its history (a state that does not record them). Changes ``dataset``'s mixture to
    the state's (build it for the query). ``StateError`` for a step the state cannot answer
    (before its mixture chain, or before the first sample whose topology it records)."""
    layout = _Layout(dataset, global_batch_size, state, micro_batch_size, dp_size)
    data = _prepared(dataset, state, PieceSource, "explain")
    step = _integer("step", step, 0, "pass a global step of the run, from 0")
    begin, size = layout.step_start(step)
    if begin + size > _delivered(layout):
        first, last = (layout.global_of(begin + i) for i in (0, size - 1))
        raise ConfigError(
            f"step {step} holds samples {first}..{last}; the dataset holds {layout.length}",
            hint="ask for a step of the run, with its global batch size",
            field="step",
        )
    samples = layout.step_samples(step)
    first, last = int(samples[0]), int(samples[-1])
    try:
        p = data.sample_pieces(samples)
    except IndexError as exc:  # before the chain of a state whose mixture changed at a resume
        raise StateError(
            f"step {step} is before the state's mixture chain ({exc})",
            hint="pass the loader state saved before the mixture changed (or none)",
        ) from None
    if not layout.placed(first):
        raise StateError(
            f"step {step} (global samples {first}..{last}) was served before global sample"
            f" {layout.known_from}; {_unplaced_why(layout)}",
            hint=_UNPLACED_HINT,
        )
    rows = []
    for i, k in enumerate(samples.tolist()):
        lo, hi = int(p.offsets[i]), int(p.offsets[i + 1])
        pieces = tuple(
            Piece(int(s), int(d), int(a), int(b))
            for s, d, a, b in zip(
                p.source[lo:hi].tolist(),
                p.document[lo:hi].tolist(),
                p.start[lo:hi].tolist(),
                p.stop[lo:hi].tolist(),
            )
        )
        rows.append(layout.row(k, i, pieces))
    rows.sort(key=lambda r: (r.rank, r.micro_batch, r.row))
    return rows


def where(
    dataset: Any,
    *,
    source: int,
    document: int,
    global_batch_size: int | BatchSchedule,
    state: dict[str, Any] | None = None,
    micro_batch_size: int | None = None,
    dp_size: int | None = None,
    steps: int | None = None,
) -> Steps:
    """Every global step whose rows hold a token of ``document`` (its index in the token file)
    of member ``source`` of the blend (0 for one source), with the rows; samples a skip dropped
    are listed apart. ``steps``: the run's training steps (default: every whole step the
    dataset holds; Megatron's order builds whole epochs, often more than the run draws). Direct
    (module docstring): no pass over the steps. What the state cannot answer is said in
    ``Steps.notes``: the steps before a mixture change at a resume (``Steps.first_sample``), and
    the rank, micro-batch and row of samples served before the state's topology history
    (``Steps.unplaced``)."""
    layout = _Layout(dataset, global_batch_size, state, micro_batch_size, dp_size)
    data = _prepared(dataset, state, DocumentSamples, "where")
    members = len(loader_dataset(dataset).describe_sources().members)
    if (
        isinstance(source, bool)
        or not isinstance(source, numbers.Integral)
        or not 0 <= source < members
    ):
        raise ConfigError(
            f"source is {source!r}; the dataset has {members} source(s), numbered from 0",
            hint="pass the member's 0-based position in the blend",
            field="source",
        )
    source = int(source)
    document = _integer(
        "document", document, 0, "pass the document's index in the source's token file, from 0"
    )
    count = _documents(data, source, members)
    if count is not None and document >= count:
        raise ConfigError(
            f"document is {document}; source {source}'s token file holds {count} documents"
            f" (sequences), numbered 0..{count - 1}",
            hint="pass a document index of that token file (for Megatron's order the sequence"
            " id in its .idx), or another --source",
            field="document",
        )
    if steps is not None:
        steps = _integer("steps", steps, 0, "pass the run's training steps, or None for all")
    samples = np.sort(np.asarray(data.samples_of(source, document), dtype=np.int64))
    step, position = layout.step_of(samples)
    # a last partial step: not served
    whole = layout.step_end(np.maximum(step, 0)) <= _delivered(layout)
    bound = layout.length if steps is None else min(steps, layout.length)
    served = (step >= 0) & whole & (step < bound)
    rows, unplaced = [], []
    for s, k, p in zip(step[served].tolist(), samples[served].tolist(), position[served]):
        if layout.placed(k):
            rows.append((s, layout.row(k, p, ())))
        else:
            unplaced.append((s, k))
    last = (
        layout.length
        if steps is None
        else min(layout.global_of(layout.step_start(steps)[0]), layout.length)
    )
    notes = []
    origin = _chain_origin(data, state, layout.length)
    at, into = layout.step_at(np.array([layout.delivered(origin)], dtype=np.int64))
    covered = int(at[0]) + bool(into[0])  # the first step wholly in the chain
    if origin and (steps is None or steps > 0):
        notes.append(
            f"steps before {covered} (global samples before {origin}) are not covered: the"
            f" loader state's mixture changed at the resume at global sample {origin}, and its"
            " chain starts there; ask with the loader state saved before the change for them"
        )
    if unplaced:
        notes.append(
            f"the rank, micro-batch and row of {len(unplaced)} sample(s) (steps"
            f" {sorted({s for s, _ in unplaced})}) are not known: {_unplaced_why(layout)}; to"
            f" place them, {_UNPLACED_HINT}"
        )
    return Steps(
        steps=sorted({s for s, _ in rows} | {s for s, _ in unplaced}),
        rows=rows,
        skipped=samples[(step < 0) & (samples < last)].tolist(),
        unplaced=unplaced,
        first_sample=origin,
        notes=notes,
    )


def _documents(data: Any, source: int, members: int) -> int | None:
    """Documents (sequences) of member ``source``'s token file, or None when the dataset does
    not say (then any document >= 0 is asked)."""
    blended = getattr(data, "datasets", None)
    member = blended[source] if isinstance(blended, list) and len(blended) == members else data
    lengths = getattr(getattr(member, "source", None), "sequence_lengths", None)
    return None if lengths is None else len(lengths)


def _chain_origin(data: Any, state: dict[str, Any] | None, length: int) -> int:
    """The first global sample of the state's mixture chain: 0, or for a state whose mixture
    changed at a resume, that resume's (``sample_pieces`` refuses the samples before it with an
    ``IndexError``). A binary search of at most log2(consumed) one-sample reads."""
    if state is None or state.get("mixture") is None or not length:
        return 0

    def answered(k: int) -> bool:
        try:
            data.sample_pieces(np.array([k], dtype=np.int64))
        except IndexError:
            return False
        return True

    if answered(0):
        return 0
    consumed = LoaderState.from_dict(state).consumed_samples
    lo, hi = 0, min(consumed, length - 1)  # lo refused; the chain starts at or before consumed
    if not answered(hi):
        return consumed
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if answered(mid) else (mid, hi)
    return hi


def _delivered(layout: _Layout) -> int:
    """Samples the training loop can receive: the dataset's, less the skipped ones."""
    return layout.length - sum(n for _, n in layout.skips)
