"""The test time of each tier (a folder of tests/), summed from the JUnit XML that .ci/run
writes: what CONTRIBUTING.md's table of tiers gives.

Usage: python .ci/tier_times.py build/test-results.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def main(xml_path: str) -> None:
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        tier = "/".join(parts[:2]) if parts[0] == "tests" and len(parts) > 2 else parts[0]
        totals[tier] += float(case.get("time", 0))
        counts[tier] += 1
    for tier in sorted(totals, key=lambda t: -totals[t]):
        print(f"{tier:<24}{counts[tier]:>6} tests{totals[tier] / 60:>8.1f} min")
    print(f"{'all':<24}{sum(counts.values()):>6} tests{sum(totals.values()) / 60:>8.1f} min")


if __name__ == "__main__":
    main(sys.argv[1])
