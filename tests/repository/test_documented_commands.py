"""Every `leaderd` command line in the README, docs/ and examples/ uses a command and
options that exist (as `--help` lists them): documentation that cannot drift silently."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from leaderd.startup import cli

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                    *(ROOT / "examples").rglob("*.md"),
                    *(ROOT / "examples").rglob("*.sh")])  # fmt: skip
# What starts a new command on a shell line (`kubectl exec ... -- leaderd status` too).
_SEGMENT = re.compile(r"&&|\|\||;|\||\$\(|\(|`| -- ")
_PREFIXES = ("$", "!", "if", "then", "sudo", "exec", "time", "while", "until")


def options() -> dict[str, set[str]]:
    parser = cli._parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    top = {flag for a in parser._actions for flag in a.option_strings}
    return {name: top | {f for a in p._actions for f in a.option_strings}
            for name, p in sub.choices.items()}  # fmt: skip


def shell_lines(path: Path) -> list[str]:
    text = path.read_text()
    if path.suffix == ".sh":
        return text.splitlines()
    blocks = re.findall(r"```(?:sh|bash|console|shell)\n(.*?)```", text, re.S)
    return [line for block in blocks for line in block.splitlines()]


def invocations(line: str) -> list[list[str]]:
    """The words of each `leaderd ...` command on the line, up to `--` or a comment."""
    found = []
    for segment in _SEGMENT.split(line.split(" # ")[0]):
        words = segment.split()
        while words and words[0] in _PREFIXES:
            words = words[1:]
        if words and (words[0] == "leaderd" or words[0].endswith("/leaderd")):
            found.append(words[1:])
    return found


def test_documented_command_lines_use_real_commands_and_options() -> None:
    known = options()
    wrong = []
    for path in DOCUMENTS:
        for line in shell_lines(path):
            for words in invocations(line):
                command = words[0] if words and words[0] in known else "run"
                flags = {w.split("=")[0] for w in words if w.startswith("-") and w != "-"}
                wrong += [f"{path.relative_to(ROOT)}: {flag} ({line.strip()})"
                          for flag in sorted(flags - known[command])]  # fmt: skip
    assert not wrong, "\n".join(wrong)


def test_the_check_finds_a_made_up_option() -> None:
    assert invocations("leaderd status --jsn && leaderd resign --to b") == [
        ["status", "--jsn"], ["resign", "--to", "b"]]  # fmt: skip
    assert "--jsn" not in options()["status"]
    assert invocations("kubectl exec pod -c leaderd -- leaderd status") == [["status"]]
    assert invocations("journalctl -u leaderd -o verbose") == []
