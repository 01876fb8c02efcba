"""Measure the training data of the cost-model prior: tune each training kernel into one database.

    python tools/collect_prior.py --db prior.db [--trials 32 --exploit-trials 32]

Resumable (the database is stormdrop's own); then `tools/train_prior.py` turns it
into the shipped dataset.
"""

import argparse
import sys
import time

from prior_kernels import TRAIN_KERNELS

from stormdrop import KernelOptions, SearchOptions, StormConfig, tune_kernel


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--db", required=True)
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--exploit-trials", type=int, default=32)
    args = p.parse_args()
    for i, spec in enumerate(TRAIN_KERNELS):
        t0 = time.monotonic()
        try:
            r = tune_kernel(spec,
                            KernelOptions(trials=args.trials, exploit_trials=args.exploit_trials, seed=100 + i,
                                          search=SearchOptions(storm=StormConfig(prior=False), hub=False)),
                            db=args.db)  # the prior is learnt cold
            t = r.tasks[0]
            print(f"{spec}: {t.latency_s * 1e6:.1f} us {t.trials} {time.monotonic() - t0:.0f} s", flush=True)
        except Exception as err:  # noqa: BLE001 - one failing kernel does not stop the collection
            print(f"{spec}: FAILED {err}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
