"""Speed of the accounting a federated sweep does: epsilon of T Gaussian releases, calibration.

A per-round sweep asks for the epsilon of ``t * releases_per_round`` Gaussian releases
after every round and calibrates ``z`` once per run. :func:`dpprecond.accounting.epsilon_of`
evaluates a composition of unsampled Gaussians exactly as one Gaussian mechanism; the
reference is dp_accounting's PLD accountant composing the same events (its discretized
FFT composition, interval 1e-4, as ``make_accountant("pld")`` builds it), timed in the
same run. The script also prints both epsilons, so the agreement is visible.

    PYTHONPATH=src python benchmarks/accounting_speed.py --repeats 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import dp_accounting
from dp_accounting import dp_event

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, markdown_table, median_time
from dpprecond.accounting import calibrate_noise, epsilon_of, gaussian


def discretized_pld_epsilon(event: dp_event.DpEvent, delta: float) -> float:
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    delta = 1e-5
    print(environment())
    rows = []
    # (z, releases): FedGD at eps=1 over 70 rounds; FedAvg/SCAFFOLD at eps=0.5 over 350 steps.
    for z, n in ((31.2, 70), (131.6, 350), (5.0, 350)):
        event = dp_event.SelfComposedDpEvent(gaussian(z), n)
        ours = median_time(lambda e=event: epsilon_of(e, delta, "pld"), args.repeats)
        ref = median_time(lambda e=event: discretized_pld_epsilon(e, delta), args.repeats)
        rows.append([f"epsilon_of: {n} x Gaussian(z={z})", f"{ours * 1e3:.3g} ms",
                     f"{ref * 1e3:.3g} ms", f"{ref / ours:.0f}x",
                     f"{epsilon_of(event, delta, 'pld'):.6f}",
                     f"{discretized_pld_epsilon(event, delta):.6f}"])
    for eps, n in ((1.0, 70), (0.5, 350)):
        def make(s: float, n: int = n) -> dp_event.DpEvent:
            return dp_event.SelfComposedDpEvent(gaussian(s), n)

        z = calibrate_noise(make, eps, delta, "pld")
        ours = median_time(lambda e=eps, m=make: calibrate_noise(m, e, delta, "pld"),
                           args.repeats, warmup=0)
        # The same mechanism wrapped as Poisson sampling with probability 1 is not a plain
        # Gaussian event, so calibrate_noise sends it through the discretized accountant.
        def make_ref(s: float, n: int = n) -> dp_event.DpEvent:
            return dp_event.SelfComposedDpEvent(
                dp_event.PoissonSampledDpEvent(1.0, gaussian(s)), n)

        z_ref = calibrate_noise(make_ref, eps, delta, "pld")
        ref = median_time(lambda e=eps, m=make_ref: calibrate_noise(m, e, delta, "pld"),
                          1, warmup=0)
        rows.append([f"calibrate z: eps={eps}, {n} releases", f"{ours * 1e3:.3g} ms",
                     f"{ref * 1e3:.3g} ms", f"{ref / ours:.0f}x", f"z = {z:.6g}",
                     f"z = {z_ref:.6g}"])
    print(markdown_table(["task", "exact Gaussian path", "discretized PLD accountant",
                          "ratio", "exact", "discretized PLD"], rows))


if __name__ == "__main__":
    main()
