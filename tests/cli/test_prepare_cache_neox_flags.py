"""`tokenload prepare-cache --neox-config` with prepare-cache's other flags: a new user's findings.

Every flag was accepted with --neox-config and silently ignored ("nothing to prepare"), --data-path
and the three per-split flags aside: `--packing best-fit`, `--order megatron`, `--seq-length 2048`,
`--split 50,50,0`, `--max-documents-per-row 3`, `--weights-schedule`... Now each flag of the command
is classified (cli/cache.py: NEOX_TAKES, NEOX_MEGATRON_ORDER, NEOX_REFUSES): `--order megatron`
prepares the Megatron order's caches of the NeoX data, as `imported.config(order="megatron",
packing=...)` builds them (a job then loads them with build_policy="none"), and every other flag
is refused in one line naming it, with what the NeoX config defines instead or why it does not
apply, and what to do."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from support import run_cli, write_documents
from tokenload.cli.cache_neox import NEOX_MEGATRON_ORDER, NEOX_REFUSES, NEOX_TAKES
from tokenload.cli.main import build_parser, main, subcommand_parser


def prepare_cache_flags() -> dict[str, argparse.Action]:
    parser = subcommand_parser(build_parser(), "prepare-cache")
    return {a.option_strings[-1]: a for a in parser._actions if a.option_strings and a.dest != "help"}


def words(flag: str) -> list[str]:
    """``flag`` with a value its parser takes."""
    action = prepare_cache_flags()[flag]
    if action.nargs == 0:
        return [flag]
    value = str(next(iter(action.choices))) if action.choices else "2"
    count = action.nargs if isinstance(action.nargs, int) else 1
    return [flag, *[value] * count]


REFUSED = sorted(NEOX_REFUSES)


def test_every_flag_of_prepare_cache_is_taken_or_refused_with_neox_config():
    """A flag added to prepare-cache later is classified too (else it would be ignored again)."""
    classes = [set(NEOX_TAKES), set(NEOX_MEGATRON_ORDER), set(NEOX_REFUSES)]
    assert set().union(*classes) == set(prepare_cache_flags())
    assert sum(map(len, classes)) == len(prepare_cache_flags())  # each flag in one class


@pytest.fixture
def neox_yml(tmp_path):
    docs = [(i * 131 + np.arange(20 + i % 17) * 7) % 50000 for i in range(200)]
    prefix = write_documents(tmp_path / "a", docs)
    yml = tmp_path / "job.yml"
    yml.write_text(
        f'{{"data_path": "{prefix}", "split": "8,1,1", "seq_length": 16, "train_iters": 20,\n'
        ' "train_batch_size": 2, "eval_iters": 1, "eval_interval": 6}\n'
    )
    return yml


def refusal(capsys, *argv) -> str:
    assert main(["prepare-cache", *map(str, argv)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("order", [[], ["--order", "megatron"]], ids=["neox-order", "megatron-order"])
@pytest.mark.parametrize("flag", REFUSED)
def test_a_flag_the_neox_config_defines_or_that_does_not_apply_is_refused(neox_yml, tmp_path, capsys, flag,
                                                                          order):
    err = refusal(capsys, "--neox-config", neox_yml, *order, *words(flag))
    assert f"error: {flag} " in err and "--neox-config" in err
    assert "the NeoX config defines" in err or "does not apply" in err
    assert f"[HINT: drop {flag}" in err
    assert not (tmp_path / "a" / "cache").exists()


@pytest.mark.parametrize("flag", ["--packing", "--max-documents-per-row", "--data-cache-path"])
def test_the_megatron_orders_flags_without_order_megatron_say_to_add_it(neox_yml, capsys, flag):
    """NeoX's order cannot pack and has no cache (imported.config(packing="best-fit") is a
    ConfigError too): the flag asks for the Megatron order's caches, which --order megatron
    prepares."""
    err = refusal(capsys, "--neox-config", neox_yml, *words(flag))
    assert f"error: {flag} does not apply to --neox-config in NeoX's order" in err
    assert "add --order megatron" in err


def test_several_refused_flags_are_named_together(neox_yml, capsys):
    err = refusal(capsys, "--neox-config", neox_yml, "--seq-length", 2048, "--split", "50,50,0",
                  "--seed", 1234)  # fmt: skip
    assert "--split is refused with --neox-config: the NeoX config defines split" in err
    assert "(also refused: --seq-length, --seed)" in err  # --seed at its default value is given too


def test_order_computed_and_a_megatron_training_commands_flags_are_refused(neox_yml, capsys):
    err = refusal(capsys, "--neox-config", neox_yml, "--order", "computed")
    assert "--order computed with --neox-config" in err and "nothing to prepare" in err
    with pytest.raises(SystemExit) as exit_:  # a usage error: argparse's usage, then the line
        main(["prepare-cache", "--neox-config", str(neox_yml), "--lr", "1e-4"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --lr 1e-4 (with --neox-config" in err


def test_order_megatron_prepares_the_caches_a_job_loads_with_build_policy_none(neox_yml, tmp_path):
    """The caches of imported.config(order="megatron", packing=..., max_documents_per_row=...,
    path_to_cache=...): the job's build with build_policy="none" finds every one (and fails
    before they are prepared)."""
    from tokenload.datasets import build_datasets
    from tokenload.datasets.neox.neox_yaml import neox_config_from_yaml
    from tokenload.errors import TokenloadError

    imported = neox_config_from_yaml(neox_yml)
    cases = [
        (["--packing", "best-fit", "--max-documents-per-row", "3", "--data-cache-path", tmp_path / "c"],
         {"packing": "best-fit", "max_documents_per_row": 3, "path_to_cache": str(tmp_path / "c")}),
        ([], {}),  # concat, in Megatron's default folder beside the token file
    ]  # fmt: skip
    for flags, overrides in cases:
        job = imported.config(order="megatron", build_policy="none", **overrides)
        with pytest.raises(TokenloadError):  # nothing prepared yet
            build_datasets(job, imported.sizes)
        out = run_cli("prepare-cache", "--neox-config", neox_yml, "--order", "megatron", *flags, "--json")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["order"] == "megatron" and result["files_written"]
        assert result["train_valid_test_num_samples"] == imported.sizes
        train, valid, test = build_datasets(job, imported.sizes)
        lengths = [result[f"{s}_dataset_length"] for s in ("train", "valid", "test")]
        assert [len(train), len(valid), len(test)] == lengths
    text = run_cli("prepare-cache", "--neox-config", neox_yml, "--order", "megatron")
    assert text.returncode == 0 and "0 files written" in text.stdout  # prepared: nothing to add
    assert "imported.config(order='megatron', packing='concat', build_policy='none')" in text.stdout
    assert (tmp_path / "a" / "cache" / "GPTDataset_indices").is_dir()
