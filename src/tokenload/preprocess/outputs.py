"""The final outputs of preprocess: one token file per key, the finished parts concatenated in
input order, with the run's totals in its sidecar.

Apart from ``pipeline`` because it is the one step both executors share once every part is in
the work folder (local or under an object-storage work prefix, read one part at a time), and
the step a full disk at the end of a run fails in (the parts stay, and a rerun only does this).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..format import TokenFileWriter
from .config import PreprocessConfig
from .summaries import FileSummary, Totals
from .tokenizer import TextTokenizer
from .workdir import WorkFolder


def _write_outputs(
    config: PreprocessConfig,
    tok: TextTokenizer,
    work: WorkFolder,
    summaries: Sequence[FileSummary],
    totals: Totals,
) -> None:
    metadata = {
        "producer": "tokenload preprocess",
        "inputs": work.job["inputs"],
        "json_keys": list(config.json_keys),
        "append_eod": config.append_eod,
        "on_bad_record": config.on_bad_record,
        "shard": {"index": config.shard_index, "count": config.num_shards},
        "skipped": totals.skipped,
    }
    for key in config.json_keys:
        with TokenFileWriter(
            config.output_for(key),
            tok.dtype,
            tokenizer=work.job["tokenizer"],
            metadata={**metadata, "json_key": key},
        ) as writer:
            parts = [
                part
                for index, summary in enumerate(summaries)
                for part in work.parts(index, summary, key)
            ]
            for part in parts:
                with work.readable(part) as local:
                    if len(parts) > 1 or not writer.adopt(
                        local
                    ):  # one part: its .bin linked, not copied
                        writer.append(local)
            writer.finalize()
