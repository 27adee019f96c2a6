"""Shell completion for bash and zsh, generated from the parser (so it cannot drift from
--help) and tried in the real shells; the Debian package installs both files."""

from __future__ import annotations

import importlib.util
import shlex
from types import ModuleType

import pytest

from ._tools import ROOT, require, run

pytestmark = pytest.mark.deploy

BASH = ROOT / "packaging" / "completion" / "bash" / "leaderd"
ZSH = ROOT / "packaging" / "completion" / "zsh" / "_leaderd"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "completion", ROOT / "packaging" / "completion.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_completion_files_are_generated_from_the_parser() -> None:
    completion = generator()
    assert BASH.read_text() == completion.bash(), "run: python packaging/completion.py"
    assert ZSH.read_text() == completion.zsh(), "run: python packaging/completion.py"


def bash_complete(line: str) -> list[str]:
    """What bash offers for the last word of ``line`` (a trailing space: a new word)."""
    words = shlex.split(line) + ([""] if line.endswith(" ") else [])
    script = (
        f"source {shlex.quote(str(BASH))}; COMP_WORDS=({shlex.join(words)}); "
        f"COMP_CWORD={len(words) - 1}; _leaderd; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    done = run([require("bash"), "--norc", "-c", script])
    return done.stdout.split()


@pytest.mark.parametrize(
    ("line", "offered"),
    [
        ("leaderd sta", ["status"]),
        ("leaderd status --ti", ["--timeout"]),
        ("leaderd run --exit", ["--exit-status"]),
        ("leaderd run --on-exit r", ["release", "restart"]),
        ("leaderd resign --t", ["--timeout", "--to"]),
        ("leaderd run -- sle", []),  # the COMMAND's words are not leaderd's
    ],
)
def test_bash_completes_commands_options_and_choices(line: str, offered: list[str]) -> None:
    assert bash_complete(line) == offered


def test_zsh_loads_the_completion() -> None:
    zsh = require("zsh")
    run([zsh, "-n", ZSH])
    script = (f"fpath=({ZSH.parent} $fpath); autoload -U compinit; compinit -u -D; "
              "print -r -- $_comps[leaderd]")  # fmt: skip
    done = run([zsh, "-f", "-c", script])
    assert done.stdout.strip() == "_leaderd"
