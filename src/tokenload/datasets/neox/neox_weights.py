"""GPT-NeoX's blend weighted by document counts, carried to another order.

With ``weight_by_num_documents``, NeoX ignores a split's data weights and weights each token file
by its document count (``neox_indices.neox_weights_by_num_docs``: ``(n/N) ** alpha`` times
``1 - n/N``, normalized). Only the NeoX order reads that option; an imported config served in
the Megatron or computed order (``imported.config(order="megatron")``) would otherwise blend by
the config's data weights, other data than the NeoX job's. ``document_weights`` writes NeoX's
weights into the blends instead, counting each file's sequences (its ``.idx`` header).
"""

from __future__ import annotations

from typing import Any

from ..config import as_blend
from .neox_indices import neox_weights_by_num_docs

__all__ = ["document_weights"]


def document_weights(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` of an imported NeoX config for another order: with ``weight_by_num_documents``,
    each split's blend weighted as NeoX weights it, and the NeoX-only options dropped."""
    if not fields.get("weight_by_num_documents"):
        return fields
    from ...format import TokenFile

    alpha = float(fields.get("weighted_sampler_alpha", 1.0))
    counts: dict[str, int] = {}

    def weighted(value: Any) -> list[str] | None:
        blend = as_blend(value)
        if blend is None:
            return None
        prefixes = list(blend.prefixes)
        for prefix in prefixes:
            if prefix not in counts:
                counts[prefix] = int(TokenFile(prefix).num_sequences)
        weights = neox_weights_by_num_docs([counts[p] for p in prefixes], alpha=alpha)
        return [x for w, p in zip(weights, prefixes, strict=True) for x in (repr(w), p)]

    out = {
        k: v
        for k, v in fields.items()
        if k not in ("weight_by_num_documents", "weighted_sampler_alpha")
    }
    if out.get("blend_per_split") is not None:
        out["blend_per_split"] = [weighted(b) for b in out["blend_per_split"]]
    elif out.get("blend") is not None:
        out["blend"] = weighted(out["blend"])
    return out
