"""The figures the federated commands write (``dpprecond fl``, ``dpprecond fl --tune``).

Shared by :mod:`dpprecond.cli.fl` and :mod:`dpprecond.cli.fl_tune`, so that neither
imports the other's helpers (``fl`` dispatches to ``fl_tune``, one way).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_history"]


def plot_history(histories: dict[str, list[dict[str, float]]], path: Path,
                 title: str = "") -> None:
    """Test accuracy against round for one or several runs (matplotlib Agg, PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, hist in histories.items():
        ax.plot([h["round"] for h in hist], [h["test_accuracy"] for h in hist], label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
