"""Tables and figures of the PCA regime map from ``pca_regime.py``'s JSON lines.

    .venv/bin/python benchmarks/pca_regime_report.py benchmarks/out/pca_regime.jsonl \
        --md docs/pca_regime_tables.md --fig-dir docs/figures

Writes a markdown table (median sin-theta over seeds per cell and method, the ratio
select / Analyze Gauss, measured coherence) and two figures: sin-theta against d and
against the measured rank-k coherence.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table
from dpprecond.plots import line_figure

#: ``auto`` is the default (docs/pca_auto.md); the others as in docs/pca_regime.md.
METHODS = ("auto", "analyze_gauss", "power", "fixed", "oracle", "select")


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cells(records: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        out[(r["family"], r["fraction"], r["n"], r["d"], r["epsilon"])].append(r)
    return dict(sorted(out.items()))


def table(records: list[dict]) -> str:
    rows = []
    for (family, frac, n, d, eps), rs in cells(records).items():
        med = {m: statistics.median(r["sin_theta"].get(m, float("nan")) for r in rs)
               for m in METHODS}
        coh = statistics.median(r["rank_k_coherence"] for r in rs)
        ratio = med["select"] / med["analyze_gauss"] if med["analyze_gauss"] > 0 else float("nan")
        best = min((m for m in METHODS if m != "oracle"), key=lambda m: med[m])
        rows.append([family, frac, n, d, eps, len(rs), round(coh, 4)]
                    + [f"**{med[m]:.3f}**" if m == best else f"{med[m]:.3f}" for m in METHODS]
                    + [f"{ratio:.2f}"])
    header = ["family", "f", "n", "d", "eps", "seeds", "rank-k coh.", *list(METHODS), "select / AG"]
    return markdown_table(header, rows)


def figures(records: list[dict], fig_dir: Path) -> list[Path]:
    by = cells(records)
    panels_d: dict[str, dict] = defaultdict(dict)
    for (family, frac, n, _d, eps), _ in by.items():
        title = f"family {family} (f={frac:g}), n={n}, eps={eps:g}"
        if title in panels_d:
            continue
        ds = sorted({key[3] for key in by if key[:3] == (family, frac, n) and key[4] == eps})
        for m in METHODS:
            ys = [statistics.median(r["sin_theta"][m] for r in by[(family, frac, n, d, eps)])
                  for d in ds]
            panels_d[title][m] = (ds, ys, None)
    paths = [line_figure(panels_d, fig_dir / "pca_regime_vs_d.png", xlabel="d",
                         ylabel="sin-theta (median over seeds)", logx=True)]
    panels_c: dict[str, dict] = defaultdict(dict)
    for (_family, _frac, n, d, eps), rs in by.items():
        title = f"n={n}, d={d}, eps={eps:g}"
        for m in METHODS:
            x, y, _ = panels_c[title].get(m, ([], [], None))
            x = [*x, statistics.median(r["rank_k_coherence"] for r in rs)]
            y = [*y, statistics.median(r["sin_theta"][m] for r in rs)]
            order = sorted(range(len(x)), key=lambda i: x[i])
            panels_c[title][m] = ([x[i] for i in order], [y[i] for i in order], None)
    paths.append(line_figure(panels_c, fig_dir / "pca_regime_vs_coherence.png",
                             xlabel="measured rank-k coherence", ylabel="sin-theta", logx=True))
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--md", type=Path)
    p.add_argument("--fig-dir", type=Path, default=Path("docs/figures"))
    args = p.parse_args()
    records = load(args.results)
    text = table(records)
    print(text)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text + "\n")
    for path in figures(records, args.fig_dir):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
