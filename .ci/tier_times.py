"""The test time of each tier (a folder of tests/), summed from the JUnit XML that .ci/run
writes: what CONTRIBUTING.md's table of tiers gives. With --slow SECONDS, instead, the tests of
tests/unit that took that long or more (a function whose tests all did, or a file, as one line):
the list tests/unit/slow_tests.txt keeps out of the quick tier.

Usage: python .ci/tier_times.py build/test-results.xml [--slow SECONDS]   (from the repository root)
"""

from __future__ import annotations

import argparse
import os
import xml.etree.ElementTree as ET
from collections import defaultdict


def test_id(classname: str, name: str) -> str:
    """``tests/unit/x/test_f.py::Class::test_name[params]`` of a JUnit test case."""
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if os.path.exists(path):
            return "::".join([path, *parts[i:], name])
    return "::".join([classname, name])


def slow_list(times: dict[str, float], threshold: float) -> list[str]:
    """The tests at or over ``threshold``, a function or file whose tests all are as one line."""
    slow = {t for t, s in times.items() if s >= threshold}
    out: set[str] = set()
    for t in slow:
        function, path = t.split("[", 1)[0], t.split("::", 1)[0]
        if all(u in slow for u in times if u.split("::", 1)[0] == path):
            out.add(path)
        elif all(u in slow for u in times if u.split("[", 1)[0] == function):
            out.add(function)
        else:
            out.add(t)
    return sorted(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("xml")
    parser.add_argument("--slow", type=float, default=None)
    args = parser.parse_args()
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    tests: dict[str, float] = defaultdict(float)
    for case in ET.parse(args.xml).getroot().iter("testcase"):
        classname, seconds = case.get("classname", ""), float(case.get("time", 0))
        parts = classname.split(".")
        tier = "/".join(parts[:2]) if parts[0] == "tests" and len(parts) > 2 else parts[0]
        totals[tier] += seconds
        counts[tier] += 1
        tests[test_id(classname, case.get("name", ""))] += seconds
    if args.slow is not None:
        unit = {t: s for t, s in tests.items() if t.startswith("tests/unit/")}
        print("\n".join(slow_list(unit, args.slow)))
        return
    for tier in sorted(totals, key=lambda t: -totals[t]):
        print(f"{tier:<24}{counts[tier]:>6} tests{totals[tier] / 60:>8.1f} min")
    print(f"{'all':<24}{sum(counts.values()):>6} tests{sum(totals.values()) / 60:>8.1f} min")


if __name__ == "__main__":
    main()
