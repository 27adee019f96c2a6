"""A short chaos run on kubernetes://: one deck (every fault kind once, daemon and control
plane alike: tests/backends/kubernetes/chaos.py) on the session's control plane, zero violations."""

from __future__ import annotations

import asyncio

import pytest

from tests.backends.kubernetes.chaos import KubeChaos
from tests.backends.kubernetes.cluster import ControlPlane
from tests.chaos.harness import Settings
from tests.chaos.test_chaos import CAP, TIMEOUT, assert_every_kind_injected, summary


@pytest.mark.chaos
@pytest.mark.kubernetes
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_kubernetes_survives_chaos(kube: ControlPlane) -> None:
    settings = Settings(backend="kubernetes", nodes=3, duration=CAP, decks=1)
    result = asyncio.run(KubeChaos(settings, kube).run())
    assert_every_kind_injected(result)
    assert result.violations.total == 0, summary(result)
