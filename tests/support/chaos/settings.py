"""What a chaos run is asked to do: the faults each backend can be dealt, and the run's
settings (its backend, size, timing, seed and fault kinds)."""

from __future__ import annotations

from dataclasses import dataclass

from .request_faults import REQUEST_FAULTS
from .sqlite_faults import SQLITE_FAULTS

BACKENDS = ("sqlite", "postgresql", "advisory", "etcd", "kubernetes")
PROCESS_FAULTS = ("sigkill", "sigstop", "sigterm")
# Faults of the members of a 3-member etcd cluster (tests/support/chaos/etcd.py injects them).
ETCD_FAULTS = ("etcd_kill", "etcd_leader_kill", "etcd_stop", "etcd_quorum_loss")
FAULTS = {
    "sqlite": (*PROCESS_FAULTS, "db_lock", "duplicate_node_id", "file_replaced", *SQLITE_FAULTS),
    "postgresql": (
        *PROCESS_FAULTS,
        *("pg_restart", "pg_crash", "clock_step", "pg_terminate", "latency", "blackhole", "reset"),
        *REQUEST_FAULTS,
    ),
    "etcd": (*PROCESS_FAULTS, *ETCD_FAULTS, *REQUEST_FAULTS, "partition"),
}
FAULTS["advisory"] = FAULTS["postgresql"]
# Faults of the control plane under kubernetes:// (tests/support/chaos/kubernetes.py injects them).
KUBE_FAULTS = ("apiserver_kill", "apiserver_stop", "apiserver_etcd_stop", "rbac_revoke")
FAULTS["kubernetes"] = (*PROCESS_FAULTS, *KUBE_FAULTS)
# Only with Settings.supervise: every daemon runs tests/chaos/command.py under its keeper.
KEEPER_FAULTS = ("keeper_sigkill", "keeper_sigstop", "both_sigstop")
ALL_FAULTS = tuple(
    dict.fromkeys(
        FAULTS["sqlite"] + FAULTS["postgresql"] + FAULTS["etcd"] + KUBE_FAULTS + KEEPER_FAULTS
    )
)
# Faults that take the leader away the moment they hit it: a leader is owed from the
# injection (rule 6; for SIGSTOP counted from the stop). The others hold the cluster
# back while they last: a leader is owed from the heal.
AT_ONCE = ("sigkill", "sigterm", "sigstop", "pg_terminate", "reset", *KEEPER_FAULTS)
# Faults aimed at no node: the harness picks their target itself.
NO_TARGET = {"pg_restart": "postgres", "db_lock": "sqlite", "file_replaced": "sqlite"}
NO_TARGET |= {"pg_crash": "postgres", "clock_step": "postgres"}
CLOCK_STEP = 600  # seconds each clock_step moves the PostgreSQL server's clock forward


@dataclass
class Settings:
    backend: str = "sqlite"
    nodes: int = 5
    duration: float = 60.0
    seed: int = 1
    ttl: float = 1.5
    renew_interval: float = 0.4
    retry_interval: float = 0.2
    poll_interval: float = 0.01
    # Scheduling slack on top of rule 6's ttl + retry_interval (a busy 2-core machine).
    slack: float = 1.5
    faults: tuple[str, ...] = ()  # empty: every fault the backend supports
    leader_bias: float = 0.7  # how often a process or network fault aims at the leader
    unsafe: bool = False  # run tests/chaos/unsafe_daemon.py: self-fencing disabled
    keep: bool = False  # keep the work directory (daemon logs) even without violations
    supervise: bool = False  # every daemon runs a command (`run -- tests/chaos/command.py`)
    # Stop once every fault kind was injected this many times (duration still caps the run);
    # 0: run the whole duration. The test suite's short runs deal one deck each.
    decks: int = 0
    # Stop after the first fault that broke a safety rule (duration still caps the run): the
    # checker's own test needs one violation, not a whole run of them.
    until_violation: bool = False

    @property
    def bound(self) -> float:
        return self.ttl + self.retry_interval + self.slack

    def kinds(self) -> tuple[str, ...]:
        allowed = FAULTS[self.backend] + (KEEPER_FAULTS if self.supervise else ())
        chosen = tuple(k for k in self.faults if k in allowed) if self.faults else allowed
        if not chosen:
            need = (
                " (keeper faults need --supervise)" if set(self.faults) & set(KEEPER_FAULTS) else ""
            )
            raise ValueError(f"none of the faults {self.faults} applies to {self.backend}{need}")
        return chosen
