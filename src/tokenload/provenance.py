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
step), its mixture chain (a schedule, ``set_weights`` changes, a change at a resume) and its
topology (micro-batch size and data-parallel size, for the rank, micro-batch and row of each
sample). Steps count the global batches the training loop received: a skip moves the later
ones. A state whose mixture changed at a resume describes the run from that resume on
(its chain's origin): earlier steps are answered with the state saved before the change. The
state is checked against the dataset by the loader's own resume check (``load_state_dict``): one
saved for other data, another seed or another packing is the ``StateError`` a resume raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .contract import DocumentSamples, PieceSource
from .errors import ConfigError, StateError
from .loader.mapstyle import loader_dataset
from .loader.state import LoaderState

__all__ = ["Piece", "Row", "Steps", "explain", "where"]


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
    """Sorted distinct global steps."""
    rows: list[tuple[int, Row]]
    """(step, row) of every sample that holds a token of it, in order."""
    skipped: list[int]
    """Global samples that held it but were skipped (``loader.skip``): in no step."""


class _Layout:
    """Global steps <-> global samples for a loader state: batch size, topology, skips."""

    def __init__(
        self,
        dataset: Any,
        global_batch_size: int,
        state: dict[str, Any] | None,
        micro_batch_size: int | None,
        dp_size: int | None,
    ) -> None:
        g = global_batch_size
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ConfigError(
                f"global_batch_size is {g!r}; expected a positive int",
                hint="pass the run's global batch size in samples",
                field="global_batch_size",
            )
        saved = LoaderState.from_dict(state) if state is not None else None
        mbs = micro_batch_size or (saved.micro_batch_size if saved else g)
        dp = dp_size or (saved.dp_size if saved else 1)
        if g % (mbs * dp):
            raise ConfigError(
                f"global_batch_size {g} is not a multiple of micro_batch_size {mbs} x dp_size {dp}",
                hint="pass the run's global batch size, micro-batch size and data-parallel size",
                field="global_batch_size",
            )
        self.g, self.mbs, self.dp = g, mbs, dp
        self.skips = sorted(
            (int(s["at"]), int(s["samples"])) for s in (state or {}).get("skips") or []
        )
        self.length = len(dataset)

    def first_sample(self, step: int) -> int:
        """The global sample step ``step`` starts at (skips before it passed over)."""
        k = step * self.g
        for at, samples in self.skips:
            if at <= k:
                k += samples
        return k

    def step_of(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(step, position in the step) of each served global sample; -1 for a skipped one."""
        shift = np.zeros(samples.size, dtype=np.int64)
        skipped = np.zeros(samples.size, dtype=bool)
        for at, n in self.skips:
            skipped |= (samples >= at) & (samples < at + n)
            shift += np.where(samples >= at + n, n, 0)
        delivered = samples - shift
        step, position = np.divmod(delivered, self.g)
        return np.where(skipped, -1, step), position

    def row(self, sample: int, position: int, pieces: tuple[Piece, ...]) -> Row:
        """Rank, micro-batch and row of the sample at ``position`` of its global step."""
        group = self.mbs * self.dp
        micro, within = divmod(position, group)
        rank, row = divmod(within, self.mbs)
        return Row(rank, micro, row, sample, pieces)


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
    try:
        loader.load_state_dict(state)
    except StateError as exc:
        raise StateError(exc.message, hint=_refusal_hint(data)) from None


def _refusal_hint(data: Any) -> str:
    """What to do when the loader refuses a state here: this dataset's order and items in words
    (what a state of another run differs in: packing, sequence length, the item options the
    fingerprint covers), and the fix."""
    sources = data.describe_sources()
    packing = (
        "packed rows of whole documents (`packing='best-fit'`)"
        if sources.packed
        else "concatenated samples (`packing='concat'`)"
    )
    lengths = sorted({m.sequence_length for m in sources.members if m.sequence_length})
    length = f" of {lengths[0]} tokens" if len(lengths) == 1 else ""
    members = getattr(data, "datasets", None) or [data]
    item = getattr(data, "item", None) or getattr(members[0], "item", None)
    items = ""
    if item is not None:
        eod = "no EOD id" if item.eod_id is None else f"EOD id {item.eod_id}"
        on = [
            words
            for flag, words in (
                (item.eod_mask_loss, "EOD loss masking"),
                (item.reset_position_ids, "position ids reset at EODs"),
                (item.reset_attention_mask, "attention mask reset at EODs"),
                (item.create_attention_mask, "an attention mask"),
                (item.inter_document_masking, "inter-document masking"),
            )
            if flag
        ]
        items = f", items with {', '.join([eod, *on])}" + ("" if on else " and no item option")
    return (
        f"this dataset reads {packing}{length}{items}; a state is answered only by the dataset"
        " of the run that saved it: build it with that run's packing, `sequence_length=N`,"
        " `random_seed=N`, item options, token files, blend and split (or pass no state)"
    )


def explain(
    dataset: Any,
    *,
    step: int,
    global_batch_size: int,
    state: dict[str, Any] | None = None,
    micro_batch_size: int | None = None,
    dp_size: int | None = None,
) -> list[Row]:
    """The rows of global step ``step`` (from 0) in rank order (rank, then its micro-batches,
    then their rows), each with the pieces of its ``tokens``. ``state``: the loader's state
    (module docstring); ``micro_batch_size``/``dp_size`` name the topology when no state does
    (default: one rank reading the whole global batch). Changes ``dataset``'s mixture to the
    state's (build it for the query)."""
    layout = _Layout(dataset, global_batch_size, state, micro_batch_size, dp_size)
    data = _prepared(dataset, state, PieceSource, "explain")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"step is {step!r}; expected an int >= 0", hint="pass a global step")
    first = layout.first_sample(step)
    if first + global_batch_size > layout.length:
        raise ConfigError(
            f"step {step} holds samples {first}..{first + global_batch_size - 1}; the dataset"
            f" holds {layout.length}",
            hint="ask for a step of the run, with its global batch size",
            field="step",
        )
    samples = np.arange(first, first + global_batch_size, dtype=np.int64)
    try:
        p = data.sample_pieces(samples)
    except IndexError as exc:  # before the chain of a state whose mixture changed at a resume
        raise StateError(
            f"step {step} is before the state's mixture chain ({exc})",
            hint="pass the loader state saved before the mixture changed (or none)",
        ) from None
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
    global_batch_size: int,
    state: dict[str, Any] | None = None,
    micro_batch_size: int | None = None,
    dp_size: int | None = None,
    steps: int | None = None,
) -> Steps:
    """Every global step whose rows hold a token of ``document`` (its index in the token file)
    of member ``source`` of the blend (0 for one source), with the rows; samples a skip dropped
    are listed apart. ``steps``: the run's training steps (default: every whole step the
    dataset holds; Megatron's order builds whole epochs, often more than the run draws). Direct
    (module docstring): no pass over the steps."""
    layout = _Layout(dataset, global_batch_size, state, micro_batch_size, dp_size)
    data = _prepared(dataset, state, DocumentSamples, "where")
    members = len(loader_dataset(dataset).describe_sources().members)
    if isinstance(source, bool) or not isinstance(source, int) or not 0 <= source < members:
        raise ConfigError(
            f"source is {source!r}; the dataset has {members} source(s), numbered from 0",
            hint="pass the member's 0-based position in the blend",
            field="source",
        )
    if isinstance(document, bool) or not isinstance(document, int) or document < 0:
        raise ConfigError(f"document is {document!r}; expected an int >= 0", hint="")
    samples = np.sort(np.asarray(data.samples_of(source, document), dtype=np.int64))
    step, position = layout.step_of(samples)
    whole = step * layout.g + layout.g <= _delivered(layout)  # a last partial step: not served
    served = (step >= 0) & whole & (step < (np.iinfo(np.int64).max if steps is None else steps))
    rows = [
        (int(s), layout.row(int(k), int(p), ()))
        for s, k, p in zip(step[served].tolist(), samples[served].tolist(), position[served])
    ]
    last = layout.first_sample(steps) if steps is not None else layout.length
    return Steps(
        steps=sorted({s for s, _ in rows}),
        rows=rows,
        skipped=samples[(step < 0) & (samples < last)].tolist(),
    )


def _delivered(layout: _Layout) -> int:
    """Samples the training loop can receive: the dataset's, less the skipped ones."""
    return layout.length - sum(n for _, n in layout.skips)
