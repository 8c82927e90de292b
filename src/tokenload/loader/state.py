"""Resumable loader state: a few integers plus a fingerprint of data and configuration.

Because global sample k is a pure function of (data, config, k), resuming needs only the number
of samples the whole job has consumed. The fingerprint makes a state saved for other data or
another order fail loudly instead of silently reshuffling. A computed blend's state also holds
its mixture (every source's cursor), which the loader hands to the blend on resume, so its
weights and sources may change between runs (``TokenloadDataLoader.load_state_dict``).

Beside these fields the loader's state dict carries ``"skips"`` (each ``loader.skip``: where, how
many samples, and how many of each source) and ``"accounting"`` (the job's per-source drawn,
skipped and delivered samples, tokens and epochs: ``ledger.py``; informational, recomputed on
load, printed by ``tokenload state``), and ``"topologies"`` (``topology_history``: the global
sample from which each micro-batch size and data-parallel size served, for
``tokenload.provenance``), and ``"reads"`` (``reads``: order, packing, sequence length and item
options, so that a refusal names the ones that differ).
"""

from __future__ import annotations

import itertools
import numbers
from dataclasses import asdict, dataclass
from typing import Any

from ..contract import MixtureCursors
from ..errors import ForeignStateError, StateError

STATE_VERSION = 1

TOPOLOGIES_KEPT = 64
"""Topologies a state's history keeps (one is added per resume on another topology): past it the
oldest are dropped, and the history then starts later (what served before its first entry is
not recorded)."""

Topology = tuple[int, int, int]
"""(first global sample it served, micro_batch_size, dp_size)."""


@dataclass(frozen=True, kw_only=True)
class LoaderState:
    """What a checkpoint stores for the data pipeline."""

    consumed_samples: int
    """Samples of the global order consumed by all data-parallel ranks together."""
    fingerprint: str
    """Identity of the dataset, its order and the sampler kind."""
    micro_batch_size: int
    """Micro-batch size when saved (the cyclic sampler resumes only with the same one)."""
    dp_size: int
    """Data-parallel size when saved (the cyclic sampler resumes only on the same one; the
    single sampler resumes on any)."""
    version: int = STATE_VERSION
    """Schema version of this state."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoaderState:
        if not isinstance(data, dict):
            raise StateError(
                f"loader state is a {type(data).__name__}, expected a dict",
                hint="pass loader.state_dict()",
            )
        version = data.get("version")
        if version != STATE_VERSION:
            raise StateError(
                f"loader state version is {version!r}, expected {STATE_VERSION}",
                hint="the checkpoint was written by an incompatible tokenload; resume with the"
                " version that wrote it",
            )
        try:
            fields = {
                k: data[k]
                for k in ("consumed_samples", "fingerprint", "micro_batch_size", "dp_size")
            }
        except KeyError as exc:
            raise StateError(
                f"loader state lacks {exc}", hint="pass the dict saved from loader.state_dict()"
            ) from None
        if not isinstance(fields["fingerprint"], str):
            raise StateError(
                f"loader state fingerprint is {fields['fingerprint']!r}, expected a string",
                hint="pass the dict saved from loader.state_dict(), unchanged",
            )
        for name, least in (("consumed_samples", 0), ("micro_batch_size", 1), ("dp_size", 1)):
            fields[name] = _count(name, fields[name], least)
        return cls(**fields)

    def check_topology(self, *, micro_batch_size: int, dp_size: int) -> None:
        """Raise StateError unless saved with this micro-batch and data-parallel size: the cyclic
        sampler's permutation and epoch length depend on both, so resuming it on another topology
        would repeat some samples and skip others."""
        if (self.micro_batch_size, self.dp_size) != (micro_batch_size, dp_size):
            raise StateError(
                f"loader state was saved by the cyclic sampler at dp_size={self.dp_size},"
                f" micro_batch_size={self.micro_batch_size}; this loader has dp_size={dp_size},"
                f" micro_batch_size={micro_batch_size}, and the cyclic order depends on both",
                hint=f"resume on {self.dp_size} data-parallel ranks with"
                f" micro_batch_size={self.micro_batch_size}, or train with kind='single'"
                " (Megatron's default sampler), which resumes on any topology",
            )

    def check(self, fingerprint: str) -> None:
        """Raise StateError unless this state belongs to data and config with ``fingerprint``."""
        if self.fingerprint != fingerprint:
            raise ForeignStateError(
                f"loader state was saved for data/config fingerprint {self.fingerprint}, this"
                f" loader's is {fingerprint}",
                hint="resume with the same token files, sequence length, seed, split and blend as"
                " the saved run, or start the data order from scratch deliberately"
                " (consumed_samples=0)",
            )


def _count(name: str, value: Any, least: int) -> int:
    """``value`` as an int >= ``least``; a string, float or bool is refused, not converted (a
    checkpoint that stores one was written or edited by something else)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise StateError(
            f"loader state {name} is {value!r} ({type(value).__name__}), expected an int",
            hint="pass the dict saved from loader.state_dict(), unchanged",
        )
    if value < least:
        raise StateError(
            f"loader state {name} is {value}, expected {least} or more",
            hint="pass the dict saved from loader.state_dict(), unchanged",
        )
    return int(value)


def weights_changes(state: dict[str, Any]) -> list[tuple[int, tuple[float, ...]]]:
    """A state's ``weights_changes`` (``loader.set_weights``) as (start, weights) pairs."""
    saved = state.get("weights_changes")
    try:
        return [(int(start), tuple(float(w) for w in weights)) for start, weights in saved or []]
    except (TypeError, ValueError):
        raise StateError(
            f"the loader state's weights_changes is {saved!r}; expected [[start, [w, ...]], ...]",
            hint="pass the dict saved from loader.state_dict(), unchanged",
        ) from None


def restore_mixture(
    mixture: MixtureCursors,
    state: dict[str, Any],
    changes: list[tuple[int, tuple[float, ...]]],
    undo_from: int | None = None,
) -> str:
    """Put a blend where the run that saved ``state`` left it: the changes made since its
    build from ``undo_from`` on undone, the saved run's ``set_weights`` ``changes`` applied
    (the blend's schedule is then the saved chain's), and its mixture resumed
    (``resume_mixture``: ``"same"``, ``"weights"`` or ``"sources"``)."""
    if undo_from is not None:
        mixture.change_weights(undo_from, None)
    for start, weights in changes:
        mixture.change_weights(start, weights)
    return mixture.resume_mixture(state["mixture"])


def topology_history(state: dict[str, Any]) -> list[Topology]:
    """The topologies the run that saved ``state`` served with (``state["topologies"]``): each
    one's first global sample, micro-batch size and data-parallel size, in order, the last the
    state's own. A history whose first entry starts after sample 0 does not record the topology of
    the samples before it. A state without one (saved by a tokenload before it kept one) records
    only its topology at the save, not whether the run resumed on another one before (a resume
    that kept micro_batch_size x dp_size leaves no trace in it): its history starts at its
    ``consumed_samples``. ``StateError`` for a malformed history."""
    saved = LoaderState.from_dict(state)
    own = (saved.micro_batch_size, saved.dp_size)
    raw = state.get("topologies")
    if raw is None:
        return [(saved.consumed_samples, *own)]
    hint = "pass the dict saved from loader.state_dict(), unchanged"
    try:
        history = [(int(t[0]), int(t[1]), int(t[2])) for t in raw if len(t) == 3]
        whole = len(history) == len(raw) and all(
            isinstance(x, numbers.Integral) and not isinstance(x, bool) for t in raw for x in t
        )
    except (TypeError, ValueError, KeyError, IndexError):
        whole = False
    if not whole or not history:
        raise StateError(
            f"the loader state's topologies is {raw!r}; expected [[first sample,"
            " micro_batch_size, dp_size], ...]",
            hint=hint,
        )
    starts = [t[0] for t in history]
    if starts[0] < 0 or any(b <= a for a, b in itertools.pairwise(starts)):
        raise StateError(
            f"the loader state's topologies start at samples {starts}; expected increasing"
            " samples >= 0",
            hint=hint,
        )
    if any(m < 1 or d < 1 for _, m, d in history) or history[-1][1:] != own:
        raise StateError(
            f"the loader state's topologies are {history} (first sample, micro_batch_size,"
            f" dp_size); expected sizes >= 1, the last micro_batch_size={own[0]},"
            f" dp_size={own[1]} as the state's",
            hint=hint,
        )
    return history


def continue_topologies(
    history: list[Topology], consumed: int, micro_batch_size: int, dp_size: int
) -> list[Topology]:
    """``history`` continued by a loader that resumes at global sample ``consumed`` with
    ``micro_batch_size`` and ``dp_size``: unchanged on the same topology, else the entries from
    ``consumed`` on replaced by the new topology (at most ``TOPOLOGIES_KEPT``, the newest)."""
    if history and history[-1][1:] == (micro_batch_size, dp_size):
        return history
    kept = [t for t in history if t[0] < consumed]
    return [*kept, (consumed, micro_batch_size, dp_size)][-TOPOLOGIES_KEPT:]


_ITEM_OPTIONS = (
    "add_extra_token",
    "eod_id",
    "pad_id",
    "eod_mask_loss",
    "reset_position_ids",
    "reset_attention_mask",
    "create_attention_mask",
    "inter_document_masking",
)


def reads(data: Any) -> dict[str, Any] | None:
    """What a tokenload dataset reads, in the terms its fingerprint covers beside the data
    itself: order, packing, sequence length and item options (kept in a state as ``"reads"``, so
    that a refusal can say which of them differ); None for another dataset."""
    module = type(data).__module__
    orders = [
        o for o in ("computed", "neox", "megatron") if module.startswith(f"tokenload.datasets.{o}")
    ]
    if not orders or not hasattr(data, "describe_sources"):  # a flat file, or a user's own
        return None
    sources = data.describe_sources()
    lengths = sorted({m.sequence_length for m in sources.members if m.sequence_length})
    members = getattr(data, "datasets", None) or [data]
    item = getattr(data, "item", None) or getattr(members[0], "item", None)
    out: dict[str, Any] = {
        "order": orders[0],
        "packing": "best-fit" if sources.packed else "concat",
        "sequence_length": lengths[0] if len(lengths) == 1 else None,
    }
    if item is not None:  # plain Python values (a state goes through JSON and torch.load)
        out.update({k: _plain(getattr(item, k)) for k in _ITEM_OPTIONS})
    return out


def _plain(value: Any) -> Any:
    """A NumPy scalar as the Python value (``ItemConfig`` keeps plain ones; this guards the
    state, which JSON and ``torch.load`` take, against any other)."""
    return value.item() if type(value).__module__ == "numpy" else value


def differences(saved: Any, here: dict[str, Any] | None) -> str:
    """How a refused state's ``"reads"`` differ from this dataset's, in words ("" when either is
    unknown)."""
    if not isinstance(saved, dict) or here is None:
        return ""
    changed = [
        f"{k}={saved.get(k)!r} (this loader: {here.get(k)!r})"
        for k in here
        if saved.get(k) != here.get(k)
    ]
    if changed:
        return f"; the saved run read {', '.join(changed)}"
    return (
        "; the saved run read the same order, packing, sequence length and item options:"
        " something else its fingerprint covers differs (the token files, seed, split, blend,"
        " the samples asked for, block_size, max_documents_per_row or the tokenizer identity)"
    )


def refusal_hint(data: Any) -> str:
    """What to do when a state is refused for another fingerprint: this dataset's order and
    items in words (what a state of another run differs in: order, packing, sequence length, the
    item options the fingerprint covers), and the fix."""
    facts = reads(data)
    if facts is None:
        return (
            "resume with the same data and options as the saved run, or start the data order"
            " from scratch deliberately (consumed_samples=0)"
        )
    order = f" in order={facts['order']!r}"
    packing = (
        "packed rows of whole documents (`packing='best-fit'`)"
        if facts["packing"] == "best-fit"
        else "concatenated samples (`packing='concat'`)"
    )
    length = "" if facts["sequence_length"] is None else f" of {facts['sequence_length']} tokens"
    items = ""
    if "eod_id" in facts:
        eod = "no EOD id" if facts["eod_id"] is None else f"EOD id {facts['eod_id']}"
        on = [
            words
            for flag, words in (
                ("eod_mask_loss", "EOD loss masking"),
                ("reset_position_ids", "position ids reset at EODs"),
                ("reset_attention_mask", "attention mask reset at EODs"),
                ("create_attention_mask", "an attention mask"),  # (not with the next: cu_seqlens)
                ("inter_document_masking", "inter-document masking"),
            )
            if facts[flag]
            and not (flag == "create_attention_mask" and facts["inter_document_masking"])
        ]
        items = f", items with {', '.join([eod, *on])}" + ("" if on else " and no item option")
    return (
        f"this dataset reads {packing}{length}{order}{items}; a state resumes only"
        " into the data and options of the run that saved it: build the dataset with that"
        " run's order, packing, `sequence_length=N`, `random_seed=N`, item options, token files,"
        " blend and split; to go on from the saved point with other item options on purpose"
        " (the same order, packing and sequence length: under others a sample count points"
        " elsewhere in the data), build the loader with consumed_samples=state['consumed_samples']"
        " instead of loading"
        " the state (its skips, weight changes and metrics are then not carried over); or start"
        " the data order from scratch deliberately (consumed_samples=0)"
    )
