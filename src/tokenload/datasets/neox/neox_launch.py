"""GPT-NeoX's count of a job's GPUs (``global_num_gpus``) from its launcher keys: ``hostfile``,
``include``, ``exclude``, ``num_nodes`` and ``num_gpus``.

NeoX's ``deepy.py`` counts them in ``NeoXArgs.calculate_derived``
(``megatron/neox_arguments/arguments.py``, commit ea7aefd) when the config has no
``global_num_gpus``, and writes the count into every rank's config. With a hostfile (the
config's ``hostfile``, else DeepSpeed's ``/job/hostfile``, or ``$DLTS_HOSTFILE``, where it
exists) it reads the pool with ``megatron.utils.obtain_resource_pool``: DeepSpeed's
``fetch_hostfile`` and ``parse_inclusion_exclusion`` at the DeeperSpeed commit NeoX pins
(91d1c55), a named hostfile that is not a file being this machine alone (``localhost``); keeps
the first ``num_nodes`` hosts (where > 0); and counts every slot left, or ``num_gpus`` (where
> 0) per host. Without a hostfile it counts this machine's GPUs (``torch.cuda.device_count()``),
which a process reading a config cannot know: ``launch_gpus`` is then None, and
``uncounted_gpus`` says why in the error that the process's own world then meets (the
``num_gpus`` and ``num_nodes`` such a count leaves unused named).

DeepSpeed's own quirks at that commit are NeoX's count, and kept: a host ``include`` names
without slot ids gets no slot (``worker-0@worker-1:0,2`` is 2 GPUs, worker-1's; DeepSpeed's
docs add all of worker-0's), and ``include``'s slot ids are not checked against the hostfile's
slots. A relative hostfile path is read from the current directory, as NeoX reads it. What NeoX's
launcher refuses (a bad hostfile, unknown hosts or slots, include with exclude, num_nodes with
either, a count its launcher would not start, no GPU left) is a ConfigError, and so is
``num_nodes`` above the hosts there are (NeoX would take them all).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from ...errors import ConfigError

__all__ = [
    "DEFAULT_HOSTFILE",
    "LAUNCH_DEFAULTS",
    "check_launch_values",
    "launch_gpus",
    "uncounted_gpus",
]

DEFAULT_HOSTFILE = "/job/hostfile"
"""DeepSpeed's ``DLTS_HOSTFILE``, read where the config names no hostfile (and where it exists);
the ``DLTS_HOSTFILE`` environment variable replaces it, as in NeoX."""

LAUNCH_DEFAULTS: dict[str, Any] = {
    "hostfile": None,
    "include": None,
    "exclude": None,
    "num_nodes": -1,
    "num_gpus": None,
}
"""The launcher keys, with GPT-NeoX's defaults (``deepspeed_args.py``)."""

logger = logging.getLogger(__name__)

_HOST_LINE = re.compile(r"(\S+)\s+slots=(\d+)")  # DeepSpeed's _parse_hostfile pattern
_SLOT = re.compile(r"[0-9]+")
_MOST_SLOTS = 1 << 16
"""Slots (GPUs) one hostfile line may give: far above any machine's, low enough to list."""
_FORMAT_HINT = "write one host a line as 'HOST slots=N' (# starts a comment)"


def check_launch_values(conf: Mapping[str, Any]) -> None:
    """The launcher keys' types, as NeoX's ``validate_types`` takes them (null is unset)."""
    for key, kind, expected in (
        ("hostfile", str, "a path"),
        ("include", str, "a string"),
        ("exclude", str, "a string"),
        ("num_nodes", int, "an int"),
        ("num_gpus", int, "an int"),
    ):
        value = conf[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise ConfigError(
                f"NeoX key {key} is {value!r}; expected {expected} (GPT-NeoX refuses it too)",
                hint=f"fix {key} in the NeoX config",
            )


def launch_gpus(conf: Mapping[str, Any]) -> int | None:
    """The job's GPUs as NeoX's ``calculate_derived`` counts them from the launcher keys, for a
    config without ``global_num_gpus``; None where NeoX counts this machine's GPUs (no hostfile,
    or a named one that is not here, with no ``num_gpus`` or include slots to count instead)."""
    named = conf["hostfile"]
    default = os.environ.get("DLTS_HOSTFILE", DEFAULT_HOSTFILE)
    if named is None and not os.path.exists(default):
        return None
    path = named or default  # NeoX: self.hostfile or DLTS_HOSTFILE
    local = not os.path.isfile(path)
    pool: dict[str, int | None] = {"localhost": None} if local else _read_hostfile(path)
    where = (
        f"the hostfile {path} is not a file on this machine, so GPT-NeoX's launcher has this"
        " machine alone (localhost)"
        if local
        else f"the hostfile {path} lists {_names(pool)}"
    )
    include, exclude = conf["include"] or "", conf["exclude"] or ""
    chosen = _filter(pool, include, exclude, where)
    nodes = conf["num_nodes"]
    if nodes is not None and nodes >= 0 and (include or exclude):
        key = "include" if include else "exclude"
        raise ConfigError(
            f"NeoX key num_nodes is {nodes} with {key} {include or exclude!r}; expected one of"
            " the two (DeepSpeed's runner, which GPT-NeoX's launcher runs, refuses both)",
            hint=f"remove num_nodes ({key} already chooses the hosts)",
        )
    if chosen is None:  # an exclude of slots on this machine, whose GPUs NeoX counts
        return None
    if local and named:  # faithful to NeoX, but easy to miss where the file is on the cluster only
        logger.warning(
            "the NeoX config's hostfile %s is not on this machine: GPUs counted for this machine"
            " alone, as GPT-NeoX's launcher would here; if the job runs on the hosts of a"
            " hostfile elsewhere, give global_num_gpus (prepare-cache: --prepare-cache-world-size"
            " N) or run where the hostfile is",
            path,
        )
    if nodes is not None and nodes > len(chosen):  # (chosen is the pool: no include/exclude)
        raise ConfigError(
            f"NeoX key num_nodes is {nodes} but {where}; expected num_nodes {len(chosen)} or less"
            + (
                " (GPT-NeoX's launcher refuses it too)"
                if local
                else f" (GPT-NeoX would run on those {len(chosen)} alone)"
            ),
            hint="point hostfile at the job's hostfile, or run where it is; set num_nodes to the"
            " hosts the job runs on; or give global_num_gpus (prepare-cache:"
            " --prepare-cache-world-size N)",
        )
    if nodes is not None and nodes > 0:
        chosen = dict(list(chosen.items())[:nodes])
    gpus = conf["num_gpus"]
    slots = None if None in chosen.values() else sum(len(s or ()) for s in chosen.values())
    count = gpus * len(chosen) if gpus is not None and gpus > 0 else slots
    # with include/exclude (even ""), NeoX's get_deepspeed_main_args drops num_gpus from the
    # launcher's arguments: its processes are the slots left, and DeepSpeed refuses a batch
    # sized for another count
    filtered = conf["include"] is not None or conf["exclude"] is not None
    if filtered and slots is not None and count != slots:
        raise ConfigError(
            f"NeoX key num_gpus is {gpus} with include/exclude: GPT-NeoX counts {gpus} x"
            f" {len(chosen)} host(s) = {count} GPUs, but its launcher drops num_gpus then and"
            f" starts {slots} processes on the slots include/exclude leave; expected the two"
            " to agree (DeepSpeed refuses the batch sizes of such a job)",
            hint="remove num_gpus (include/exclude choose the slots)",
        )
    if count == 0:
        whole = [h for h, s in _spec("include", include).items() if not s] if include else []
        what = f"include {include!r}" if include else f"exclude {exclude!r}" if exclude else ""
        raise ConfigError(
            f"the NeoX launcher keys leave no GPU: {where}, with {what or 'no slot on any'};"
            " expected at least one GPU (GPT-NeoX fails on this config too)",
            hint=f"give {whole[0]}'s slots in include ({whole[0]}:0,1,...): a host named without"
            " them gets none in the DeepSpeed GPT-NeoX runs"
            if whole
            else "check the hostfile's slots, include and exclude",
        )
    return count


def uncounted_gpus(conf: Mapping[str, Any]) -> str:
    """Why GPT-NeoX would count ``conf``'s GPUs on the machine it runs on (where ``launch_gpus``
    is None), with the launcher keys that count leaves unused, as a clause for an error: a config
    with ``num_gpus: 8, num_nodes: 2`` and no hostfile is not 16 GPUs to NeoX."""
    named = conf["hostfile"]
    default = os.environ.get("DLTS_HOSTFILE", DEFAULT_HOSTFILE)
    unknown = (
        "which a process reading the config cannot know, so this process's world (a launched"
        " job's WORLD_SIZE, else 1) was counted"
    )
    if named is None and not os.path.exists(default):
        unused = [f"{k} {conf[k]}" for k in ("num_gpus", "num_nodes") if (conf[k] or 0) > 0]
        where = (
            f"there is no hostfile (the config names none, and DeepSpeed's default {default} is"
            " not on this machine)"
        )
        count = (
            "without one, GPT-NeoX counts the GPUs of the machine it runs on"
            f" (torch.cuda.device_count()), {unknown}"
        )
        if unused:
            verb = "were" if len(unused) > 1 else "was"
            return f"{' and '.join(unused)} {verb} not used because {where}: {count}"
        return f"{where}: {count}"
    less = f" less the slots exclude {conf['exclude']!r} drops" if conf["exclude"] else ""
    return (
        f"the hostfile {named or default} is not a file on this machine, so GPT-NeoX's launcher"
        f" has this machine alone and counts its GPUs (torch.cuda.device_count()){less}, {unknown}"
    )


def _read_hostfile(path: str) -> dict[str, int | None]:
    """DeepSpeed's ``fetch_hostfile``: ``HOST slots=N`` lines in order, ``#`` comments; a slot
    count with more after it than a space or ``#`` (``slots=4.5``, which DeepSpeed reads as 4) is
    refused rather than cut."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the hostfile: {exc.strerror}",
            path=path,
            hint="fix hostfile in the NeoX config (or its permissions), or remove it",
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(
            "the hostfile is not text; expected lines 'HOST slots=N'",
            path=path,
            hint=_FORMAT_HINT,
        ) from None
    pool: dict[str, int | None] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _HOST_LINE.match(line)
        if match is None:
            raise ConfigError(
                f"line {number} of the hostfile is {line!r}; expected 'HOST slots=N'"
                " (DeepSpeed's hostfile format; GPT-NeoX's launcher refuses it too)",
                path=path,
                hint=_FORMAT_HINT,
            )
        rest = line[match.end() :]
        if rest[:1] not in ("", "#") and not rest[0].isspace():
            raise ConfigError(
                f"line {number} of the hostfile gives slots={match.group(2)}{rest.split()[0]};"
                f" expected a whole number of slots (DeepSpeed would read it as"
                f" {match.group(2)})",
                path=path,
                hint=_FORMAT_HINT,
            )
        host = match.group(1)
        if host in pool:
            raise ConfigError(
                f"line {number} of the hostfile lists {host} again; expected each host once"
                " (GPT-NeoX's launcher refuses it too)",
                path=path,
                hint=f"keep one line for {host}",
            )
        slots = int(match.group(2))
        if slots > _MOST_SLOTS:  # (counted one by one below, as DeepSpeed lists them)
            raise ConfigError(
                f"line {number} of the hostfile gives {host} slots={slots}; expected at most"
                f" {_MOST_SLOTS:,} GPUs on one host",
                path=path,
                hint=f"fix the slots of {host} (its GPU count)",
            )
        pool[host] = slots
    if not pool:
        raise ConfigError(
            "the hostfile lists no host; expected lines 'HOST slots=N' (GPT-NeoX's launcher"
            " refuses it too)",
            path=path,
            hint=_FORMAT_HINT,
        )
    return pool


def _spec(key: str, text: str) -> dict[str, list[int]]:
    """DeepSpeed's ``parse_node_config_list``: ``NAME[:SLOT[,SLOT...]]`` joined by ``@``, the
    slot ids of a host named twice merged, sorted and once each."""
    spec: dict[str, set[int]] = {}
    for part in text.split("@"):
        host, colon, listed = part.partition(":")
        tokens = [t.strip() for t in listed.split(",")] if colon else []
        if not host or ":" in listed or not all(_SLOT.fullmatch(t) for t in tokens):
            raise ConfigError(
                f"NeoX key {key} is {text!r}, whose {part!r} is not NAME or NAME:SLOT,SLOT...;"
                " expected hostfile hosts joined by @, each with optional slot ids (DeepSpeed's"
                " format: worker-0:0,1@worker-1)",
                hint=f"fix {key} in the NeoX config",
            )
        spec.setdefault(host, set()).update(int(t) for t in tokens)
    return {host: sorted(ids) for host, ids in spec.items()}


def _filter(
    pool: Mapping[str, int | None], include: str, exclude: str, where: str
) -> dict[str, list[int] | None] | None:
    """DeepSpeed's ``parse_inclusion_exclusion`` as GPT-NeoX's DeeperSpeed has it: each host's
    slot ids (None: all of a count this machine cannot know), in the hostfile's order; None where
    slots are excluded from such a host (whether any is left, or the slot exists, is unknown)."""
    if include and exclude:
        raise ConfigError(
            f"NeoX keys include and exclude are both set ({include!r}, {exclude!r}); expected one"
            " of them (DeepSpeed's runner, which GPT-NeoX's launcher runs, refuses both)",
            hint="keep include or exclude",
        )
    if not include and not exclude:
        return {h: None if n is None else list(range(n)) for h, n in pool.items()}
    key = "include" if include else "exclude"
    spec = _spec(key, include or exclude)
    for host in spec:
        if host not in pool:
            raise ConfigError(
                f"NeoX key {key} names host {host!r}, but {where}; expected hosts of the"
                " hostfile (GPT-NeoX's launcher refuses it too)",
                hint=f"fix {key}, or point hostfile at the job's hostfile",
            )
    if include:  # the include's own slot ids: none for a host named without them
        return {h: list(spec[h]) for h in pool if spec.get(h)}
    chosen: dict[str, list[int] | None] = {}
    for host, count in pool.items():
        dropped = spec.get(host, [])
        if host in spec and not dropped:  # the whole host excluded
            continue
        if count is None:
            if dropped:
                return None
            chosen[host] = None
            continue
        for slot in dropped:
            if slot >= count:
                raise ConfigError(
                    f"NeoX key exclude names slot {slot} of {host}, which has slots={count} in"
                    f" the hostfile; expected slot ids 0 to {count - 1} (GPT-NeoX's launcher"
                    " refuses it too)",
                    hint="fix exclude",
                )
        left = [s for s in range(count) if s not in dropped]
        if left:  # DeepSpeed drops a host left with no slot
            chosen[host] = left
    return chosen


def _names(pool: Mapping[str, Any]) -> str:
    hosts = list(pool)
    shown = ", ".join(hosts[:6]) + (f" and {len(hosts) - 6} more" if len(hosts) > 6 else "")
    return f"{len(hosts)} host(s) ({shown})"
