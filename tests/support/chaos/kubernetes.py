"""The chaos harness (tests/support/chaos/harness.py) on kubernetes://: the daemon faults of every
backend, and faults of the control plane under the daemons (one real kube-apiserver on one
etcd, tests/support/kube_cluster.py). Every control-plane fault holds the cluster back
while it lasts, so a leader is owed from its heal.

| fault | what happens |
| --- | --- |
| ``apiserver_kill`` | SIGKILL kube-apiserver; started again after 0.2-2 s (healed once ready) |
| ``apiserver_stop`` | SIGSTOP kube-apiserver, SIGCONT as long as ``sigstop`` |
| ``apiserver_etcd_stop`` | SIGKILL the etcd under it; started again after 0.2-2 s |
| ``rbac_revoke`` | delete the daemons' RoleBinding (every request 403) for 0.2 s-2 ttl |
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

from tests.support.chaos.check import Fault
from tests.support.chaos.harness import Chaos
from tests.support.chaos.node import Node
from tests.support.chaos.settings import Settings
from tests.support.daemons import short_tempdir
from tests.support.kube_cluster import NAMESPACE, SERVICE_ACCOUNT, ControlPlane, role_binding

BINDING = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings"


class KubeChaos(Chaos):
    def __init__(self, settings: Settings, kube: ControlPlane | None = None) -> None:
        # The Lease carries the ttl rounded up, and client-go's rule reads it: allow for it.
        settings.slack += -settings.ttl % 1
        super().__init__(settings)
        self.kube = kube
        self.own_kube = kube is None

    async def _start(self) -> None:
        self.workdir = short_tempdir("chaos-")
        if self.kube is None:
            self.kube = await asyncio.to_thread(ControlPlane)
        config = self.kube.restricted.kubeconfig(os.path.join(self.workdir, "kubeconfig"))
        prefix = f"chaos{uuid.uuid4().hex[:8]}-"
        url = f"kubernetes:///{NAMESPACE}?lease-prefix={prefix}&kubeconfig={config}"
        for i in range(self.s.nodes):
            self.nodes.append(Node(self._daemon(f"node-{i}", url), None, self.obs, self.s))
        await self._launch()

    async def _heal_all(self) -> None:
        await self._control_plane_up()
        await super()._heal_all()

    async def _stop(self) -> None:
        await super()._stop()
        if self.kube is not None:
            if self.own_kube:
                await asyncio.to_thread(self.kube.cleanup)
            else:
                await self._control_plane_up()

    async def _control_plane_up(self) -> None:
        kube = self.kube
        assert kube is not None and kube.etcd is not None
        if kube.proc is not None and kube.proc.poll() is None:
            os.kill(kube.proc.pid, signal.SIGCONT)
        await asyncio.to_thread(kube.etcd.ensure_running)
        if kube.proc is None or kube.proc.poll() is not None:
            await asyncio.to_thread(kube.start_server)
        await asyncio.to_thread(kube.wait_ready)
        answer = await asyncio.to_thread(kube.admin.request, "GET", f"{BINDING}/{SERVICE_ACCOUNT}")
        if answer.status == 404:
            await asyncio.to_thread(kube.admin.ok, "POST", BINDING, role_binding())

    def _aimed(self, fault: Fault, target: str) -> None:
        fault.params["daemon"], fault.target, fault.target_role = fault.target, target, "-"

    async def _fault_apiserver_kill(self, fault: Fault) -> None:
        assert self.kube is not None
        self._aimed(fault, "kube-apiserver")
        await asyncio.to_thread(self.kube.kill_server)
        fault.params["restart_after_s"] = delay = round(self.rng.uniform(0.2, 2.0), 3)
        await asyncio.sleep(delay)
        await asyncio.to_thread(self.kube.start_server)
        await asyncio.to_thread(self.kube.wait_ready)
        fault.healed = time.monotonic()

    async def _fault_apiserver_stop(self, fault: Fault) -> None:
        assert self.kube is not None and self.kube.proc is not None
        self._aimed(fault, "kube-apiserver")
        fault.params["stopped_s"] = pause = round(self._pause(), 3)
        os.kill(self.kube.proc.pid, signal.SIGSTOP)
        await asyncio.sleep(pause)
        os.kill(self.kube.proc.pid, signal.SIGCONT)
        fault.healed = time.monotonic()

    async def _fault_apiserver_etcd_stop(self, fault: Fault) -> None:
        assert self.kube is not None and self.kube.etcd is not None
        etcd, member = self.kube.etcd, self.kube.etcd.members[0]
        self._aimed(fault, "etcd")
        await asyncio.to_thread(etcd.kill, member)
        fault.params["restart_after_s"] = delay = round(self.rng.uniform(0.2, 2.0), 3)
        await asyncio.sleep(delay)
        await asyncio.to_thread(etcd.start, member)
        await asyncio.to_thread(self.kube.wait_ready)
        fault.healed = time.monotonic()

    async def _fault_rbac_revoke(self, fault: Fault) -> None:
        assert self.kube is not None
        admin = self.kube.admin
        self._aimed(fault, "rbac")
        await asyncio.to_thread(admin.ok, "DELETE", f"{BINDING}/{SERVICE_ACCOUNT}")
        fault.params["held_s"] = hold = round(self.rng.uniform(0.2, 2 * self.s.ttl), 3)
        await asyncio.sleep(hold)
        await asyncio.to_thread(admin.ok, "POST", BINDING, role_binding())
        fault.healed = time.monotonic()
