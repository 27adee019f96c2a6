"""A Kubernetes label as ``--label-pod`` takes it: KEY=VALUE, checked as the API server would
(so a typo is exit 2 at start-up, not a refused patch while leading)."""

from __future__ import annotations

import re

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}$")
_VALUE = re.compile(rf"^({_NAME})?$")


def parse_label(text: str) -> tuple[str, str]:
    """(key, value) of KEY=VALUE; ValueError saying why it is not a label."""
    key, sep, value = text.partition("=")
    if not sep or not _KEY.match(key) or not _VALUE.match(value):
        raise ValueError(
            f"{text!r} is no KEY=VALUE label (KEY: [prefix/]name of letters, digits, '-', '_' "
            "and '.'; VALUE: at most 63 of them)"
        )
    return key, value
