"""Faults under a steady load of creates: a rolling upgrade and its rollback, and a replica
cut off from the API server, at full size.

    python bench/rolling.py                 # both
    python bench/rolling.py -k rolling      # one (-k cut for the other)

Runs tests/e2e/test_rolling_upgrade.py and tests/e2e/test_cut_off.py on the real control
plane with DRAQUOTA_FAULTS_SCALE=full (tests/e2e/faults.py: 64 creates in flight from
4 clients across 20 namespaces, 5 of them at `hard`; 3,000 creates between two steps of a
fault; a 60 s partition), with their assertions, and prints what each measured:

- rolling: two replicas on one port (SO_REUSEPORT) replaced one at a time by two with new
  flags, each old one SIGTERMed with the chart's --shutdown-delay, then back (a rollback).
  Creates and the rate reached, failed creates (any answer but admitted, a quota's denial
  or a lease's "retry"), over-commit (max charged - hard over every quota at every
  resourceVersion, in GPUs), claims stored without our charge, each replica's time to
  ready and to exit after SIGTERM, the longest event loop stall of any replica, and how
  long no replica led at each hand-over of the Lease.
- cut off: one of two replicas behind a loopback proxy that holds every byte for 60 s.
  Creates refused because of the cut (its 503: failurePolicy Fail; its own timeout denial
  in the seconds before it noticed), any other failure, over-commit, a quota created during
  the cut and filled meanwhile, creates in an ungoverned namespace, seconds until the replica
  noticed and until it was ready again after the heal, the longest stall.

Results: docs/development/reservations.md, "Faults".
"""

from __future__ import annotations

import argparse
import os
import sys

from scaled import run_scaled
TESTS = ["tests/e2e/test_rolling_upgrade.py", "tests/e2e/test_cut_off.py"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", default="", help="pytest -k expression: 'rolling' or 'cut'")
    args = parser.parse_args()
    returncode, reports = run_scaled(TESTS, scale=("DRAQUOTA_FAULTS_SCALE", "full"),
                                     report_variable="DRAQUOTA_FAULTS_REPORT", k=args.k)
    print(f"\nload average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for numbers in reports:
        print(f"\n{numbers.pop('test')}")
        for key, value in numbers.items():
            print(f"  {key:30} {value}")
    sys.exit(returncode)


if __name__ == "__main__":
    main()
