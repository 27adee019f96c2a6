"""Faults dealt to the daemons' processes, on every backend.

* ``sigkill``, ``sigterm``: the daemon dies or stops (SIGTERM: exit 0 within 15 s), and is
  restarted after a drawn delay;
* ``sigstop``: the daemon is frozen for a drawn pause, then continued;
* ``duplicate_node_id``: a second daemon with the target's node id runs for a while;
* with ``Settings.supervise``: ``keeper_sigkill``, ``keeper_sigstop`` and ``both_sigstop``
  aim at the leader's keeper of its command, alone or with the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING

from leaderd.supervision.containment import children
from tests.support.daemons import Daemon

from .node import Node

if TYPE_CHECKING:
    from .check import Fault, Violations
    from .observe import Observations
    from .settings import Settings


class ProcessFaults:
    """Mixed into the harness's Chaos."""

    s: Settings
    rng: random.Random
    obs: Observations
    violations: Violations

    if TYPE_CHECKING:

        def _node(self, fault: Fault) -> Node: ...
        def _pause(self) -> float: ...
        def _spawn(self, work: Awaitable[None]) -> None: ...
        def _restart(self, node: Node) -> None: ...
        def _daemon(self, node_id: str, url: str) -> Daemon: ...

    async def _fault_sigkill(self, fault: Fault) -> None:
        node = self._node(fault)
        node.down = True
        os.killpg(node.daemon.pid, signal.SIGKILL)
        await node.exited(10)
        fault.params["restart_after_s"] = delay = round(self.rng.uniform(0.2, 2.0), 3)
        self._spawn(self._restart_later(node, delay))

    async def _fault_sigterm(self, fault: Fault) -> None:
        node = self._node(fault)
        node.down = True
        node.daemon.signal(signal.SIGTERM)
        fault.params["restart_after_s"] = delay = round(self.rng.uniform(0.2, 1.5), 3)
        self._spawn(self._after_sigterm(node, fault, delay))

    async def _after_sigterm(self, node: Node, fault: Fault, delay: float) -> None:
        code = await node.exited(15)
        took = time.monotonic() - fault.injected
        fault.params["exit_code"], fault.params["exit_s"] = code, round(took, 3)
        self._check_exit(node, fault, code, 0, "sigterm_exit", "SIGTERM (rule 7: exit 0)")
        await self._restart_later(node, delay)

    def _check_exit(
        self, node: Node, fault: Fault, code: int | None, expected: int, kind: str, after: str
    ) -> None:
        """A daemon's exit after a fault: any other code, or none, is a ``kind`` violation."""
        if code == expected:
            return
        what = "still running after 15s" if code is None else f"exited with code {code}"
        self.violations.add(
            kind,
            node=node.id,
            fault=fault.index,
            explanation=f"{node.id} {what} after {after}",
            log_tail=node.daemon.log()[-3000:],
        )
        node.daemon.kill()

    async def _restart_later(self, node: Node, delay: float) -> None:
        await asyncio.sleep(delay)
        self._restart(node)

    async def _fault_sigstop(self, fault: Fault) -> None:
        node = self._node(fault)
        fault.params["stopped_s"] = pause = round(self._pause(), 3)
        node.stopped = True
        os.kill(node.daemon.pid, signal.SIGSTOP)
        await asyncio.sleep(pause)
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.daemon.pid, signal.SIGCONT)
        node.stopped = False
        fault.healed = time.monotonic()

    async def _leader_keeper(self, fault: Fault) -> tuple[Node, int | None]:
        """The fault's node and its keeper (None if it runs no command now), noted."""
        node = self._node(fault)
        fault.params["keeper"] = keeper = await _keeper_of(node.daemon.pid)
        return node, keeper

    async def _fault_keeper_sigkill(self, fault: Fault) -> None:
        """SIGKILL the leader's keeper: the command's whole tree (its setsid worker too) must
        die with it, and the daemon must call it an internal failure (exit 1), releasing only
        once the tree is gone. Restarted after 0.2-2 s."""
        node, keeper = await self._leader_keeper(fault)
        if keeper is None:
            return
        node.down = True
        os.kill(keeper, signal.SIGKILL)
        code = await node.exited(15)
        fault.params["exit_code"] = code
        after = "its keeper was killed (an internal failure: exit 1)"
        self._check_exit(node, fault, code, 1, "keeper_sigkill_exit", after)
        fault.params["restart_after_s"] = delay = round(self.rng.uniform(0.2, 2.0), 3)
        self._spawn(self._restart_later(node, delay))

    async def _fault_keeper_sigstop(self, fault: Fault) -> None:
        """SIGSTOP the leader's keeper and make that leader step down (POST /resign): leaderd
        must end the tree (a setsid worker ignoring SIGTERM) itself before it releases.
        SIGCONT after a drawn pause, as for sigstop (if the keeper still exists)."""
        node, keeper = await self._leader_keeper(fault)
        if keeper is None:
            return
        fault.params["stopped_s"] = pause = round(self._pause(), 3)
        os.kill(keeper, signal.SIGSTOP)
        try:
            fault.params["resign_status"] = await node.poller.post("/resign")
            await asyncio.sleep(pause)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(keeper, signal.SIGCONT)
        fault.healed = time.monotonic()

    async def _fault_both_sigstop(self, fault: Fault) -> None:
        """SIGSTOP the leader and its keeper together (a debugger, a freezer on both): the
        guard of the command's tree must end it before the lease can expire (docs/run.md).
        SIGCONT after a drawn pause, as for sigstop, the keeper first."""
        node, keeper = await self._leader_keeper(fault)
        if keeper is None:
            return
        fault.params["stopped_s"] = pause = round(self._pause(), 3)
        node.stopped = True
        frozen = (node.daemon.pid, keeper)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(pause)
        finally:
            for pid in reversed(frozen):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            node.stopped = False
        fault.healed = time.monotonic()

    async def _fault_duplicate_node_id(self, fault: Fault) -> None:
        """A second daemon with the target's node id (a copied config, two pods of one name)
        runs for a while: it must never lead beside the first (rule 9)."""
        target = self._node(fault)
        fault.params["twin_s"] = pause = round(self.rng.uniform(0.5, 2 * self.s.ttl), 3)
        daemon = self._daemon(f"{target.id}-twin", target.daemon.backend)
        daemon.args += ["--node-id", target.id]  # the last --node-id wins
        twin = Node(daemon, None, self.obs, self.s)
        daemon.start()
        twin.poller.start()
        twin.watcher.start()
        await asyncio.sleep(pause)
        daemon.signal(signal.SIGTERM)
        if await twin.exited(15) is None:
            daemon.kill()
        await twin.poller.close()
        await twin.watcher.close()
        fault.healed = time.monotonic()


async def _keeper_of(daemon: int, timeout: float = 1.0) -> int | None:
    """The live keeper of a supervising daemon, once there is one: not its startup probe,
    nor a keeper that just ended (a zombie child of the daemon for a moment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [pid for pid in children(daemon) if _is_live_keeper(pid)]
        if found:
            return found[0]
        await asyncio.sleep(0.02)
    return None


def _is_live_keeper(pid: int) -> bool:
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        return state != "Z" and b"--lifeline" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return False


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and text.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
    return found
