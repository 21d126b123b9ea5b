"""A source checkout that shadows the installed package is named as such, not taken for a missing extra."""

from __future__ import annotations

from pathlib import Path

from contextrender.extras import missing_extra, shadowing_checkout


def _checkout(root: Path) -> Path:
    (root / "contextrender").mkdir(parents=True)
    (root / "contextrender" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text("[project]\nname = 'contextrender'\n")
    # what a plain `pip install .` leaves in the checkout, and what metadata lookups find first from its root
    (root / "contextrender.egg-info").mkdir()
    (root / "contextrender.egg-info" / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: contextrender\n")
    return root / "contextrender"


def _installed(site: Path) -> Path:
    (site / "contextrender").mkdir(parents=True)
    (site / "contextrender" / "__init__.py").write_text("")
    return site


def test_a_checkout_ahead_of_an_installed_copy_is_found(tmp_path):
    package = _checkout(tmp_path / "checkout")
    site = _installed(tmp_path / "site-packages")
    assert shadowing_checkout(package, ["", str(tmp_path / "checkout"), str(site)]) == (tmp_path / "checkout").resolve()


def test_an_editable_install_or_a_lone_checkout_is_not_shadowing(tmp_path):
    package = _checkout(tmp_path / "checkout")
    assert shadowing_checkout(package, [str(tmp_path / "checkout"), str(tmp_path / "nothing-here")]) is None
    # an installed package (no pyproject.toml beside it) never shadows anything
    site = _installed(tmp_path / "site-packages")
    assert shadowing_checkout(site / "contextrender", [str(site), str(package.parent)]) is None


def test_this_process_is_not_shadowed_and_the_message_names_the_extra():
    # the test suite runs on an editable install: one copy, so a missing module is an extra's
    assert shadowing_checkout() is None
    err = ModuleNotFoundError("No module named 'hydra'", name="hydra")
    assert missing_extra(err, "replay").startswith("replay needs the [service] extra (module 'hydra' is not installed)")
