"""The one line-figure function: a series keeps its colour across panels."""

from __future__ import annotations

from pathlib import Path


def test_series_keep_one_colour_across_panels(tmp_path: Path, monkeypatch) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.figure

    from dpprecond.plots import line_figure

    seen: dict[str, set] = {}
    legend_names: list[str] = []
    original_plot = matplotlib.axes.Axes.plot
    original_legend = matplotlib.figure.Figure.legend

    def plot(self, *args, **kwargs):
        seen.setdefault(kwargs["label"], set()).add(kwargs["color"])
        return original_plot(self, *args, **kwargs)

    def legend(self, handles, labels, **kwargs):
        legend_names.extend(labels)
        return original_legend(self, handles, labels, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    monkeypatch.setattr(matplotlib.figure.Figure, "legend", legend)
    panels = {"first": {"a": ([1, 2], [0.1, 0.2], None), "c": ([1, 2], [0.3, 0.1], None)},
              "second": {"b": ([1, 2], [0.5, 0.6], [0.1, 0.1]),
                         "c": ([1, 2], [0.2, 0.4], None)}}
    out = line_figure(panels, tmp_path / "f.png", xlabel="x", ylabel="y")
    assert out.stat().st_size > 1000
    assert all(len(colours) == 1 for colours in seen.values())  # one colour per name
    assert len({next(iter(c)) for c in seen.values()}) == 3  # three names, three colours
    assert legend_names == ["a", "c", "b"]  # every name, also those missing in panel 1
