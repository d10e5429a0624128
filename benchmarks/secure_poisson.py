"""What secure mode's Poisson sampler costs: the Skellam noise of one secure round.

A round of secure aggregation draws, for each of ``K`` clients, two Poisson vectors of
the model's ``p`` coordinates (the Skellam share). The reference is numpy's
``Generator.poisson`` on PCG64 (the default mode's sampler, numpy's version printed);
against it: :func:`dpprecond._poisson.poisson_from_uniforms` on PCG64's uniforms (the
algorithm's own cost) and :meth:`dpprecond.secure.SecureGenerator.poisson` (the same on
``os.urandom`` uniforms: secure mode). Interleaved, medians; the load is printed before
and after, and a disturbed run says so.

    PYTHONPATH=src python benchmarks/secure_poisson.py --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import check_load, interleaved, markdown_table, print_header, was_disturbed
from dpprecond._poisson import poisson_from_uniforms
from dpprecond.secure import SecureGenerator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--params", type=int, default=7850,
                        help="coordinates of a share (Fashion-MNIST's linear head: 7850)")
    parser.add_argument("--clients", type=int, default=20)
    args = parser.parse_args()
    before = print_header("secure mode's Poisson sampler against numpy's")["load_before"]
    print(f"# reference: numpy {np.__version__} Generator(PCG64).poisson")
    n = 2 * args.params * args.clients
    rng, secure = np.random.default_rng(0), SecureGenerator()
    rows = []
    for lam in (5.0, 1e4, 1e10):  # below PTRS, a small share, a Fashion-MNIST-sized share
        times = interleaved({
            "numpy": lambda lam=lam: rng.poisson(lam, n),
            "ours (PCG64 uniforms)": lambda lam=lam: poisson_from_uniforms(lam, n,
                                                                          rng.random),
            "secure (os.urandom)": lambda lam=lam: secure.poisson(lam, n),
        }, args.repeats)
        ref = statistics.median(times["numpy"])
        for name, ts in times.items():
            med = statistics.median(ts)
            rows.append([f"{lam:g}", name, med * 1e3, med / ref])
    after = check_load("after")
    print(markdown_table([f"lam ({n} draws)", "sampler", "median ms", "/ numpy"], rows))
    if was_disturbed(before, after):
        print("# DISTURBED: another process used the machine during the run; rerun it")


if __name__ == "__main__":
    main()
