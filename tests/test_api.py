"""The top-level API: every name of ``dpprecond.__all__`` imports, and stays cheap."""

from __future__ import annotations

import subprocess
import sys

import dpprecond


def test_every_public_name_imports() -> None:
    for name in dpprecond.__all__:
        assert getattr(dpprecond, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from dpprecond import *", namespace)
    assert set(dpprecond.__all__) <= set(namespace)
    assert set(dpprecond.__all__) <= set(dir(dpprecond))


def test_the_names_are_the_defining_modules_objects() -> None:
    from dpprecond.accounting import PrivacyLedger
    from dpprecond.fl import FLConfig, run_federated, simulate
    from dpprecond.pca import fit_private_pca
    from dpprecond.pca.estimator import PrivatePCA
    from dpprecond.pipeline import run_pipeline

    assert dpprecond.PrivacyLedger is PrivacyLedger
    assert dpprecond.PrivatePCA is PrivatePCA
    assert dpprecond.fit_private_pca is fit_private_pca
    assert dpprecond.FLConfig is FLConfig
    assert dpprecond.run_federated is run_federated
    assert dpprecond.simulate is simulate
    assert dpprecond.run_pipeline is run_pipeline


def test_unknown_names_raise_attribute_error() -> None:
    try:
        dpprecond.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_import_dpprecond_stays_cheap() -> None:
    code = ("import sys, dpprecond\n"
            "heavy = [m for m in ('sklearn', 'torch', 'dask', 'flwr') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_readme_names_only_public_top_level_names() -> None:
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"\bdpprecond\.([A-Z]\w*)", readme))
    named |= {n.strip() for line in re.findall(r"from dpprecond import ([\w, ]+)", readme)
              for n in line.split(",")}
    assert named and named <= set(dpprecond.__all__), named - set(dpprecond.__all__)
