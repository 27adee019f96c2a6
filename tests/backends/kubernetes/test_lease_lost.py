"""A leader whose Lease is deleted by hand, or written by another holder, hears it from the
watch and steps down at once (LeaseLost), without waiting for its deadline."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from leaderd.backends import backend_from_url
from leaderd.backends.base import Candidate, LeaseLost
from tests.support.backend_calls import ask
from tests.support.kube_cluster import NAMESPACE, ControlPlane
from tests.support.kube_electors import LEASES

pytestmark = pytest.mark.kubernetes


async def test_a_deleted_lease_is_lost_at_once(kube: ControlPlane, tmp_path: Path) -> None:
    kubeconfig = kube.restricted.kubeconfig(str(tmp_path / "kubeconfig"))
    prefix = f"x{uuid.uuid4().hex[:8]}-"
    backend = backend_from_url(
        f"kubernetes:///{NAMESPACE}?lease-prefix={prefix}&kubeconfig={kubeconfig}"
    )
    await backend.open(["default"])
    try:
        me = Candidate("node-a")
        first = await ask(backend, "default", me, 60.0, timeout=10.0)
        assert first.held_by(me)
        await backend.wait_for_change("default", 0.5)  # nothing is news: returns quietly
        kube.admin.ok("DELETE", f"{LEASES}/{prefix}default")
        with pytest.raises(LeaseLost, match="deleted"):
            for _ in range(50):
                await backend.wait_for_change("default", 0.2)
        again = await ask(backend, "default", me, 60.0, timeout=10.0)
        assert again.held_by(me) and again.term > first.term
    finally:
        await backend.close()
