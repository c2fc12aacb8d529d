"""The set-up prints no setuptools deprecation: ``project.license`` is an SPDX string (PEP 639), not
the TOML table setuptools 77+ warns about ("By 2027-Feb-18, you need to update your project"), and
the build asks for a setuptools that reads it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_license_is_an_spdx_expression_that_the_build_backend_reads():
    data = tomllib.loads(PYPROJECT.read_text())
    assert data["project"]["license"] == "MIT"
    assert not any(c.startswith("License ::") for c in data["project"].get("classifiers", ()))  # PEP 639 forbids both
    (setuptools,) = [r for r in data["build-system"]["requires"] if r.startswith("setuptools")]
    assert int(re.search(r">=(\d+)", setuptools).group(1)) >= 77
