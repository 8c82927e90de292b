"""`tokenload demo`, the README's main job, runs end to end as a real command: torchrun ranks,
a checkpoint, a resume on another rank count, one table."""

from __future__ import annotations

import re

from support import run_cli

ROW = re.compile(r"^(megatron|computed|mock)\s+(\d+)\s+([\d.]+) s\s+(\d+)\s+([\d.]+)%\s+(yes|no)$", re.M)


def test_demo_runs_four_ranks_and_resumes_exactly_on_two(tmp_path):
    work = tmp_path / "demo"
    out = run_cli("demo", "--output", work, "--max-mb", "2", "--seq-length", "256")
    assert out.returncode == 0, out.stdout + out.stderr
    for stage in ("[1/6]", "[2/6]", "[3/6]", "[4/6] 4 ranks", "[5/6] 2 ranks", "[6/6]"):
        assert stage in out.stdout
    assert "rank 0/4 megatron step 12/12" in out.stdout and "rank 0/2 mock     step  7/12" in out.stdout
    rows = ROW.findall(out.stdout)
    assert [(order, int(rank)) for order, rank, *_ in rows] == [
        (order, rank) for order in ("megatron", "computed", "mock") for rank in range(4)
    ]
    assert all(exact == "yes" for *_, exact in rows)
    assert all(float(first) > 0 and int(rate) > 0 for _, _, first, rate, _, _ in rows)
    assert not work.exists()  # no --keep: the work folder is gone


def test_demo_keeps_its_folder_and_reports_a_failed_rank_in_one_line(tmp_path):
    work = tmp_path / "demo"
    out = run_cli("demo", "--output", work, "--max-mb", "1", "--seq-length", "256",
                  env={"TOKENLOAD_DEMO_FAIL_RANK": "2"})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("tokenload demo: error: rank2: run on 4 ranks: rehearsed failure of rank 2")
    assert (work / "work" / "torchrun-run.log").exists()  # kept for its log


def test_demo_refuses_a_rank_count_that_does_not_divide_the_batch(tmp_path):
    out = run_cli("demo", "--output", tmp_path, "--ranks", "3")
    assert out.returncode == 2
    assert "3 ranks do not divide the demo's global batch of 16 samples" in out.stderr
