"""``method="auto"`` against an exactly calibrated Analyze Gauss on families built to break it.

Issue 21: the families where the rule of issue 9 lost (k >= d/2, signal and the rest of the
row dependent, heavy-tailed rows far below their bound, just below the switch), families
designed to break the new rule (k from 1 to d - 1, d up to 2000, n from 10 d, rows far
below the bound, dependent row structures, real data centered and uncentered) and the
spec's regime map. For every cell and seed the same rows get:

- ``ag``: Analyze Gauss calibrated exactly (PLD, :func:`dpprecond.pca.budget.plan_auto`'s
  multiplier; the reference of the targets), with the random stream that ``auto`` gets;
- ``auto``: :func:`dpprecond.pca.auto.fit_auto` with its rule (the library's default);
- ``auto_ag`` and ``auto_it``: the same fit with the branch forced (``branch=...``; the
  iteration keeps the rule's radius and number of steps).

Metrics: spectral sin-theta to the exact top-k subspace of the rows (at the public bound,
centered when the cell is) and captured variance ``tr(X^T S X) / tr(V^T S V)``. Results are
JSON lines in ``benchmarks/out/`` (a rerun skips the records already there, so an
interrupted run resumes); ``report`` writes the tables between the markers of
``docs/pca_auto.md``.

Seeds: 100-104 were used to design the rule (development); the tables are seeds 0-4, run
once after the rule was frozen. Run with one BLAS thread (the machine is shared)::

    OPENBLAS_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/pca_families.py run \\
        --seeds 0 1 2 3 4
    OPENBLAS_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/pca_families.py run \\
        --groups map --seeds 0 1 2 3 4
    .venv/bin/python benchmarks/pca_families.py report
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OUT_DIR, environment, markdown_table
from dpprecond.data.synthetic import coherent_spiked
from dpprecond.pca.auto import fit_auto
from dpprecond.pca.baselines import analyze_gauss
from dpprecond.pca.budget import plan_auto
from dpprecond.pca.core import top_eigvecs
from dpprecond.pca.metrics import sin_theta
from dpprecond.pca.rows import ClippedRows

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "pca_auto.md"
OUT = OUT_DIR / "pca_families.jsonl"
DELTA = 1e-6
METHODS = ("ag", "auto", "auto_ag", "auto_it")
#: Loss allowed against Analyze Gauss (median over seeds) and the share of a 2x gain auto
#: must capture (issue 21).
MAX_LOSS = 1.02
MIN_CAPTURE = 0.8
ENV = environment()


# -- generators ------------------------------------------------------------------------------

def _basis(rng: np.random.Generator, d: int, k: int) -> np.ndarray:
    Q, R = np.linalg.qr(rng.standard_normal((d, k)))
    return Q * np.sign(np.diag(R))


def _unit_max(X: np.ndarray) -> np.ndarray:
    return X / np.sqrt(np.einsum("ij,ij->i", X, X).max())


def spiked(rng: np.random.Generator, n: int, d: int, k: int, theta: float,
           fraction: float = 1.0) -> np.ndarray:
    """Families 1 and 2 of the spec (largest row norm 1)."""
    return coherent_spiked(n, d, k, theta / fraction if fraction < 1 else theta, fraction, rng)


def split_rows(rng: np.random.Generator, n: int, d: int, k: int, theta: float,
               signal_scale: float = 1.0) -> np.ndarray:
    """Half of the rows carry only the signal ``sqrt(theta) V h``, half only noise ``g``.

    The signal rows' norm is ``signal_scale`` times their natural size: a row's share of
    the top-k directions and of the rest are then strongly dependent (issue 21).
    """
    V = _basis(rng, d, k)
    X = rng.standard_normal((n, d))
    half = n // 2
    X[:half] = signal_scale * math.sqrt(theta) * rng.standard_normal((half, k)) @ V.T
    return _unit_max(X)


def multivariate_t(rng: np.random.Generator, n: int, d: int, k: int, theta: float,
                   df: float) -> np.ndarray:
    """Spiked rows ``(I + theta V V^T)^(1/2) g / sqrt(chi2_df / df)`` (heavy-tailed norms)."""
    V = _basis(rng, d, k)
    G = rng.standard_normal((n, d))
    G += (math.sqrt(1.0 + theta) - 1.0) * (G @ V) @ V.T
    G /= np.sqrt(rng.chisquare(df, n) / df)[:, None]
    return _unit_max(G)


def scale_mixture(rng: np.random.Generator, n: int, d: int, k: int, theta: float,
                  sigma: float) -> np.ndarray:
    """Spiked rows times a log-normal scale ``exp(sigma N(0, 1))`` per row."""
    X = coherent_spiked(n, d, k, theta, 1.0, rng)
    X *= np.exp(sigma * rng.standard_normal(n))[:, None]
    return _unit_max(X)


def clusters(rng: np.random.Generator, n: int, d: int, k: int, spread: float) -> np.ndarray:
    """Rows from k clusters: mean ``3 e_c`` in a random k-dim subspace plus N(0, spread^2 I)."""
    V = _basis(rng, d, k)
    labels = rng.integers(0, k, n)
    X = spread * rng.standard_normal((n, d))
    X += 3.0 * V[:, labels].T
    return _unit_max(X)


def real(name: str) -> tuple[np.ndarray, float]:
    from dpprecond.cli.pca import load_pca_matrix

    X, bound, _ = load_pca_matrix(name)
    return np.ascontiguousarray(X, dtype=np.float64), float(bound or 1.0)


# -- the cells ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    """One matrix (per seed) and the epsilons it is fitted at."""

    group: str
    name: str
    k: int
    eps: tuple[float, ...]
    make: Callable[[np.random.Generator], np.ndarray]
    row_norm: float = 1.0
    center: bool = False
    params: dict[str, Any] = field(default_factory=dict)

    def key(self, eps: float, seed: int) -> str:
        return f"{self.group}|{self.name}|{eps:g}|{seed}"


def _cells() -> Iterator[Cell]:
    # The families of issue 21.
    for n, d, k in ((10_000, 10, 5), (10_000, 16, 8)):
        yield Cell("issue", f"k>=d/2 n={n} d={d} k={k} theta=9", k, (1.0, 4.0),
                   lambda r, n=n, d=d, k=k: spiked(r, n, d, k, 9.0),
                   params={"n": n, "d": d})
    for theta in (9.0, 30.0):
        yield Cell("issue", f"split rows n=1e5 d=300 k=5 theta={theta:g}", 5, (1.0, 4.0),
                   lambda r, t=theta: split_rows(r, 100_000, 300, 5, t),
                   params={"n": 100_000, "d": 300})
    yield Cell("issue", "t3 rows n=4e5 d=50 k=3 theta=9", 3, (0.5, 1.0, 4.0),
               lambda r: multivariate_t(r, 400_000, 50, 3, 9.0, 3.0),
               params={"n": 400_000, "d": 50})
    yield Cell("issue", "below the switch n=3e4 d=400 k=5 theta=4.5", 5, (0.5, 1.0, 2.0),
               lambda r: spiked(r, 30_000, 400, 5, 4.5), params={"n": 30_000, "d": 400})
    # Designed to break the rule.
    for n in (400, 4000):
        for k in (1, 5, 10, 20, 30, 39):
            yield Cell("k sweep", f"n={n} d=40 k={k} theta=9", k, (1.0, 4.0),
                       lambda r, n=n, k=k: spiked(r, n, 40, k, 9.0), params={"n": n, "d": 40})
    for n in (20_000, 100_000):
        yield Cell("large d", f"n={n} d=2000 k=5 theta=9", 5, (1.0, 4.0),
                   lambda r, n=n: spiked(r, n, 2000, 5, 9.0), params={"n": n, "d": 2000})
    yield Cell("large d", "n=2e4 d=2000 k=50 theta=30", 50, (1.0, 4.0),
               lambda r: spiked(r, 20_000, 2000, 50, 30.0), params={"n": 20_000, "d": 2000})
    for loose in (10.0, 100.0):
        yield Cell("far below the bound", f"spiked n=2e4 d=200 k=5, bound {loose:g}x the "
                   "largest row", 5, (1.0, 4.0), lambda r: spiked(r, 20_000, 200, 5, 9.0),
                   row_norm=loose, params={"n": 20_000, "d": 200})
    yield Cell("far below the bound", "t3 rows n=1e5 d=200 k=5 theta=9", 5, (1.0, 4.0),
               lambda r: multivariate_t(r, 100_000, 200, 5, 9.0, 3.0),
               params={"n": 100_000, "d": 200})
    yield Cell("far below the bound", "log-normal row scale (sigma 1) n=1e5 d=200 k=5",
               5, (1.0, 4.0), lambda r: scale_mixture(r, 100_000, 200, 5, 9.0, 1.0),
               params={"n": 100_000, "d": 200})
    for scale in (0.3, 3.0):
        yield Cell("dependent rows", f"split rows, signal rows x{scale:g} n=1e5 d=300 k=5",
                   5, (1.0, 4.0), lambda r, s=scale: split_rows(r, 100_000, 300, 5, 9.0, s),
                   params={"n": 100_000, "d": 300})
    yield Cell("dependent rows", "5 clusters n=5e4 d=100 k=5 spread 1", 5, (1.0, 4.0),
               lambda r: clusters(r, 50_000, 100, 5, 1.0), params={"n": 50_000, "d": 100})
    for fraction in (0.1, 0.01):
        yield Cell("dependent rows", f"spike on {fraction:g} of rows n=1e5 d=400 k=5",
                   5, (1.0, 4.0), lambda r, f=fraction: spiked(r, 100_000, 400, 5, 9.0, f),
                   params={"n": 100_000, "d": 400})
    for name in ("digits", "fashion-mnist"):
        for center in (False, True):
            for k in (5, 10):
                yield Cell("real", f"{name} k={k}{' centered' if center else ''}", k,
                           (0.25, 0.5, 1.0, 2.0, 4.0), lambda r, nm=name: real(nm)[0],
                           row_norm=8.0 if name == "digits" else 28.0,
                           center=center, params={"data": name})


def _map_cells() -> Iterator[Cell]:
    """The spec's regime map (families 1 and 2; k = 5, theta = 9)."""
    for n in (20_000, 100_000):
        for d in (100, 400, 1500):
            for fraction in (1.0, 0.3, 0.1, 0.03):
                fam = 1 if fraction >= 1 else 2
                yield Cell("map", f"family {fam} f={fraction:g} n={n} d={d}", 5,
                           (0.5, 1.0, 4.0),
                           lambda r, n=n, d=d, f=fraction: spiked(r, n, d, 5, 9.0, f),
                           params={"n": n, "d": d, "fraction": fraction})


GROUPS = ("issue", "k sweep", "large d", "far below the bound", "dependent rows", "real", "map")


def cells(groups: list[str]) -> list[Cell]:
    out = [c for c in _cells() if c.group in groups]
    if "map" in groups:
        out += list(_map_cells())
    return out


# -- one cell ----------------------------------------------------------------------------------

def fit_all(rows: Any, S: np.ndarray, V: np.ndarray, k: int, eps: float, seed: int,
            methods: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Every method once on the same rows; sin-theta, captured variance, what auto chose."""
    fp = 1.0 + rows.rounding_slack()
    ref = float(np.trace(V.T @ S @ V))

    def stream() -> np.random.Generator:
        return np.random.default_rng([seed, round(eps * 1000)])

    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        t0 = time.perf_counter()
        info: dict[str, Any] = {}
        if m == "ag":
            z = plan_auto(eps, DELTA).noise_multipliers["z_pca"]
            X, _ = analyze_gauss(S, k, z * fp, stream())
        else:
            branch = {"auto": "rule", "auto_ag": "analyze_gauss", "auto_it": "iterate"}[m]
            z = plan_auto(eps, DELTA).noise_multipliers["z_pca"]
            res = fit_auto(rows, S, k, noise_multiplier=z, delta=DELTA, rng=stream(),
                           branch=branch)
            X = res.basis
            p = res.info["prediction"]
            info = {"branch": res.branch, "epsilon": res.epsilon,
                    "pred_ag": p["error_analyze_gauss"], "pred_it": p["error_iterate"],
                    "radius_factor": p["radius_factor"], "n_iter": res.info.get("n_iter", 0),
                    "row_scale": res.info.get("row_scale", 1.0), "reason": p["reason"]}
        out[m] = {"sin_theta": sin_theta(X, V), "captured": float(np.trace(X.T @ S @ X)) / ref,
                  "seconds": time.perf_counter() - t0, **info}
    return out


def done_keys(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {json.loads(line)["key"] for line in path.read_text().splitlines() if line.strip()}


def run(args: argparse.Namespace) -> None:
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    done = done_keys(out)
    print(f"# {ENV}", flush=True)
    for cell in cells(args.groups):
        if args.only and not any(s in cell.name for s in args.only):
            continue
        for seed in args.seeds:
            todo = [e for e in cell.eps if cell.key(e, seed) not in done]
            if not todo:
                continue
            t0 = time.perf_counter()
            rng = np.random.default_rng([zlib.crc32(cell.name.encode()), seed])
            X = cell.make(rng)
            rows = ClippedRows.from_data(X, cell.row_norm)
            if cell.center:  # a public mean (the exact one) in the units of the rows
                rows = rows.centered(X.mean(axis=0) / cell.row_norm)
            S = rows.gram()
            w, U = top_eigvecs(S, cell.k + 1)
            V = U[:, :cell.k].copy()
            n, d = X.shape
            norms = rows.norms
            stats = {"n": n, "d": d, "k": cell.k, "lam_k": float(w[cell.k - 1]),
                     "lam_k1": float(w[cell.k]) if cell.k < d else 0.0,
                     "median_row_norm": float(np.median(norms))}
            for eps in todo:
                res = fit_all(rows, S, V, cell.k, eps, seed, METHODS)
                rec = {"key": cell.key(eps, seed), "group": cell.group, "cell": cell.name,
                       "epsilon": eps, "seed": seed, **stats, "methods": res,
                       "environment": ENV}
                with open(out, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(rec) + "\n")
                a, g, it = res["auto"], res["ag"], res["auto_it"]
                print(f"{cell.group} | {cell.name} eps={eps:g} seed={seed}: AG "
                      f"{g['sin_theta']:.3f} auto {a['sin_theta']:.3f} [{a['branch']}, tau "
                      f"{a['row_scale']:.3g}] fAG {res['auto_ag']['sin_theta']:.3f} fIT "
                      f"{it['sin_theta']:.3f} | pred AG {a['pred_ag']:.3f} IT "
                      f"{a['pred_it']:.3f} | capt AG {g['captured']:.3f} auto "
                      f"{a['captured']:.3f} fIT {it['captured']:.3f}", flush=True)
            print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)


# -- report ------------------------------------------------------------------------------------

def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def verdict(recs: list[dict]) -> dict[str, Any]:
    """Medians over seeds, the ratio auto / AG, the worst seed and the targets."""
    med = {m: statistics.median(r["methods"][m]["sin_theta"] for r in recs) for m in METHODS}
    cap = {m: statistics.median(r["methods"][m]["captured"] for r in recs) for m in METHODS}
    ratios = [r["methods"]["auto"]["sin_theta"] / max(r["methods"]["ag"]["sin_theta"], 1e-300)
              for r in recs]
    ratio = med["auto"] / med["ag"] if med["ag"] > 0 else math.nan
    ok_loss = ratio <= MAX_LOSS
    gain_cell = med["auto_it"] * 2.0 <= med["ag"]
    capture = ((med["ag"] - med["auto"]) / (med["ag"] - med["auto_it"])
               if med["ag"] > med["auto_it"] else math.nan)
    ok_gain = (not gain_cell) or capture >= MIN_CAPTURE
    n_it = sum(r["methods"]["auto"]["branch"] == "iterate" for r in recs)
    return {"med": med, "cap": cap, "ratio": ratio, "worst": max(ratios), "ok": ok_loss and
            ok_gain, "gain_cell": gain_cell, "capture": capture, "n_it": n_it,
            "seeds": len(recs),
            "tau": statistics.median(r["methods"]["auto"].get("row_scale", 1.0) for r in recs)}


def report(args: argparse.Namespace) -> None:
    recs = load(args.out)
    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in recs:
        if r["seed"] in args.seeds:
            by[(r["group"], r["cell"], r["epsilon"])].append(r)
    lines = ["<!-- generated by benchmarks/pca_families.py report: do not edit by hand -->", ""]
    missed = []
    n_ok = 0
    for group in GROUPS:
        keys = [key for key in by if key[0] == group]
        if not keys:
            continue
        rows = []
        for key in sorted(keys, key=lambda t: (t[1], t[2])):
            v = verdict(by[key])
            n_ok += v["ok"]
            if not v["ok"]:
                missed.append(f"{group}: {key[1]}, eps = {key[2]:g}: ratio {v['ratio']:.3f}, "
                              f"capture {v['capture']:.2f}")
            med, cap = v["med"], v["cap"]
            rows.append([key[1], f"{key[2]:g}", v["seeds"], f"{med['ag']:.3f}",
                         f"**{med['auto']:.3f}**", f"{med['auto_ag']:.3f}",
                         f"{med['auto_it']:.3f}", f"{v['ratio']:.3f}", f"{v['worst']:.3f}",
                         f"{v['n_it']}/{v['seeds']}", f"{v['tau']:.3g}",
                         "-" if not v["gain_cell"] else f"{v['capture']:.2f}",
                         f"{cap['ag']:.3f} / {cap['auto']:.3f}",
                         "met" if v["ok"] else "**MISSED**"])
        header = ["cell", "eps", "seeds", "AG", "auto", "forced AG", "forced iter.",
                  "auto / AG", "worst seed", "iterated", "row scale", "gain captured",
                  "capt. var. AG / auto", "target"]
        lines += [f"### {group}", "", markdown_table(header, rows), ""]
    total = sum(1 for _ in by)
    lines.insert(2, f"{n_ok} of {total} cells meet the targets (median sin-theta over seeds "
                    f"{', '.join(map(str, args.seeds))}: auto / AG <= {MAX_LOSS}, and at least "
                    f"{MIN_CAPTURE:.0%} of the gain where the forced iteration halves AG's "
                    "error).\n")
    lines += ["### Missed targets", ""] + ([f"- {m}" for m in missed] or ["None."]) + [""]
    envs = sorted({r.get("environment", "") for r in recs if r.get("environment")})
    if envs:
        lines += ["Runs: " + "; ".join(envs) + ".", ""]
    block = "\n".join(lines)
    ratios = [verdict(v)["ratio"] for v in by.values()]
    gains = [verdict(v) for v in by.values()]
    gains = [g for g in gains if g["gain_cell"]]
    summary = (f"**Measured (seeds {', '.join(map(str, args.seeds))}, medians; tables "
               f"below).** {n_ok} of {total} cells meet issue 21's targets. auto / AG "
               f"between {min(ratios):.3f} and {max(ratios):.3f} over every cell (at most "
               f"{MAX_LOSS} asked); where the forced iteration halves AG's error "
               f"({len(gains)} cells) auto captures "
               + (f"{min(g['capture'] for g in gains):.2f}-{max(g['capture'] for g in gains):.2f}"
                  if gains else "-")
               + f" of the gain (at least {MIN_CAPTURE} asked).")
    text = args.doc.read_text()
    for (start, end), body in ((("<!-- families:start -->", "<!-- families:end -->"), block),
                               (("<!-- summary:start -->", "<!-- summary:end -->"), summary)):
        if start not in text:
            text = text.rstrip() + f"\n\n{start}\n{end}\n"
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{start}\n{body}\n{end}{tail}"
    args.doc.write_text(text)
    print(summary)
    print(block)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["run", "report"])
    p.add_argument("--groups", nargs="+", default=[g for g in GROUPS if g != "map"],
                   choices=GROUPS)
    p.add_argument("--only", nargs="*", help="only cells whose name contains one of these")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--doc", type=Path, default=DOC)
    args = p.parse_args()
    {"run": run, "report": report}[args.mode](args)


if __name__ == "__main__":
    main()
