"""client-go's own leader election (tests/backends/kubernetes/elector) runs against the test control
plane: two electors on one Lease, exactly one leads, and SIGTERM hands the Lease over."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kube_cluster import ControlPlane
from tests.support.kube_electors import Elector, holder

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow]


def test_one_leads_and_sigterm_hands_over(
    kube: ControlPlane, electors: list[Elector], tmp_path: Path
) -> None:
    a, b = (Elector(kube, "client-go", name, tmp_path) for name in ("elector-a", "elector-b"))
    electors += [a, b]
    # Both see the same holder, and only that one says it leads.
    seen = {a.wait_line("leader "), b.wait_line("leader ")}
    assert len(seen) == 1
    leader, standby = (a, b) if seen == {"leader elector-a"} else (b, a)
    leader.wait_line("leading")
    assert "leading" not in standby.lines
    assert holder(kube, "client-go") == (leader.identity, 0)

    # The Lease lasts 600 s: the standby can lead within the wait only if SIGTERM released it.
    leader.terminate()
    assert leader.wait_exit() == 0
    assert leader.lines[-1] == "stopped"
    standby.wait_line("leading")
    assert holder(kube, "client-go") == (standby.identity, 1)
