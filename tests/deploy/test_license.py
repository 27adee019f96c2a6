"""The licence every artefact names (pyproject, image label, Debian copyright) ships as a
LICENSE file: the image said Apache-2.0 and the checkout had no licence text."""

from __future__ import annotations

import tomllib

import pytest

from ._tools import ROOT

pytestmark = pytest.mark.deploy


def test_license_file_is_the_one_the_artefacts_name() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "END OF TERMS AND CONDITIONS" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "Dockerfile").read_text()
    assert "License: Apache-2.0" in (ROOT / "packaging/debian/copyright").read_text()
