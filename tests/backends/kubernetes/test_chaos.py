"""A short chaos run on kubernetes://: one deck (every fault kind once, daemon and control
plane alike: tests/support/chaos/kubernetes.py) on the session's control plane, zero violations."""

from __future__ import annotations

import asyncio

import pytest

from tests.chaos.test_chaos import CAP, TIMEOUT, assert_every_kind_injected, summary
from tests.support.chaos.kubernetes import KubeChaos
from tests.support.chaos.settings import Settings
from tests.support.kube_cluster import ControlPlane


@pytest.mark.chaos
@pytest.mark.kubernetes
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_kubernetes_survives_chaos(kube: ControlPlane) -> None:
    settings = Settings(backend="kubernetes", nodes=3, duration=CAP, decks=1)
    result = asyncio.run(KubeChaos(settings, kube).run())
    assert_every_kind_injected(result)
    assert result.violations.total == 0, summary(result)
