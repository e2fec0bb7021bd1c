"""One version everywhere: the package, pyproject.toml, the chart's appVersion (the image's tag) and `--version`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

import cozygpu
from cozygpu import cli

REPO = Path(__file__).resolve().parents[2]


def test_the_package_pyproject_and_chart_app_version_agree() -> None:
    """cozygpu.__version__ == pyproject's version == Chart.yaml's appVersion, so the chart pulls the image built."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((REPO / "charts" / "cozy-gpu-operator" / "Chart.yaml").read_text())["appVersion"]
    assert cozygpu.__version__ == pyproject == chart


def test_version_flag_prints_the_bare_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`cozygpu --version` prints __version__ alone, the string the image's build and tests compare."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"{cozygpu.__version__}\n"
