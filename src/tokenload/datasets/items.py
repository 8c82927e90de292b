"""Turning token windows into training items, a whole micro-batch at a time.

Given a ``(B, S + extra)`` matrix of token windows (short windows padded with ``pad_id``), this
builds Megatron's item fields for all rows at once: ``tokens``, ``labels``, ``loss_mask``,
``position_ids`` and, only when asked, the ``(B, 1, S, S)`` boolean ``attention_mask`` (True =
masked; it costs S x S per sample, so it is off by default) or ``cu_seqlens``/``max_seqlen`` for
document-aware attention. Resets after EOD are computed with running maxima over EOD positions
rather than a Python loop per EOD, and the order of Megatron's masking steps is kept: masks come
from the input tokens, then padded labels lose their loss and pad ids become 0.

**Document boundaries.** With ``inter_document_masking``, megatron-core 0.19.2 takes ``cu_seqlens``,
``max_seqlen`` and the per-document ``position_ids`` from the lengths of the document pieces a
sample is made of, not from EOD tokens (``GPTDataset.__getitem__``). A dataset that knows its
pieces passes them as ``bounds`` (``document_bounds`` makes them in that layout); then the
position ids restart at every boundary and ``cu_seqlens`` are the boundaries. Without ``bounds``
(a caller with no document lengths), the EOD rule stands. ``reset_position_ids`` and
``reset_attention_mask`` without ``inter_document_masking`` keep the EOD rule, as Megatron does.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..contract import (  # the loader's contract
    PIECE_FIRST,
    PIECE_INPUTS,
    PIECE_LENGTH,
    PIECE_SLOT,
    ROW_POSITIONS,
    Allocator,
)
from ..errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ItemConfig:
    """Which fields a GPT item carries and how EOD and padding are treated."""

    sequence_length: int
    """S, tokens per sample."""
    add_extra_token: bool = True
    """Read S + 1 tokens so labels are the inputs shifted by one (Megatron's default)."""
    eod_id: int | None = None
    """End-of-document token id (needed by the EOD options and cu_seqlens)."""
    pad_id: int = -1
    """Padding id for short samples (-1 when the tokenizer has none, as in Megatron)."""
    eod_mask_loss: bool = False
    """Zero the loss where the input token is EOD."""
    reset_position_ids: bool = False
    """Restart position ids after every EOD."""
    reset_attention_mask: bool = False
    """Block attention across EOD boundaries (in the attention mask)."""
    create_attention_mask: bool = False
    """Return the S x S attention mask (Megatron creates it unless told not to; we do not)."""
    inter_document_masking: bool = False
    """Return cu_seqlens and max_seqlen (the documents' boundaries) instead of a mask, with
    position ids restarting at every document."""

    def __post_init__(self) -> None:
        # Python ints and bools, whatever the caller passed (NumPy's, a tokenizer's): the fields
        # are in fingerprints by their repr, which for np.int64(2) is not 2's (a resume with the
        # same EOD id as a plain int was refused), and in states, which JSON and torch.load take
        for name in ("sequence_length", "eod_id", "pad_id"):
            value = getattr(self, name)
            if (value is None and name == "eod_id") or type(value) is int:
                continue
            try:
                if isinstance(value, bool):
                    raise TypeError
                object.__setattr__(self, name, operator.index(value))
            except TypeError:
                raise ConfigError(
                    f"{name} is {value!r} ({type(value).__name__}); expected an int",
                    hint=f"pass {name} as a whole number",
                    field=name,
                ) from None
        for name in _FLAGS:
            flag = getattr(self, name)
            if not isinstance(flag, (bool, np.bool_)):  # "false" would be True
                raise ConfigError(
                    f"{name} is {flag!r} ({type(flag).__name__}); expected True or False",
                    hint=f"pass {name}=True or {name}=False",
                    field=name,
                )
            object.__setattr__(self, name, bool(flag))
        if self.sequence_length < 1:
            raise ConfigError(
                f"sequence_length is {self.sequence_length}", hint="use a positive sequence length"
            )
        # inter_document_masking takes the documents' lengths (build_items' bounds), not EODs
        needs_eod = self.eod_mask_loss or self.reset_position_ids or self.reset_attention_mask
        if needs_eod and self.eod_id is None:
            raise ConfigError(
                "EOD masking and position/attention resets need eod_id",
                hint="pass eod_id (the tokenizer's end-of-document id)",
            )

    @property
    def extra(self) -> int:
        return int(self.add_extra_token)

    @property
    def window(self) -> int:
        """Tokens read per sample."""
        return self.sequence_length + self.extra


_FLAGS = (
    "add_extra_token",
    "eod_mask_loss",
    "reset_position_ids",
    "reset_attention_mask",
    "create_attention_mask",
    "inter_document_masking",
)

NO_START = np.iinfo(np.int32).max
"""The fill of a ``doc_starts`` matrix past a row's pieces."""


def starts_matrix(rows: np.ndarray, slots: np.ndarray, rank: np.ndarray, batch: int) -> np.ndarray:
    """The ``doc_starts`` layout of pieces given by row, first slot and rank within the row:
    int32 ``(batch, most pieces in a row)``, each row's pieces' first slots in order (the first
    0), then ``NO_START``. One row per sample, so it is sliced and gathered like the windows."""
    width = int(rank.max()) + 1 if rank.size else 1
    out = np.empty((batch, width), dtype=np.int32)
    out.fill(NO_START)
    out[rows, rank] = slots
    return out


@functools.lru_cache(maxsize=4)
def _count(n: int) -> np.ndarray:
    """``arange(n)`` (read-only: shared), grown in powers of two."""
    out = np.arange(n, dtype=np.int64)
    out.flags.writeable = False
    return out


def upto(n: int) -> np.ndarray:
    """``arange(n)`` int64, a view of a shared read-only array."""
    return _count(max(1024, 1 << (n - 1).bit_length()))[:n]


def _offsets(first: np.ndarray, total: int) -> np.ndarray:
    """int64 CSR offsets of rows over ``total`` pieces, from each row's first piece."""
    offsets = np.empty(first.size + 1, dtype=np.int64)
    offsets[:-1] = first
    offsets[-1] = total
    return offsets


def _slots_in_rows(first: np.ndarray, count: np.ndarray, length: np.ndarray) -> np.ndarray:
    """int64 slot where each piece begins in its row (pieces flat, row after row, laid back to
    back from each row's slot 0; rows by their first piece and piece count)."""
    slot = np.cumsum(length, dtype=np.int64)
    slot -= length  # each piece's first token among all the rows'
    slot -= slot[first].repeat(count)
    return slot


def piece_starts(length: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Each row's pieces' first slots (``starts_matrix``), from the pieces' lengths flat
    (``first``: each row's first piece; every row has one)."""
    batch, total = first.size, length.size
    count = np.diff(_offsets(first, total))
    slot = _slots_in_rows(first, count, np.asarray(length, dtype=np.int64))
    rank = upto(total) - np.repeat(first, count)
    return starts_matrix(np.repeat(upto(batch), count), slot, rank, batch)


class PieceLayout(NamedTuple):
    """Where a plan lays its pieces in their rows, made once per plan (``piece_layout``) so that
    reads need not work it out: position ids are laid from ``slot`` and ``inputs``, the packing
    counts take ``documents``."""

    slot: np.ndarray
    """Each piece's first slot in its row (0 for a row's first), flat like the pieces."""
    inputs: np.ndarray
    """Input positions each piece covers: its tokens, but for a row's last piece the rest of the
    row's S inputs (its padding with it; 0 when it begins at slot S, the label-only slot)."""
    documents: np.ndarray
    """Each row's pieces with a token among its inputs (a row per sample)."""


def piece_layout(
    offsets: np.ndarray, length: np.ndarray, seq: int, *, documents: bool = True
) -> PieceLayout:
    """The ``PieceLayout`` of rows given as CSR ``offsets`` over their pieces' ``length`` (every
    row has a piece; no row holds more than S + 1 tokens): 2-byte slots while S + 1 < 32,768.
    ``documents=False``: the slots and input positions only (``documents`` left empty)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.size < 2:
        empty = np.zeros(0, dtype=np.int16 if seq + 1 < 1 << 15 else np.int32)
        return PieceLayout(empty, empty, np.zeros(0, dtype=np.int32))
    first, last, count = offsets[:-1], offsets[1:] - 1, np.diff(offsets)
    small = np.int16 if seq + 1 < 1 << 15 else np.int32
    length = np.asarray(length, dtype=np.int64)
    slot = _slots_in_rows(first, count, length)
    inputs = length.astype(small)
    tail = slot[last]  # each row's last piece's slot: S for one on the label-only slot
    inputs[last] = seq - tail
    per_row = np.zeros(0, dtype=np.int32)
    if documents:
        per_row = (count - (tail >= seq)).astype(np.int32)
    return PieceLayout(slot.astype(small), inputs, per_row)


def _piece_positions(
    first: np.ndarray,
    length: np.ndarray,
    out: np.ndarray,
    rows: tuple[np.ndarray, int, bool],
    laid_out: tuple[np.ndarray, np.ndarray] | None = None,
) -> None:
    """Position ids of packed rows into ``out`` (``(B, S)`` int64): each piece's slots count from
    0 at its first slot, and a row's padding goes on counting its last piece's (as
    ``document_bounds``: a short sample's shortfall joins its last part). Each row's pieces
    are laid from its slot 0 (rows of up to S + 1 tokens). ``laid_out``: the plan's (slot,
    input positions) per piece (``piece_layout``); else counted over the windows laid end to end
    from ``rows``: each row's tokens, the window's width W and whether a row may be short
    (``_window_positions``)."""
    if not out.shape[0]:
        return
    if laid_out is not None:
        _lay_positions(*laid_out, out)
    else:
        _window_positions(first, length, *rows, out)


def _window_positions(
    first: np.ndarray,
    length: np.ndarray,
    row_tokens: np.ndarray,
    window: int,
    padded: bool,
    out: np.ndarray,
) -> None:
    """``_piece_positions`` from the pieces alone: ``window_positions``, its first S columns
    converted into ``out``."""
    np.copyto(out, window_positions(first, length, row_tokens, window, padded)[:, : out.shape[1]])


def window_positions(
    first: np.ndarray, length: np.ndarray, row_tokens: np.ndarray, window: int, padded: bool
) -> np.ndarray:
    """Position ids of packed rows over their whole windows, ``(B, W)`` in 2-byte unsigned
    numbers (past W = 65,536: 4-byte), from the pieces alone: the rows' windows of W slots laid
    end to end hold the pieces back to back (each row's padding joined to its last piece), so a
    slot's position is its place in that line less its piece's first place. The numbers wrap
    around: each difference is still exact, being below W. A cumulative sum, a repeat and a
    subtraction, without the pieces' slots in their rows (``piece_layout``). ``first``: each
    row's first piece; ``length``: every piece's tokens; ``padded`` False: the read found no
    short row, so none is looked for."""
    batch = row_tokens.shape[0]
    small = "uint16" if window <= 1 << 16 else "uint32"
    sizes = np.asarray(length, dtype=np.int64)
    if padded and batch and int(_MIN(row_tokens)) < window:  # short rows: padding on the last piece
        sizes = sizes.copy()
        last = np.empty(batch, dtype=np.int64)
        last[:-1] = first[1:]
        last[-1] = sizes.size
        sizes[last - 1] += window - row_tokens
    begins = sizes.cumsum()
    begins -= sizes
    laid = begins.astype(small).repeat(sizes)
    np.subtract(_wrapped_count(batch * window, small), laid, out=laid)
    return laid.reshape(batch, window)


def _wrapped_count(n: int, dtype: str) -> np.ndarray:
    """``arange(n)`` in ``dtype``, wrapping around past its largest value (a read-only view)."""
    return _wrapped(max(1 << 15, 1 << (n - 1).bit_length()), dtype)[:n]


@functools.lru_cache(maxsize=4)
def _wrapped(n: int, dtype: str) -> np.ndarray:
    out = np.arange(n, dtype=np.int64).astype(dtype)
    out.flags.writeable = False
    return out


def _lay_positions(slot: np.ndarray, sizes: np.ndarray, out: np.ndarray) -> None:
    """``out`` (``(B, S)`` int64) from each piece's first slot in its row and the input
    positions it covers (a row's sum S): ``laid_positions``, converted once."""
    np.copyto(out, laid_positions(slot, sizes, out.shape[1]))


def laid_positions(slot: np.ndarray, sizes: np.ndarray, seq: int) -> np.ndarray:
    """Position ids of packed rows, ``(B, S)`` in the slots' narrow type, from each piece's first
    slot in its row and the input positions it covers (a row's sum S; ``piece_layout``): one
    repeat and one subtraction."""
    laid = slot.repeat(sizes).reshape(-1, seq)
    np.subtract(_row_slots(laid.shape[0], seq, laid.dtype), laid, out=laid)
    return laid


@functools.lru_cache(maxsize=8)
def _row_slots(batch: int, seq: int, dtype: np.dtype) -> np.ndarray:
    """``(batch, seq)``: each row's ``arange(seq)`` in ``dtype`` (read-only: shared)."""
    out = np.tile(np.arange(seq, dtype=dtype), (batch, 1))
    out.flags.writeable = False
    return out


def starts_bounds(documents: np.ndarray, seq: int) -> np.ndarray:
    """int32 ``(B, S + 1)`` boundaries in ``cu_seqlens`` layout (``document_bounds``) from a
    ``doc_starts`` matrix: 0, each piece's start but the row's first (at most S), then S."""
    batch, width = documents.shape
    out = np.empty((batch, seq + 1), dtype=np.int32)
    out.fill(seq)
    out[:, 0] = 0
    inner = min(width, seq + 1)
    np.minimum(documents[:, 1:inner], seq, out=out[:, 1:inner])
    return out


_INT64, _FLOAT32 = np.dtype(np.int64), np.dtype(np.float32)
_MIN, _MAX = np.minimum.reduce, np.maximum.reduce
_HEAD = 32  # columns of the boundaries where _bound_starts looks for a row's inner ones first


def build_items(
    text: np.ndarray,
    cfg: ItemConfig,
    *,
    padded: bool = True,
    alloc: Allocator | None = None,
    bounds: np.ndarray | None = None,
    row_tokens: np.ndarray | None = None,
    pieces: tuple[np.ndarray, np.ndarray] | None = None,
    laid_out: tuple[np.ndarray, np.ndarray] | None = None,
    positions: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Item fields for every row of ``text`` (token windows, shape ``(B, S + extra)``; int64 when
    padded, else any integer dtype).

    ``padded=False`` promises that no row was padded; with a negative pad id (no pad token), no
    token can then equal it, so the three padding passes are skipped. ``alloc`` makes the arrays
    of tokens, labels, loss_mask and position_ids. ``bounds``: each row's document boundaries,
    int32 ``(B, S + 1)`` in ``cu_seqlens`` layout (``document_bounds``): when given, position ids
    restart at every boundary, ``cu_seqlens``/``max_seqlen`` (with ``inter_document_masking``) are
    these boundaries, and a reset attention mask blocks across them; EOD tokens then decide only
    the loss mask (``eod_mask_loss``). ``row_tokens``: the tokens each row holds (packed rows,
    ``packed_rows.read_rows``); the slots from there on are padding whatever they hold, so the
    windows may keep the file's dtype, and a token equal to a pad id of 0 or more is padding too,
    as in a padded window. ``pieces``: packed rows' pieces, ``(first, length)`` (int64: each
    row's first piece, every piece's tokens, flat, row after row, laid back to back from each
    row's slot 0; needs ``row_tokens``), in place of ``bounds`` (the same fields; the boundaries
    are then made only for ``cu_seqlens``). ``laid_out``: with ``pieces``, the plan's first slot
    and input positions per piece (``piece_layout``), which give the position ids; or
    ``positions``: the rows' position ids over their windows, made with the read
    (``window_positions``), whose first S columns they are.
    """
    if pieces is not None and row_tokens is None:
        raise ValueError("build_items(pieces=) needs row_tokens")
    if pieces is not None and bounds is None and cfg.inter_document_masking:
        bounds = starts_bounds(piece_starts(pieces[1], pieces[0]), text.shape[1] - cfg.extra)
    new = alloc or _empty
    pad, extra = cfg.pad_id, cfg.extra
    batch, seq = text.shape[0], text.shape[1] - extra
    tokens, labels = new((batch, seq), _INT64), new((batch, seq), _INT64)
    # one converting copy each, straight from the (possibly uint16) windows
    if extra:
        np.copyto(tokens, text[:, :-1])
        np.copyto(labels, text[:, 1:])
    else:
        np.copyto(tokens, text)
        labels[:, :-1] = tokens[:, 1:]
        labels[:, -1] = pad
    masked_by_documents = cfg.create_attention_mask and cfg.reset_attention_mask
    by_eod = (bounds is None and pieces is None) and (
        cfg.reset_position_ids or cfg.inter_document_masking or masked_by_documents
    )
    if by_eod and cfg.eod_id is None:  # inter_document_masking without the documents' lengths
        raise ConfigError(
            "cu_seqlens without document boundaries are found from EOD tokens, and eod_id is None",
            hint="pass eod_id (the tokenizer's end-of-document id)",
        )
    is_eod = tokens == cfg.eod_id if cfg.eod_mask_loss or by_eod else None
    loss_mask = new((batch, seq), _FLOAT32)
    loss_mask.fill(1.0)
    if cfg.eod_mask_loss:
        loss_mask[is_eod] = 0.0
    position_ids = new((batch, seq), _INT64)
    starts = None  # where each position's document begins
    if pieces is not None:
        assert row_tokens is not None  # (checked above: pieces come with row_tokens)
        if positions is not None:
            np.copyto(position_ids, positions[:, :seq])
        else:
            rows = (row_tokens, text.shape[1], padded)
            _piece_positions(pieces[0], pieces[1], position_ids, rows, laid_out)
        # Megatron's EOD rule on top of the documents: with reset_position_ids or a reset
        # attention mask (and no inter_document_masking, whose boundaries are the documents'),
        # an EOD token inside a document also starts a new segment, as in a concatenated sample;
        # the row's padding still goes on counting its last document (an EOD before it starts
        # nothing)
        eod_rule = (
            (cfg.reset_position_ids or masked_by_documents)
            and not cfg.inter_document_masking
            and cfg.eod_id is not None
        )
        if masked_by_documents or eod_rule:
            starts = upto(seq)[None, :] - position_ids
        if eod_rule:
            assert starts is not None and row_tokens is not None  # pieces come with row_tokens
            held_eod = (tokens == cfg.eod_id) & (upto(seq)[None, :] < row_tokens[:, None] - 1)
            np.maximum(starts, _segment_starts(held_eod), out=starts)
            if cfg.reset_position_ids:
                np.subtract(upto(seq)[None, :], starts, out=position_ids)
    else:
        if bounds is not None:
            starts = _bound_starts(bounds, seq)
        elif by_eod:
            assert is_eod is not None  # by_eod
            starts = _segment_starts(is_eod)
        if starts is not None and (
            bounds is not None or cfg.reset_position_ids or cfg.inter_document_masking
        ):
            np.subtract(upto(seq)[None, :], starts, out=position_ids)
        else:
            np.copyto(position_ids, upto(seq))
    out = {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}
    if cfg.create_attention_mask and not cfg.inter_document_masking:
        out["attention_mask"] = _attention_mask(batch, seq, starts if masked_by_documents else None)
    if cfg.inter_document_masking:
        if bounds is not None:
            cu = np.array(bounds, dtype=np.int32)  # its own array, as every field
            out["cu_seqlens"], out["max_seqlen"] = cu, np.diff(cu, axis=1).max(axis=1)
        else:
            assert is_eod is not None  # by_eod
            out["cu_seqlens"], out["max_seqlen"] = _cu_seqlens(is_eod)
    if padded or pad >= 0 or not extra:
        if row_tokens is not None:
            _clear_short_rows(text, tokens, labels, loss_mask, pad, extra, row_tokens, padded)
        else:
            _clear_padding(text, tokens, labels, loss_mask, pad, extra)
    return out


def finish_windows(
    batch: dict[str, Any], cfg: ItemConfig, alloc: Allocator | None = None
) -> dict[str, np.ndarray]:
    """``build_items`` over a ``read_batch`` result: its ``windows``, its ``padded`` flag, and the
    rows' document boundaries (``doc_bounds``) or pieces (``piece_first``, ``piece_length``) and
    token counts (``row_tokens``) when the read made them."""
    return build_items(
        batch["windows"],
        cfg,
        padded=bool(batch["padded"]),
        alloc=alloc,
        bounds=batch.get("doc_bounds"),
        row_tokens=batch.get("row_tokens"),
        pieces=(batch[PIECE_FIRST], batch[PIECE_LENGTH]) if PIECE_FIRST in batch else None,
        laid_out=(batch[PIECE_SLOT], batch[PIECE_INPUTS]) if PIECE_SLOT in batch else None,
        positions=batch.get(ROW_POSITIONS),
    )


def _clear_padding(
    text: np.ndarray,
    tokens: np.ndarray,
    labels: np.ndarray,
    loss_mask: np.ndarray,
    pad: int,
    extra: int,
) -> None:
    """Padded labels lose their loss, then pad ids become 0. With the extra token, one comparison
    of the (often uint16) windows gives both masks, applied by ``copyto(where=)``: measured at
    16 x 2048 with pad id 0, build_items costs 37 us CPU against 46 with two int64 comparisons and
    three boolean-index passes (23 without a pad id). One int64 conversion of the windows copied
    into tokens and labels was slower than the two converting copies (29 against 23 us)."""
    if not extra:
        loss_mask[labels == pad] = 0.0
        tokens[tokens == pad] = 0
        labels[labels == pad] = 0
        return
    is_pad = np.equal(text, pad)
    _zero_padding(tokens, labels, loss_mask, is_pad[:, 1:], is_pad[:, :-1])


def _zero_padding(
    tokens: np.ndarray,
    labels: np.ndarray,
    loss_mask: np.ndarray,
    label_pad: np.ndarray,
    token_pad: np.ndarray,
) -> None:
    """Padding labels lose their loss and become 0; padding tokens become 0."""
    np.copyto(loss_mask, 0.0, where=label_pad)
    np.copyto(labels, 0, where=label_pad)
    np.copyto(tokens, 0, where=token_pad)


def _clear_short_rows(
    text: np.ndarray,
    tokens: np.ndarray,
    labels: np.ndarray,
    loss_mask: np.ndarray,
    pad: int,
    extra: int,
    row_tokens: np.ndarray,
    short: bool = True,
) -> None:
    """``_clear_padding`` where each row's padding is the slots past its ``row_tokens`` (whatever
    they hold); with a pad id of 0 or more, a token equal to it is padding too, as in a padded
    window. The same fields as a window padded with the pad id would give. Every row is cleared
    as a full one (``_clear_padding``: a token equal to the pad id; without the extra token, the
    last label), then each short row's tail: few rows are short (best-fit fills nearly every
    row), so a slice each costs less than a mask of the whole micro-batch. ``short=False``: the
    read found no short row (its ``padded`` flag), so none is looked for."""
    width = text.shape[1]
    if pad >= 0 or not extra:
        _clear_padding(text, tokens, labels, loss_mask, pad, extra)
    if not short or not row_tokens.size or int(_MIN(row_tokens)) >= width:
        return
    for row in np.flatnonzero(row_tokens < width).tolist():
        held = int(row_tokens[row])  # window slots [held, width) are padding
        tokens[row, held:] = 0  # token i is slot i
        labels[row, held - 1 :] = 0  # label i is slot i + 1 (a row holds at least 1 token)
        loss_mask[row, held - 1 :] = 0.0


def _empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype=dtype)


def _segment_starts(is_eod: np.ndarray) -> np.ndarray:
    """For each position, the index where its document segment starts (after the last EOD
    before it)."""
    batch, seq = is_eod.shape
    begins = np.zeros((batch, seq), dtype=np.int64)
    begins[:, 1:] = np.where(is_eod[:, :-1], np.arange(1, seq, dtype=np.int64), 0)
    return np.maximum.accumulate(begins, axis=1)


def _bound_starts(bounds: np.ndarray, seq: int) -> np.ndarray:
    """For each position, where its document begins: the largest boundary at or before it
    (boundaries of S and past are ends, never starts). For non-decreasing boundaries this is
    megatron-core's ``position_ids[start:end] = arange(end - start)`` for every pair."""
    batch = bounds.shape[0]
    head = bounds[:, :_HEAD]
    if (
        batch
        and bounds.shape[1] > _HEAD
        and _MIN(head[:, -1]) >= seq
        and not _MAX(np.abs(head[:, 0]))
        and _MIN(head[:, 1:] >= head[:, :-1], axis=None)
        and _MIN(bounds[:, _HEAD:], axis=None) >= seq
    ):
        # the usual layout (document_bounds): each row's boundaries rise from 0, and its inner
        # ones (below S) sit in its first columns: each document's start repeated over its
        # positions, with no pass over the whole matrix but one comparison of its tail
        rows, at = np.nonzero(head < seq)
        begins = head[rows, at].astype(np.int64)
        sizes = np.empty_like(begins)
        sizes[:-1] = begins[1:]
        sizes[:-1][rows[:-1] != rows[1:]] = seq  # a row's last document ends at S
        sizes[-1] = seq
        sizes -= begins
        return np.repeat(begins, sizes).reshape(batch, seq)
    # the inner boundaries only (a few per row): one comparison pass, then small gathers
    rows, at = np.nonzero(bounds[:, 1:] < seq)
    values = bounds[rows, at + 1].astype(np.int64)
    keep = values >= 0
    begins = np.zeros((batch, seq), dtype=np.int64)
    begins[rows[keep], values[keep]] = values[keep]
    return np.maximum.accumulate(begins, axis=1)


def _attention_mask(batch: int, seq: int, starts: np.ndarray | None) -> np.ndarray:
    """Causal mask (True = masked), blocked across documents when their ``starts`` are given."""
    causal = np.tril(np.ones((seq, seq), dtype=bool))
    if starts is None:
        blocked: np.ndarray = np.broadcast_to(~causal, (batch, 1, seq, seq)).copy()
        return blocked
    same = starts[:, :, None] == starts[:, None, :]
    masked: np.ndarray = ~(causal[None] & same)[:, None]
    return masked


def _cu_seqlens(is_eod: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: int32 boundaries [0, after each EOD..., S], padded to S + 1 with S; max length."""
    batch, seq = is_eod.shape
    cu = np.full((batch, seq + 1), seq, dtype=np.int32)
    cu[:, 0] = 0
    ends = is_eod.copy()
    ends[:, -1] = True  # the last segment ends at S
    rows, cols = np.nonzero(ends)
    rank = np.arange(rows.size) - np.searchsorted(rows, rows)  # position of each end within its row
    cu[rows, rank + 1] = cols + 1
    counts = np.bincount(rows, minlength=batch)
    lengths = np.diff(cu, axis=1)
    valid = np.arange(seq)[None, :] < counts[:, None]
    max_seqlen = np.where(valid, lengths, 0).max(axis=1).astype(np.int32)
    return cu, max_seqlen


def document_bounds(
    lengths: np.ndarray, first: np.ndarray, sequence_length: int, extra: int
) -> np.ndarray:
    """Each sample's document boundaries as megatron-core 0.19.2's ``GPTDataset`` makes
    ``cu_seqlens`` with ``inter_document_masking``: int32 ``(B, S + 1)``, from the samples' pieces
    (``lengths``: every piece's tokens, flat, as read; ``first``: the flat index of each sample's
    first piece, every sample with at least one).

    Megatron's steps: the parts' lengths; with the extra token the last part loses it and is
    dropped if that leaves it empty; a short (padded) sample's shortfall joins its last part (or
    is the one part); boundaries are the cumulative sums from 0, padded to S + 1 entries with S.
    So the last part always ends at S, and the boundaries written are the ends of the parts
    before it: empty documents give repeated boundaries, as in Megatron. A sample of more than
    S - 1 inner boundaries (more than S parts, only with empty documents) makes megatron-core fail
    (its boundaries do not fit S + 1 entries); there the empty parts' repeats are left out.
    """
    batch, seq = first.size, int(sequence_length)
    out = np.full((batch, seq + 1), seq, dtype=np.int32)
    out[:, 0] = 0
    if not batch:
        return out
    total = lengths.size
    counts = np.diff(first, append=total)
    last = first + counts - 1
    # parts that end before the last one; not the one before a dropped extra token's part
    inner = counts - 1 - ((lengths[last] == 1) & bool(extra))
    row = np.repeat(np.arange(batch, dtype=np.int64), counts)
    at = np.arange(total, dtype=np.int64) - first[row]  # each piece's place in its sample
    keep = at < inner[row]
    over = inner > seq - 1
    if over.any():
        # megatron-core fails here; these rows are taken as if their empty parts (but the last)
        # were not there, which leaves at most S - 1 inner boundaries when they fit a window
        kept = ~over[row] | (lengths > 0) | (at == counts[row] - 1)
        if not kept.all():
            fewer = np.bincount(row[kept], minlength=batch)
            starts = np.zeros(batch, dtype=np.int64)
            np.cumsum(fewer[:-1], out=starts[1:])
            return document_bounds(lengths[kept], starts, sequence_length, extra)
    ends = np.cumsum(lengths)
    before = (ends - lengths)[first]  # tokens of the pieces ahead of each sample
    out[row[keep], at[keep] + 1] = ends[keep] - before[row[keep]]
    return out
