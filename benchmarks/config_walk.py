"""Where ``build_datasets``' ``config`` goes: the files a walk of the calls that pass it visits
(issue 37's measure; the flat design visited 16 files and doubled back 21 times).

The walk is ``tests/unit/test_config_flow.py``'s (``ast`` only, nothing of tokenload imported):
from ``build_datasets(config)``, each call that passes the value on (by name, alias, an
attribute of ``self`` holding it, or ``self`` of a class holding it), into the function, method
or class it names. ``--flat`` follows the flat config only; by default the walk also follows the
records ``config.typed()`` returns, as the flat design's walk followed the config everywhere.

A double-back is a step into a file that the walk has visited before, from another file.

    python benchmarks/config_walk.py [--flat]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))

from test_config_flow import _walk  # the tests' walk, read from the source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flat", action="store_true", help="follow the flat config only")
    args = parser.parse_args()
    visits = _walk(derived=not args.flat).visits
    files = list(dict.fromkeys(visits))
    back, seen, previous = 0, set(), None
    for file in visits:
        if file != previous and file in seen:
            back += 1
        seen.add(file)
        previous = file
    print(f"{len(files)} files, {back} double-backs ({len(visits)} steps)")
    for file in files:
        print(f"  {file}")


if __name__ == "__main__":
    main()
