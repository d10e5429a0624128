"""The default private PCA fit of this checkout against another checkout's, in one process.

A change to the fit is measured against the code before it, not against a number from
another day: ``--ref-src`` is another checkout's ``src`` folder (``git archive REV src``);
its package is copied under another name (``dpprecond_ref``, every ``dpprecond`` in it
renamed) so that both import side by side. The cases run interleaved (``_common``): this
checkout's ``fit_private_pca`` with its default method, the reference's, scikit-learn's
default ``PCA`` and ``X.T @ X``; the table gives medians, the median of the paired ratios
(this checkout over the reference, round by round) and each fit over scikit-learn.

    git archive 1a1a074 src | tar -x -C /tmp/ref
    PYTHONPATH=src python benchmarks/pca_speed_paired.py --ref-src /tmp/ref/src --repeats 15
    # smoke test (a 3000-row subsample; numbers meaningless)
    PYTHONPATH=src python benchmarks/pca_speed_paired.py --ref-src /tmp/ref/src --quick
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import sklearn
from sklearn.decomposition import PCA

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    check_load,
    interleaved,
    markdown_table,
    md_write,
    print_header,
    was_disturbed,
    write_json,
)
from dpprecond.data import load_dataset
from dpprecond.pca import fit_private_pca

REF = "dpprecond_ref"


def import_reference(src: Path, into: Path):
    """The reference checkout's ``dpprecond`` package, copied into ``into`` as :data:`REF`."""
    pkg = src / "dpprecond"
    if not (pkg / "__init__.py").exists():
        raise SystemExit(f"--ref-src {src}: no dpprecond package there (expected the src "
                         "folder of a checkout, e.g. from `git archive REV src`).")
    dest = into / REF
    shutil.copytree(pkg, dest)
    word = re.compile(r"\bdpprecond\b")
    for path in dest.rglob("*.py"):
        path.write_text(word.sub(REF, path.read_text(encoding="utf-8")), encoding="utf-8")
    sys.path.insert(0, str(into))
    return importlib.import_module(f"{REF}.pca")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ref-src", type=Path, required=True,
                   help="the src folder of the reference checkout")
    p.add_argument("--data", default="fashion-mnist")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--eps", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--quick", action="store_true", help="3000 rows, 3 rounds (smoke test)")
    p.add_argument("--md", type=Path, help="also write the markdown report here")
    p.add_argument("--name", default="pca_speed_paired")
    args = p.parse_args()
    header = print_header("pca_speed_paired: the default fit against a reference checkout")
    X = np.ascontiguousarray(load_dataset(args.data).X_train, dtype=np.float64)
    if args.quick:
        X, args.repeats = X[:3000], 3
    row_norm = float(np.sqrt(X.shape[1]))  # pixels in [0, 1]: the public bound sqrt(d)
    with tempfile.TemporaryDirectory() as tmp:
        ref = import_reference(args.ref_src.resolve(), Path(tmp))
        kw = dict(target_epsilon=args.eps, target_delta=args.delta, row_norm=row_norm)
        cases = {"this checkout": lambda: fit_private_pca(X, args.k, **kw),
                 "reference": lambda: ref.fit_private_pca(X, args.k, **kw),
                 "sklearn PCA": lambda: PCA(args.k).fit(X),
                 "X.T @ X": lambda: X.T @ X}
        times = interleaved(cases, args.repeats)
    after = check_load("after")
    med = {c: statistics.median(v) for c, v in times.items()}
    paired = statistics.median(a / b for a, b in zip(times["this checkout"],
                                                     times["reference"], strict=True))
    rows = [[c, f"{med[c]:.3f}", f"{min(times[c]):.3f}", f"{med[c] / med['sklearn PCA']:.3f}"]
            for c in cases]
    table = markdown_table(["case", "median s", "min s", "/ sklearn PCA"], rows)
    text = (f"{args.data}: {X.shape[0]} x {X.shape[1]}, k = {args.k}, eps = {args.eps}, "
            f"delta = {args.delta}, row_norm = {row_norm:g}; {args.repeats} interleaved "
            f"rounds; scikit-learn {sklearn.__version__} PCA(svd_solver='auto'); reference: "
            f"{args.ref_src}\n\n{table}\n\nthis checkout / reference, median of the paired "
            f"ratios: {paired:.3f}; disturbed: {was_disturbed(header['load_before'], after)}\n")
    print(text)
    write_json(args.name, {**header, "load_after": after, "times": times, "paired": paired,
                           "args": {k: str(v) for k, v in vars(args).items()}})
    if args.md:
        md_write(args.md, f"# The default PCA fit against a reference checkout\n\nCommand: "
                 f"`{' '.join(sys.argv)}`\n\n{text}")


if __name__ == "__main__":
    main()
