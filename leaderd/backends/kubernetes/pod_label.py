"""``--label-pod KEY=VALUE``: the leader's pod carries the label while it leads, so that a
Service selecting it sends traffic to the leader alone (docs/kubernetes.md, "A label that
routes a Service to the leader").

* Set when this daemon leads, and patched again every renewal interval while it does
  (reconciled: a label someone removed comes back).
* Removed when it steps down: at the hand-over's step-down hook, before the release (rule 7's
  order), and as soon as leadership ends any other way. On a backend outage it is removed
  once less than one renewal interval is left before the self-fence deadline, not at it.
* A daemon that starts, or follows, removes it (a predecessor in the same pod may have died
  leading). Every patch is a JSON merge patch of metadata.labels alone.

The pod is $POD_NAME (the downward API), else the host name, which Kubernetes sets to the
pod's name; its namespace is $POD_NAMESPACE, else the credentials' namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from ..base import BackendError
from .config import KubeSettings
from .transport import KubeClient

log = logging.getLogger("leaderd.kubernetes.label")

StepDownHook = Callable[[str], Awaitable[None]]


class Leading(Protocol):
    """What the label follows: one election of this daemon (engine.Election)."""

    step_down_hook: StepDownHook | None

    def lease_left(self) -> float | None: ...

    def add_listener(self, listener: Callable[[Any], None]) -> None: ...


class PodLabel:
    def __init__(
        self,
        settings: KubeSettings,
        label: tuple[str, str],
        renew_interval: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.pod = env.get("POD_NAME") or socket.gethostname()
        namespace = env.get("POD_NAMESPACE") or settings.namespace
        self._path = f"/api/v1/namespaces/{namespace}/pods/{self.pod}"
        self._client = KubeClient(settings)
        self.key, self.value = label
        self._every = renew_interval
        self._applied: bool | None = None  # what the pod carries as far as we know
        self._changed = asyncio.Event()
        self._lock = asyncio.Lock()

    def follow(self, election: Leading) -> None:
        """Wake on every change of the election's status; remove the label at step-down,
        after any step-down hook already set (the supervised command's), before the release."""
        election.add_listener(lambda _status: self._changed.set())
        before = election.step_down_hook

        async def step_down(name: str) -> None:
            if before is not None:
                await before(name)
            await self.apply(False)

        election.step_down_hook = step_down

    async def run(self, election: Leading) -> None:
        """Reconcile until cancelled: the label matches leadership, at every renewal interval
        and at every change."""
        while True:
            self._changed.clear()  # a change while patching wakes the next turn at once
            if self._leading(election) or self._applied is not False:
                await self.apply(self._leading(election))
            left = election.lease_left()
            wait = self._every if left is None else min(self._every, left - self._every)
            if self._applied is None:
                wait = min(wait, 1.0)  # a patch failed: try again soon
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(0.01, wait))

    def _leading(self, election: Leading) -> bool:
        """Leading with more than one renewal interval left: on an outage the label goes
        that long before the self-fence deadline."""
        left = election.lease_left()
        return left is not None and left > self._every

    async def apply(self, leading: bool) -> None:
        """Patch the label on (or off) the pod; a failure is logged once, tried again."""
        body = {"metadata": {"labels": {self.key: self.value if leading else None}}}
        async with self._lock:
            try:
                answer = await self._client.request("PATCH", self._path, self._every, body, True)
            except BackendError as exc:
                if self._applied is not None:
                    log.warning(
                        "cannot %s the label %s on pod %s: %s",
                        "set" if leading else "remove",
                        self.key,
                        self.pod,
                        exc,
                    )
                self._applied = None
                return
            if answer.status == 404:
                log.warning(
                    "pod %s not found: no label to %s", self.pod, "set" if leading else "remove"
                )
                self._applied = None
                return
            if self._applied is not leading:
                log.info(
                    "pod %s: label %s=%s %s",
                    self.pod,
                    self.key,
                    self.value,
                    "set: this daemon leads" if leading else "removed",
                )
            self._applied = leading

    async def close(self) -> None:
        await self._client.close()


async def label_pod(backend_url: str, label: tuple[str, str], election: Any) -> None:
    """Keep this pod's label matching the election's leadership until cancelled. The
    credentials are the kubernetes:// backend's, else the pod's service account (or
    $KUBECONFIG)."""
    url = backend_url if backend_url.startswith("kubernetes:") else "kubernetes:///"
    settings = KubeSettings.from_url(url)
    pod_label = PodLabel(settings, label, election.timing.renew_interval)
    pod_label.follow(election)
    try:
        await pod_label.run(election)
    finally:
        await pod_label.close()
