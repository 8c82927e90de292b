"""``tokenload state STATE_FILE`` (issue 26, point 6): prints the job's per-source figures, the
skips and the schedule's position from a saved state (JSON or a torch checkpoint holding it)."""

from __future__ import annotations

import json

import torch
from test_mixture_resume import files  # noqa: F401  (files is a fixture)
from test_mixture_schedule import blend, serve

from tokenload.cli.main import main


def test_the_state_command_prints_the_jobs_accounting(files, tmp_path, capsys):
    _, state = serve(blend(files), 192, dp=2, mbs=4, skip=32)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    assert main(["state", str(path)]) == 0
    out = capsys.readouterr().out
    assert "224 global samples consumed" in out and "skipped: 32 samples ([" in out
    assert "entry 4 of 4 (from sample 200, weights 1 0 0 1); no later change" in out
    for s in state["accounting"]["sources"]:
        name = s["name"] if len(s["name"]) <= 40 else "..." + s["name"][-37:]
        (row,) = [line for line in out.splitlines() if line.split()[0] == name]
        figures = [str(s[k]) for k in ("drawn", "skipped", "samples", "tokens", "epoch")]
        assert row.split()[1:] == figures
    checkpoint = tmp_path / "ckpt.pt"
    torch.save({"model": {}, "data": {"loader": state}}, checkpoint)
    assert main(["state", "--json", str(checkpoint)]) == 0
    assert json.loads(capsys.readouterr().out) == state["accounting"]


def test_a_file_without_a_state_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"model": {"lr": 1}}))
    assert main(["state", str(path)]) == 2
    err = capsys.readouterr().err
    assert "holds no loader state" in err and "Traceback" not in err
    (tmp_path / "junk").write_bytes(b"\x00\x01junk")
    assert main(["state", str(tmp_path / "junk")]) == 2
    assert "neither JSON nor a torch checkpoint" in capsys.readouterr().err
    assert main(["state", str(tmp_path / "missing.json")]) == 2


def test_a_checkpoint_with_several_loader_states_asks_which_one(files, tmp_path, capsys):
    _, train = serve(blend(files), 192, dp=2, mbs=4, skip=32)
    _, valid = serve(blend(files), 64, dp=2, mbs=4)
    path = tmp_path / "ckpt.json"
    path.write_text(json.dumps({"valid_loader": valid, "train_loader": train}))
    assert main(["state", str(path)]) == 2
    err = capsys.readouterr().err
    assert "holds 2 loader states" in err and "--key: 'valid_loader', 'train_loader'" in err
    assert main(["state", "--json", "--key", "train_loader", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == train["accounting"]
    assert main(["state", "--key", "model", str(path)]) == 2
    assert "no loader state at key 'model'" in capsys.readouterr().err
