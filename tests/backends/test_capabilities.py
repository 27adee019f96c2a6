"""Each backend declares what it can do once, on its class, with the reason for each
capability it lacks; the contract registry (conftest.py) skips by that declaration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leaderd.backends import backend_from_url
from leaderd.backends.base import Capabilities, Capability

# One URL per scheme family, built (never opened): no server is needed.
URLS = {
    "sqlite:///tmp/leaderd-capabilities.db": {Capability.GRANTS, Capability.RESERVES},
    "static://": set(),
    "postgresql://user@localhost/db": {Capability.GRANTS, Capability.TAKEOVER},
    "postgresql+advisory://user@localhost/db": {Capability.TAKEOVER, Capability.RESERVES},
    "etcd://localhost:2379": {Capability.GRANTS, Capability.EXPIRES},
}


@pytest.mark.parametrize("url", sorted(URLS))
def test_capabilities_are_declared_with_a_reason_for_each_one_lacking(url: str) -> None:
    capabilities = backend_from_url(url).capabilities
    assert isinstance(capabilities, Capabilities)
    assert URLS[url] <= capabilities
    assert set(capabilities) | set(capabilities.lacks) == set(Capability)
    assert all(reason.strip() for reason in capabilities.lacks.values())


def test_settings_narrow_an_instance_not_its_class() -> None:
    immediate = backend_from_url("postgresql+advisory://user@localhost/db?takeover=immediate")
    wait = backend_from_url("postgresql+advisory://user@localhost/db")
    assert Capability.TAKEOVER not in immediate.capabilities
    assert Capability.TAKEOVER in wait.capabilities
    assert Capability.DURABLE in backend_from_url("static:///tmp/leaderd-terms.json").capabilities
    assert Capability.DURABLE not in backend_from_url("static://").capabilities


def test_kubernetes_declares_what_no_server_clock_allows(tmp_path: Path) -> None:
    """No server clock judges a Lease: its expiry is the takeover rule on the daemon's own
    clock, so it neither reports a ttl left nor reserves nor grants (docs/kubernetes.md)."""
    config = {
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    url = f"kubernetes:///ns?kubeconfig={tmp_path / 'kubeconfig'}"
    capabilities = backend_from_url(url).capabilities
    assert set(capabilities.lacks) == {Capability.TTL_LEFT, Capability.RESERVES, Capability.GRANTS}
    assert {Capability.EXPIRES, Capability.TAKEOVER, Capability.DURABLE} <= capabilities
    assert all(reason.strip() for reason in capabilities.lacks.values())
