"""`tokenload demo`, the README's main job, runs end to end as a real command: torchrun ranks,
a checkpoint, a resume on another rank count, the doctor's picture, one table and its legend, on
one screen, leaving nothing in the temporary folder."""

from __future__ import annotations

import re

from support import run_cli

ROW = re.compile(
    r"^(megatron|computed|mock)\s+(\d+)\s+([\d.]+) s\s+(\d+)\s+([\d.]+)%\s+([\d.]+)%\s+(yes|no)$",
    re.M,
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_demo_runs_four_ranks_and_resumes_exactly_on_two(tmp_path):
    work, tmp, picture = tmp_path / "demo", tmp_path / "tmp", tmp_path / "doctor.png"
    tmp.mkdir()
    out = run_cli("demo", "--output", work, "--max-mb", "2", "--seq-length", "256",
                  "--plot", picture, env={"TMPDIR": str(tmp)}, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    # one line per phase, then the table and its legend: one screen
    phases = [line for line in lines if re.match(r"\[\d/6\] ", line)]
    assert [p[:5] for p in phases] == [f"[{i}/6]" for i in range(1, 7)], out.stdout
    assert "[4/6] 4 ranks" in out.stdout and "[5/6] 2 ranks" in out.stdout
    assert len(lines) <= 25, out.stdout  # 6 phases, 14 of table, 4 of legend, 1 of time
    table = lines[lines.index(phases[-1]) + 1:]
    assert max(map(len, table)) <= 100, out.stdout
    assert "step 12/12" not in out.stdout  # no progress line per step
    rows = ROW.findall(out.stdout)
    assert [(order, int(rank)) for order, rank, *_ in rows] == [
        (order, rank) for order in ("megatron", "computed", "mock") for rank in range(4)
    ]
    assert all(exact == "yes" for *_, exact in rows)
    # the legend's ceiling: 16 samples per step over 4 ranks, one step per 20 ms
    assert "caps it at 200 samples/s" in out.stdout
    for _, _, first, rate, wait, steady, _ in rows:
        assert float(first) > 0 and 0 < int(rate) <= 200
        assert 0 <= float(wait) <= 100 and 0 <= float(steady) <= 100
    assert "resume exact: the samples served after step 6" in out.stdout
    assert "of the 2-rank resume" in out.stdout
    # the doctor's picture, at the path printed
    assert f"picture: {picture}" in out.stdout
    assert picture.read_bytes()[:8] == PNG_MAGIC
    assert not work.exists()  # no --keep: the work folder is gone
    assert list(tmp.iterdir()) == []  # torchrun's torchelastic_* folders went with it


def test_demo_keeps_its_folder_and_reports_a_failed_rank_in_one_line(tmp_path):
    work = tmp_path / "demo"
    out = run_cli("demo", "--output", work, "--max-mb", "1", "--seq-length", "256",
                  env={"TOKENLOAD_DEMO_FAIL_RANK": "2"})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("tokenload demo: error: rank2: run on 4 ranks: rehearsed failure of rank 2")
    assert (work / "work" / "torchrun-run.log").exists()  # kept for its log
    assert "[4/6]" in out.stdout and "[5/6]" not in out.stdout


def test_demo_refuses_a_rank_count_that_does_not_divide_the_batch(tmp_path):
    out = run_cli("demo", "--output", tmp_path, "--ranks", "3")
    assert out.returncode == 2
    assert "3 ranks do not divide the demo's global batch of 16 samples" in out.stderr
