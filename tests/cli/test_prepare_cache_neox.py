"""`tokenload prepare-cache --neox-config FILE.yml`, run as a real command: a GPT-NeoX job's data
keys checked and its datasets built once, in NeoX's order, nothing written."""

from __future__ import annotations

import json

import numpy as np

from support import FIXTURES, run_cli, write_documents

NEOX = json.loads((FIXTURES / "neox" / "cases.json").read_text())
CASE = next(c for c in NEOX["cases"] if c["id"] == "n000")


def neox_file(folder, name):
    lengths = NEOX["data_files"][name]["sequence_lengths"]
    docs = [(i * 131 + np.arange(k) * 7) % 50000 for i, k in enumerate(lengths)]
    return write_documents(folder / name, docs)


def test_a_neox_yaml_is_checked_and_built_once_with_nothing_written(tmp_path):
    prefix = neox_file(tmp_path, "a")
    yml = tmp_path / "job.yml"
    yml.write_text(
        f'{{"data_path": "{prefix}", "split": "969, 30, 1", "seq_length": 16, "train_iters": 20,\n'
        ' "train_batch_size": 2, "eval_iters": 1, "eval_interval": 6}\n'
    )
    before = set(p.name for p in tmp_path.iterdir())
    out = run_cli("prepare-cache", "--neox-config", yml, "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["order"] == "neox" and result["files_written"] == []
    assert result["train_valid_test_num_samples"] == CASE["num_samples"]
    assert result["train_dataset_length"] == CASE["splits"]["train"]["len"]
    assert set(p.name for p in tmp_path.iterdir()) == before
    text = run_cli("prepare-cache", "--neox-config", yml)
    assert text.returncode == 0 and "nothing to prepare" in text.stdout
    assert "--order megatron prepares the caches of this data in the Megatron order" in text.stdout


def test_a_neox_yaml_with_an_unsupported_key_or_megatron_data_flags_is_one_line(tmp_path):
    prefix = neox_file(tmp_path, "a")
    yml = tmp_path / "job.yml"
    yml.write_text(f'{{"data_path": "{prefix}", "seq_length": 16, "train_iters": 2, "train_batch_size": 2,'
                   ' "no_such_key": 1}\n')
    out = run_cli("prepare-cache", "--neox-config", yml)
    assert out.returncode == 2 and "no_such_key" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = run_cli("prepare-cache", "--neox-config", yml, "--data-path", prefix)
    assert out.returncode == 2 and "--data-path is refused with --neox-config" in out.stderr
    assert "the NeoX config defines the data" in out.stderr  # every other flag: its own tests


def test_global_num_gpus_sizes_the_batch_as_neox_derives_it(tmp_path):
    """NeoX's calculate_derived takes the data-parallel size from the config's global_num_gpus
    (what its launcher writes into every rank's config): micro 4 x accumulation 2 x 8 GPUs is a
    batch of 64, whatever this process's world (a launcher's WORLD_SIZE included); an explicit
    --prepare-cache-world-size still wins."""
    prefix = neox_file(tmp_path, "a")
    yml = tmp_path / "job.yml"
    yml.write_text(
        f'{{"data_path": "{prefix}", "seq_length": 16, "train_iters": 100, "eval_iters": 10,'
        ' "eval_interval": 50, "train_micro_batch_size_per_gpu": 4,'
        ' "gradient_accumulation_steps": 2, "global_num_gpus": 8}\n'
    )
    out = run_cli("prepare-cache", "--neox-config", yml, "--json", env={"WORLD_SIZE": "2"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["train_valid_test_num_samples"] == [6400, 1920, 640]
    out = run_cli("prepare-cache", "--neox-config", yml, "--json",
                  "--prepare-cache-world-size", 2)  # fmt: skip
    assert json.loads(out.stdout)["train_valid_test_num_samples"] == [1600, 480, 160]
    # at its default value too (1 was read as "not given", and global_num_gpus won)
    out = run_cli("prepare-cache", "--neox-config", yml, "--json", "--prepare-cache-world-size", 1)
    assert json.loads(out.stdout)["train_valid_test_num_samples"] == [800, 240, 80]
    yml.write_text(yml.read_text().replace('"global_num_gpus": 8', '"global_num_gpus": 0'))
    out = run_cli("prepare-cache", "--neox-config", yml)
    assert out.returncode == 2 and "global_num_gpus is 0" in out.stderr
    yml.write_text(yml.read_text().replace(', "global_num_gpus": 0', ""))  # one process's world
    out = run_cli("prepare-cache", "--neox-config", yml, "--json", env={"WORLD_SIZE": "2"})
    assert json.loads(out.stdout)["train_valid_test_num_samples"] == [800, 240, 80]


def test_a_model_parallel_job_without_its_world_says_which_flag_gives_it(tmp_path):
    """pipe 4 x model 2 and only a micro batch: one process cannot tell the data-parallel size
    (it was taken as 1, silently); global_num_gpus (96: 12 replicas) or the flag gives it."""
    prefix = neox_file(tmp_path, "a")
    yml = tmp_path / "job.yml"
    body = (f'"data_path": "{prefix}", "seq_length": 16, "train_iters": 10, "eval_iters": 1,'
            ' "eval_interval": 5, "train_micro_batch_size_per_gpu": 4, "pipe_parallel_size": 4,'
            ' "model_parallel_size": 2')  # fmt: skip
    yml.write_text("{" + body + "}\n")
    out = run_cli("prepare-cache", "--neox-config", yml)
    assert out.returncode == 2 and "pipe x model parallel size 8" in out.stderr
    assert "--prepare-cache-world-size" in out.stderr and "global_num_gpus" in out.stderr
    yml.write_text("{" + body + ', "global_num_gpus": 96}\n')
    out = run_cli("prepare-cache", "--neox-config", yml, "--json")
    assert json.loads(out.stdout)["train_valid_test_num_samples"] == [480, 144, 48]  # batch 48
    # the flag is the job's processes, as its help says, which NeoX divides by pipe x model (it
    # was taken as the data-parallel size: 96 x 4 = 384 a batch, [3840, 1152, 384])
    yml.write_text("{" + body + "}\n")
    out = run_cli("prepare-cache", "--neox-config", yml, "--json", "--prepare-cache-world-size", 96)
    assert json.loads(out.stdout)["train_valid_test_num_samples"] == [480, 144, 48]


def test_the_jobs_gpus_from_its_hostfile_as_neoxs_launcher_counts_them(tmp_path):
    """No global_num_gpus: NeoX's launcher counts the hostfile's hosts and slots with num_nodes and
    num_gpus (8 GPUs on 4 of the 5 hosts: 32, a batch of 32 micro batches of 1), from the config's
    hostfile or DeepSpeed's default ($DLTS_HOSTFILE); with no hostfile, this process's world (NeoX
    would count the GPUs of the machine it runs on); an explicit --prepare-cache-world-size wins."""
    prefix = neox_file(tmp_path, "a")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"worker-{i} slots=8\n" for i in range(5)))
    yml = tmp_path / "job.yml"
    body = (f'"data_path": "{prefix}", "seq_length": 16, "train_iters": 100, "eval_iters": 10,'
            ' "eval_interval": 50, "train_micro_batch_size_per_gpu": 1, "num_gpus": 8, "num_nodes": 4')
    yml.write_text("{" + body + f', "hostfile": "{hostfile}"}}\n')
    missing = {"DLTS_HOSTFILE": str(tmp_path / "no-hostfile")}
    out = run_cli("prepare-cache", "--neox-config", yml, "--json", env=missing)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["train_valid_test_num_samples"] == [3200, 960, 320]
    out = run_cli("prepare-cache", "--neox-config", yml, "--json", "--prepare-cache-world-size", 2, env=missing)
    assert json.loads(out.stdout)["train_valid_test_num_samples"] == [200, 60, 20]
    yml.write_text("{" + body + "}\n")  # no hostfile key: DeepSpeed's default, where it exists
    out = run_cli("prepare-cache", "--neox-config", yml, "--json", env={"DLTS_HOSTFILE": str(hostfile)})
    assert json.loads(out.stdout)["train_valid_test_num_samples"] == [3200, 960, 320]
    out = run_cli("prepare-cache", "--neox-config", yml, "--json", env=missing)
    assert json.loads(out.stdout)["train_valid_test_num_samples"] == [100, 30, 10]
    hostfile.write_text("worker-0 slots=8\nworker-1 slots=8\n")  # fewer hosts than num_nodes
    out = run_cli("prepare-cache", "--neox-config", yml, env={"DLTS_HOSTFILE": str(hostfile)})
    assert out.returncode == 2 and "num_nodes is 4 but the hostfile" in out.stderr
    assert "--prepare-cache-world-size" in out.stderr and "Traceback" not in out.stderr
