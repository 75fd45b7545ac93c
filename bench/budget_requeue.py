"""What a tenant's waiting Pods make the leader's requeue cost, at the scale of the issue that found it.

    python bench/budget_requeue.py            # both classes
    python bench/budget_requeue.py -k fat     # one

Runs tests/e2e/test_requeue_budget.py at the issue's scale (DRAQUOTA_REQUEUE_SCALE=issue)
on the real control plane, and prints what each test reported:

- amplification: mallory's Pods wait on 200 templates padded to 20 KiB; she creates and
  deletes a small claim 28 times (56 tenant requests). serve's template writes in her
  namespace (the API server's audit log), per tenant request, and the bytes they rewrote;
  serve's RSS; the longest event loop stall (`draquota_event_loop_stall_max_seconds`).
- fat Pods: 260 unscheduled Pods of ~1 MB wait on one template, then room frees. The
  growth of serve's peak RSS while it requeues them (VmRSS sampled, VmHWM), the stall.

Before the requeue had a budget (the issue's numbers): 2,428 template writes for 56
requests (43 a request), 52 MB rewritten; 260 one-MB Pods took serve from 80 to 840 MiB
with a 1.89 s stall. Measured here (docs/development/performance.md): 3b5481f 600 writes (10.7 a
request), 751 MiB of growth, a 2.45 s stall; now 50 writes (0.89), 4.6 MiB, 88 ms. Run it
on any checkout to compare (an older serve lacks the draquota_requeue_* metrics the
amplification test waits on).
"""

from __future__ import annotations

import argparse
import os
import sys

from scaled import run_scaled
TEST = "tests/e2e/test_requeue_budget.py"
NAMES = {1: "amplification (200 x 20 KiB templates, 56 requests)", 2: "fat unscheduled Pods (260 x 1 MB)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-k", default="", help="pytest -k expression: 'writes' or 'fat'")
    args = parser.parse_args()
    returncode, reports = run_scaled([TEST], scale=("DRAQUOTA_REQUEUE_SCALE", "issue"),
                                     report_variable="DRAQUOTA_REQUEUE_REPORT", k=args.k)
    for numbers in reports:
        print(f"\n{NAMES[numbers.pop('test')]}")
        for key, value in numbers.items():
            print(f"  {key:22} {value:,.3f}" if isinstance(value, float) else f"  {key:22} {value}")
    sys.exit(returncode)


if __name__ == "__main__":
    main()
