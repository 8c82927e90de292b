"""The doctor's packing check: what concatenation and best-fit packing do to the train split's
documents at the job's sequence length (documents cut, padding, documents per row), from their
lengths alone (no token is read), and whether packing would help.
"""

from __future__ import annotations

from typing import Any

from .report import DoctorConfig, Finding, Report

__all__ = ["PACKING_HELPS_SHARE", "PACKING_SAMPLE", "check_packing", "packing_figures"]

#: Share of the documents that fit one row which concatenation cuts, from which packing helps.
PACKING_HELPS_SHARE = 0.10
#: Documents per prefix the packing check measures (their lengths only: no token is read).
PACKING_SAMPLE = 1 << 20


def packing_figures(
    lengths: Any, sequence_length: int, extra: int = 1, weights: Any = None
) -> dict[str, float]:
    """What concatenation and best-fit packing do to documents of these lengths (in file order):
    the documents each cuts, of all and of those that fit one row (at most S + extra tokens),
    best-fit's padding share and its documents per row (p50, p99). ``lengths``: one source's
    document lengths, or a list of them, one per source: each source is its own stream and its
    own rows, as the orders make them (a row holds documents of one source). Concatenation's
    sample k holds the stream's tokens ``[k * S, k * S + S + extra)`` (Megatron's samples), so it
    cuts a document that no sample holds whole: one ending past the window of the last sample
    starting at or before it; packing cuts only the documents longer than a row. Padding and
    documents per row are counted as ``loader.metrics()["packing"]`` counts them: padded label
    slots over S per row, and the pieces that begin among a row's S inputs; with ``weights``
    (a blend's, one per source), of rows drawn from the sources in those shares, else of one
    epoch of each."""
    import numpy as np

    from ..datasets.computed.packed import DEFAULT_BLOCK_DOCUMENTS as block
    from ..index.packing import pack_block

    one = isinstance(lengths, np.ndarray) or not len(lengths) or np.isscalar(lengths[0])
    sources = [lengths] if one else lengths
    window = sequence_length + extra
    rows: list[np.ndarray] = []
    row_weights: list[np.ndarray] = []  # each row's share of the rows served
    documents = short_count = concat_cut = concat_cut_short = packed_cut = 0
    for i, source in enumerate(sources):
        n = np.asarray(source, dtype=np.int64)
        n = n[n > 0]
        ends = np.cumsum(n)
        starts = ends - n
        cut = ends > starts // sequence_length * sequence_length + window
        short = n <= window
        documents += int(n.size)
        short_count += int(short.sum())
        concat_cut += int(cut.sum())
        concat_cut_short += int((cut & short).sum())
        packed_cut += int((~short).sum())
        held, pad = [], []
        for lo in range(0, n.size, block):  # blocks of the computed order's packing
            plan = pack_block(n[lo : lo + block], window, extra)
            if not plan.num_rows:
                continue
            tokens = plan.row_tokens()
            last = plan.piece_length[plan.row_offsets[1:] - 1]
            label_only = (tokens - last) >= sequence_length  # a last piece at the label slot
            held.append(np.diff(plan.row_offsets) - label_only)
            pad.append(np.minimum(window - tokens, sequence_length))
        if held:
            rows.append(np.stack([np.concatenate(held), np.concatenate(pad)]))
            count = rows[-1].shape[1]
            share = 1.0 if weights is None else float(weights[i]) / count
            row_weights.append(np.full(count, share))
    if rows:
        per_row, padded = np.concatenate(rows, axis=1)
        weight = np.concatenate(row_weights)
    else:
        per_row, padded, weight = np.zeros(1), np.zeros(1), np.ones(1)
    order = np.argsort(per_row, kind="stable")
    cumulative = np.cumsum(weight[order]) / weight.sum()

    def percentile(q: float) -> float:
        return float(per_row[order][min(int(np.searchsorted(cumulative, q)), per_row.size - 1)])

    return {
        "documents": documents,
        "short": short_count,
        "concat_cut": concat_cut,
        "concat_cut_short": concat_cut_short,
        "packed_cut": packed_cut,
        "padding_share": float((weight * padded).sum() / (weight.sum() * sequence_length))
        if rows
        else 0.0,
        "per_row_p50": percentile(0.5),
        "per_row_p99": percentile(0.99),
    }


def train_documents(config: DoctorConfig, prefix: str) -> Any:
    """The lengths of the documents (sequences) of ``prefix`` in the job's train split, in file
    order: ``[begin, end)`` by Megatron's split rule (``index.split_range`` of the split matrix's
    train bookend), the documents ``build_datasets`` gives the train split in either order."""
    import numpy as np

    from ..format import TokenFile
    from ..index import split_matrix, split_range

    lengths = TokenFile(prefix).sequence_lengths
    bookend = split_matrix(config.split)[0]
    begin, end = (0, 0) if bookend is None else split_range(bookend, len(lengths))
    return np.asarray(lengths[begin:end], dtype=np.int64)


def check_packing(config: DoctorConfig, prefixes: list[str], report: Report) -> None:
    """Would packing help: the documents concatenation cuts at this S against best-fit's, its
    padding and documents per row, on the train split's documents (``train_documents``: the
    ones the job trains on, whatever the other splits hold), up to ``PACKING_SAMPLE`` per
    prefix. They are taken in file order: the computed order's stream; the Megatron order
    concatenates the same documents in its shuffled document order, which moves the cuts
    without changing how many there are by much."""
    parts = [train_documents(config, prefix) for prefix in prefixes]
    sampled = any(part.size > PACKING_SAMPLE for part in parts)
    parts = [part[:PACKING_SAMPLE] for part in parts]
    from ..index import parse_blend

    blend = parse_blend(config.data_path)
    weights = None
    if blend is not None and blend.weights is not None:  # a prefix listed twice weighs the sum
        given = list(zip(blend.prefixes, blend.weights, strict=True))
        weights = [sum(w for p, w in given if p == prefix) for prefix in prefixes]
    f = packing_figures(parts, config.seq_length, weights=weights)  # a row holds one source
    share = f["concat_cut_short"] / f["short"] if f["short"] else 0.0
    median = f"{f['per_row_p50']:.0f}"
    first = f" (the first {PACKING_SAMPLE:,} of each prefix)" if sampled else ""
    measured = (
        f"at sequence length {config.seq_length}, concatenation cuts {f['concat_cut']:,} of"
        f" the train split's {f['documents']:,} documents{first}, {f['concat_cut_short']:,} of"
        f" the {f['short']:,} that fit one row ({share:.1%});"
        f" best-fit packing cuts {f['packed_cut']:,} (only longer ones), pads"
        f" {f['padding_share']:.2%} of the slots,"
        f" {median} document{'' if median == '1' else 's'} per row at the median"
        f" (p99 {f['per_row_p99']:.0f})"
    )
    helps = config.packing == "concat" and share >= PACKING_HELPS_SHARE
    report.findings.append(
        Finding(
            "packing",
            helps,
            measured,
            "pack whole documents: MegatronDataConfig(packing='best-fit') (docs/ORDER.md,"
            " 'Packing'); the order, resumes and mixtures work as before"
            if helps
            else None,
            f"concatenation cuts {share:.0%} of documents that fit a row",
        )
    )
