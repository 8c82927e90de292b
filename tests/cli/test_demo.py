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


def test_demo_refuses_what_it_cannot_do_before_any_work(tmp_path):
    """Checked before the corpus is made (red-team findings: a huge --seq-length ran the machine
    out of memory; a --plot that cannot be written failed after all the work, under a temporary
    name, leaving a stray file)."""
    folder = tmp_path / "is-a-folder"
    folder.mkdir()
    for flags, words in (
        (["--seq-length", "99999999"], "is more than the 1,048,576 tokens of its corpus"),
        (["--plot", str(folder)], "is a folder; expected a file name"),
        (["--plot", str(tmp_path / "missing" / "x.png")], "does not exist"),
    ):
        out = run_cli("demo", "--output", tmp_path / "w", "--max-mb", "1", *flags)
        assert out.returncode == 2 and words in out.stderr, out.stderr
        assert "[1/6]" not in out.stdout and not (tmp_path / "w").exists()
    assert list(folder.iterdir()) == []


def test_demo_stopped_by_sigterm_stops_torchrun_and_says_where_its_folder_is(tmp_path):
    """SIGTERM to the demo (alone) left its torchrun running; now the run stops, its children
    with it, and the kept work folder is named."""
    import signal
    import subprocess
    import sys
    import time

    work = tmp_path / "w"
    demo = subprocess.Popen(
        [sys.executable, "-m", "tokenload.cli.main", "demo", "--output", str(work), "--ranks", "2",
         "--max-mb", "1", "--seq-length", "256"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    seen = ""
    deadline = time.monotonic() + 180
    while "[4/6]" not in seen and time.monotonic() < deadline:
        char = demo.stdout.read(1) if demo.stdout else ""
        if not char:
            break
        seen += char
    assert "[4/6]" in seen, seen
    time.sleep(1.0)  # torchrun started
    group = subprocess.run(["pgrep", "-g", str(demo.pid)], capture_output=True, text=True)
    assert len(group.stdout.split()) >= 2  # the demo and its torchrun
    demo.send_signal(signal.SIGTERM)
    _, err = demo.communicate(timeout=60)
    assert demo.returncode == 128 + signal.SIGTERM
    assert f"the work folder is kept: {work}" in err and "Traceback" not in err, err
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        left = subprocess.run(["pgrep", "-g", str(demo.pid)], capture_output=True, text=True)
        if not left.stdout.split():
            break
        time.sleep(0.2)
    assert not left.stdout.split(), left.stdout


def test_demo_output_that_is_a_file_is_named_before_any_work(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    out = run_cli("demo", "--output", blocker)
    assert out.returncode == 2 and "is a file; expected a folder" in out.stderr, out.stderr
    assert "[1/6]" not in out.stdout and blocker.read_text() == "x"
