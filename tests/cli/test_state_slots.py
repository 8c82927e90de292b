"""``tokenload state`` on a packed run: its per-source figure is token slots (samples x sequence
length, the padding of packed rows included), said as such, beside ``metrics()["packing"]``,
which counts the padding apart."""

from __future__ import annotations

import json

import numpy as np

from support import write_documents
from tokenload.cli.main import main
from tokenload.datasets import MegatronDataConfig, build_datasets
from tokenload.loader import build_dataloader

S = 32


def test_the_state_command_says_it_counts_slots_padding_included(tmp_path, capsys):
    rng = np.random.default_rng(5)
    prefix = write_documents(tmp_path / "d", [rng.integers(1, 200, int(n)) for n in rng.integers(3, 30, 300)])
    config = MegatronDataConfig(sequence_length=S, blend=[prefix], split="100,0,0", order="computed",
                                packing="best-fit")  # fmt: skip
    loader = build_dataloader(build_datasets(config, [None, None, None])[0], micro_batch_size=4, num_workers=0)
    batches = iter(loader)
    for _ in range(5):
        next(batches)
    packing = loader.metrics()["packing"]
    assert packing is not None and packing["padding_share"] > 0  # some slots are padding
    path = tmp_path / "state.json"
    path.write_text(json.dumps(loader.state_dict()))
    loader.close()
    assert main(["state", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("source"))
    assert header.split() == ["source", "drawn", "skipped", "samples", "slots", "epoch"]
    name = prefix if len(prefix) <= 40 else "..." + prefix[-37:]
    (row,) = [line.split() for line in out if line.split()[:1] == [name]]
    assert int(row[3]) == 20 and int(row[4]) == 20 * S  # samples x S, padding included
    assert any("padding included" in line and "metrics()['packing']" in line for line in out)
    # what the saved run read, which explain and where need the same of: order, packing, S, items
    (read,) = [line for line in out if line.startswith("read: ")]
    assert "order='computed'" in read and "packing='best-fit'" in read
    assert f"sequence_length={S}" in read and "eod_id=" in read
