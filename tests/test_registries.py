"""The registries are the single source of names: CLI choices, schemas and docs follow them.

PCA methods: :data:`dpprecond.pca.methods.METHODS`; accountants:
:data:`dpprecond.accounting.ACCOUNTANTS` and ``DEFAULT_ACCOUNTANT``; FL mechanisms:
``dpprecond.fl.config.MECHANISMS``.
"""

from __future__ import annotations

import argparse
import inspect
import re
import typing
from pathlib import Path

import pytest

from dpprecond.accounting import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    Accountant,
    AccountantName,
    epsilon_of,
    resolve_accountant,
)
from dpprecond.cli import build_parser
from dpprecond.experiments.config import ExperimentConfig
from dpprecond.experiments.schema import DataTable, PrivacyTable
from dpprecond.fl import FLConfig
from dpprecond.fl.config import MECHANISMS
from dpprecond.pca.methods import (
    FEDERATED_METHODS,
    METHODS,
    PIPELINE_METHODS,
    PRIVATE_METHODS,
)
from dpprecond.pipeline import PCA_METHODS, run_pipeline

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _choices(parser: argparse.ArgumentParser, command: str, flag: str) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if flag in a.option_strings)
    return list(action.choices or [])


def _default(parser: argparse.ArgumentParser, command: str, flag: str) -> object:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in sub.choices[command]._actions if flag in a.option_strings).default


def _first_column(doc: str, header: str) -> list[str]:
    """The first-column names (between backticks, quotes stripped) of the table whose
    header row starts with ``header``."""
    lines = (DOCS / doc).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    names = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        names.append(re.search(r"`([^`]+)`", line.split("|")[1]).group(1).strip('"'))  # type: ignore[union-attr]
    return names


def test_pca_method_lists_come_from_the_registry() -> None:
    assert PRIVATE_METHODS == tuple(n for n in METHODS if METHODS[n].private)
    assert set(PIPELINE_METHODS) <= set(FEDERATED_METHODS) <= set(METHODS)
    assert PCA_METHODS == PIPELINE_METHODS
    parser = build_parser()
    assert _choices(parser, "pca", "--method") == [*PRIVATE_METHODS, "all"]
    assert _choices(parser, "fl", "--pca-method") == list(PIPELINE_METHODS)


def test_the_experiment_schema_takes_the_pipeline_methods() -> None:
    for name in PIPELINE_METHODS:
        assert DataTable(name="digits", pca_method=name).pca_method == name
    for name in set(METHODS) - set(PIPELINE_METHODS):
        with pytest.raises(ValueError, match="pca_method"):
            DataTable(name="digits", pca_method=name)


def test_accountant_names_come_from_the_registry() -> None:
    assert set(typing.get_args(AccountantName)) == {*ACCOUNTANTS, "auto"}
    assert typing.get_args(Accountant) == ACCOUNTANTS
    assert typing.get_type_hints(run_pipeline)["accountant"] == Accountant
    parser = build_parser()
    assert _choices(parser, "fl", "--accountant") == list(ACCOUNTANTS)
    assert set(typing.get_args(PrivacyTable.model_fields["accountant"].annotation)) == set(
        ACCOUNTANTS)
    assert set(typing.get_args(typing.get_type_hints(FLConfig)["accountant"])) == set(
        ACCOUNTANTS)


def test_one_default_accountant_at_every_entry_point() -> None:
    assert DEFAULT_ACCOUNTANT in ACCOUNTANTS
    assert _default(build_parser(), "fl", "--accountant") == DEFAULT_ACCOUNTANT
    assert FLConfig(n_rounds=1, noise_multiplier=0.0).accountant == DEFAULT_ACCOUNTANT
    assert inspect.signature(run_pipeline).parameters["accountant"].default == \
        DEFAULT_ACCOUNTANT
    assert PrivacyTable().accountant == DEFAULT_ACCOUNTANT
    assert ExperimentConfig.__dataclass_fields__["accountant"].default == DEFAULT_ACCOUNTANT
    for name, method in METHODS.items():
        if "accountant" in method.defaults:  # select needs RDP (repeat-and-select)
            expected = "rdp" if name == "select" else DEFAULT_ACCOUNTANT
            assert method.defaults["accountant"] == expected, name


@pytest.mark.parametrize("name", [n for n in METHODS if METHODS[n].private])
def test_method_defaults_are_the_ledgers_auto_choice(name: str) -> None:
    """Each PCA method's default accountant is what ``auto`` picks for its events, so the
    method epsilons and the ledger's agree (no epsilon depends on which default applies)."""
    method = METHODS[name]
    opts = method.options({})
    event = method.plan(1.0, 1e-5, opts, None).event
    kind = resolve_accountant(event, "auto")
    assert kind == opts.get("accountant", "pld")
    assert epsilon_of(event, 1e-5, kind) == epsilon_of(event, 1e-5, "auto")


def test_docs_tables_list_the_registries() -> None:
    assert _first_column("pca.md", "| method | what it does") == list(METHODS)
    assert _first_column("fl.md", "| `mechanism` |") == list(MECHANISMS)
    assert _first_column("privacy.md", "| accountant | what it composes") == [
        *ACCOUNTANTS, "auto"]


def test_trust_models_come_from_the_registry() -> None:
    from dpprecond.pca.federated import TRUST_MODELS, TrustModel

    assert typing.get_args(TrustModel) == TRUST_MODELS
    assert _choices(build_parser(), "fl", "--trust") == list(TRUST_MODELS)
    assert typing.get_type_hints(DataTable)["trust"] == TrustModel
