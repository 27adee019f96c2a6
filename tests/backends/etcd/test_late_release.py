"""A release held until after the next renewal, on etcd (tests/support/held_release.py):
node-a talks to one member's gateway through the proxy, which holds its release (or grant)
transaction. A keepalive does not move the key's mod revision, which that transaction
compares, so only the engine's rule keeps it harmless: no leading again on a term whose
release is in doubt."""

from __future__ import annotations

import uuid

import pytest

from leaderd.backends.etcd.gateway import b64
from tests.support.etcd_cluster import EtcdCluster
from tests.support.held_release import RESIGNS, leader_behind_a_proxy, resign_with_the_release_held

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("resign", RESIGNS)
def test_a_release_held_until_after_the_next_renewal_leaves_one_leader(
    etcd: EtcdCluster, resign: str
) -> None:
    prefix = f"/leaderd-test/{uuid.uuid4().hex[:10]}/"
    member = etcd.members[0]
    url = etcd.url(prefix=prefix, members=[member])
    host, port = member.hostport.rsplit(":", 1)
    rewrite = (member.hostport, host + ":{port}")
    # Only a release or a grant compares the leader key's mod revision.
    release = f'"key":"{b64(prefix + "default/leader")}","target":"MOD"'.encode()
    with leader_behind_a_proxy(url, (host, int(port)), rewrite) as (proxied, a, b):
        resign_with_the_release_held(proxied, a, b, release, resign)
