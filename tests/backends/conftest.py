"""The backend registry the contract suite runs against: one entry per backend.

Each entry says how to make a fresh, empty store (a SQLite file, a PostgreSQL table) for
one test, how to make a holder's lease lapse, and how a standby stands as a member a
granting release may hand the lease to. What a backend lacks, and why, is its own
declaration (``capabilities`` on its class, leaderd/backends/base.py).
``store.new()`` opens a new backend instance on that store; each instance stands for a
separate daemon. Every test of test_contract.py, test_reservation.py and test_grant.py runs
once per entry (skipped, saying why, where the backend lacks what the test checks).

To add a backend, register one more entry, e.g. for PostgreSQL::

    @register("postgresql", marks=(pytest.mark.postgres,))
    async def _postgresql(request: pytest.FixtureRequest) -> str:
        server = request.getfixturevalue("pg_server")  # the session-scoped server
        return server.url + f"?table=lease_{uuid.uuid4().hex[:8]}"

    @register("postgresql+advisory", expire=expire_by_closing, marks=(pytest.mark.postgres,))
    async def _advisory(request: pytest.FixtureRequest) -> str: ...

(and import the fixture the URL function needs, e.g. ``from tests.support.pg_fixtures import
pg_server``, at the top of this file so pytest can find it).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from leaderd.backends import Backend, Candidate, backend_from_url
from leaderd.backends.base import Capability, LeaseLost
from leaderd.backends.sqlite.backend import SQLiteBackend
from tests.support.etcd_fixtures import etcd_cluster  # noqa: F401 - the fixture the etcd entry uses
from tests.support.grants import stand_by_asking, stand_with_a_spare
from tests.support.kube_fixtures import kube  # noqa: F401 - the fixture the kubernetes entry uses

# The directory of the contract tests the registry parametrizes.
CONTRACT_TESTS = Path(__file__).parent
# Elections every instance opens; tests use these names.
ELECTIONS = ("default", "other")
# The ttl of a lease a test wants to see lapse; long enough to outlive a slow request.
SHORT_TTL = 0.4
# The ttl of a lease that must not lapse during a test.
LONG_TTL = 60.0


async def expire_by_ttl(store: Store, holder: Backend, election: str) -> Backend:
    """Lease backends: the lease was taken with SHORT_TTL; wait until it has lapsed."""
    await asyncio.sleep(SHORT_TTL * 1.5)
    return holder


async def expire_by_closing(store: Store, holder: Backend, election: str) -> Backend:
    """Session backends (advisory lock, takeover=immediate): the lease ends with the
    holder's connection."""
    await holder.close()
    return await store.new()  # the holder's node carries on with a new session


async def expire_by_closing_and_lapsing(store: Store, holder: Backend, election: str) -> Backend:
    """Advisory lock, takeover=wait: a holder whose session ended without a release is
    waited out until its last keepalive's lease has lapsed too."""
    successor = await expire_by_closing(store, holder, election)
    await asyncio.sleep(SHORT_TTL * 1.5)
    return successor


# (store, holder's instance, election) -> the instance the holder's node uses afterwards.
Expire = Callable[["Store", Backend, str], Awaitable[Backend]]
# (standby's instance, election, standby, ttl) -> the heartbeat a grant to it counts from.
Stand = Callable[[Backend, str, Candidate, float], Awaitable[dt.datetime]]


@dataclass
class Entry:
    url: Callable[[pytest.FixtureRequest], Awaitable[str]]
    expire: Expire = expire_by_ttl
    marks: tuple[pytest.MarkDecorator, ...] = ()
    # The store lives inside one instance (static): every "daemon" is that instance.
    single_instance: bool = False
    # How a standby becomes a member a granting release may hand the lease to.
    stand: Stand = stand_by_asking
    # The ttl of a member a grant test leaves silent for over half of it, to go stale.
    stale_ttl: float = 1.0
    # What expires_in is counted in: etcd's lessor says whole seconds left, rounded down.
    ttl_left_step: float = 0.0


BACKENDS: dict[str, Entry] = {}


def register(
    name: str,
    *,
    expire: Expire = expire_by_ttl,
    marks: tuple[pytest.MarkDecorator, ...] = (),
    single_instance: bool = False,
    stand: Stand = stand_by_asking,
    stale_ttl: float = 1.0,
    ttl_left_step: float = 0.0,
) -> Callable[[Callable[[pytest.FixtureRequest], Awaitable[str]]], object]:
    """Register a backend: the decorated coroutine returns the URL of a fresh, empty store."""

    def decorate(url: Callable[[pytest.FixtureRequest], Awaitable[str]]) -> object:
        BACKENDS[name] = Entry(url, expire, marks, single_instance, stand, stale_ttl, ttl_left_step)
        return url

    return decorate


@dataclass
class Store:
    """One fresh store of one backend, and the instances (daemons) opened on it."""

    name: str
    url: str
    entry: Entry
    instances: list[Backend] = field(default_factory=list)

    async def new(self) -> Backend:
        """A new, opened instance: a separate daemon on the same store."""
        if self.entry.single_instance and self.instances:
            return self.instances[0]
        backend = backend_from_url(self.url)
        await backend.open(ELECTIONS)
        self.instances.append(backend)
        return backend

    async def expire(self, holder: Backend, election: str) -> Backend:
        """Make ``holder``'s lease on ``election`` (taken with SHORT_TTL) lapse; return the
        instance the holder's node goes on with (the same one, or a new session)."""
        self.require(Capability.EXPIRES)
        return await self.entry.expire(self, holder, election)

    async def stand(
        self, backend: Backend, election: str, who: Candidate, ttl: float
    ) -> dt.datetime:
        """Make ``who`` a campaigning member a granting release may hand the lease to; the
        heartbeat the grant's expiry would count from."""
        self.require(Capability.GRANTS)
        return await self.entry.stand(backend, election, who, ttl)

    def require(self, capability: Capability) -> None:
        """Skip, saying why, when this backend lacks a capability the test checks."""
        lacks = backend_from_url(self.url).capabilities.lacks  # built, never opened
        if capability in lacks:
            pytest.skip(f"{self.name} lacks {capability.value}: {lacks[capability]}")

    async def restart(self) -> None:
        """Close every instance, as if every daemon stopped."""
        self.require(Capability.DURABLE)
        await self.close_all()

    async def close_all(self) -> None:
        instances, self.instances = self.instances, []
        for backend in instances:
            await backend.close()


_counter = itertools.count()


@register("sqlite")
async def _sqlite(request: pytest.FixtureRequest) -> str:
    tmp_path = request.getfixturevalue("tmp_path")
    return f"sqlite://{tmp_path}/leaderd-{next(_counter)}.db"


@register("static", single_instance=True)
async def _static(request: pytest.FixtureRequest) -> str:
    return "static://"


@register("static-with-term-file", single_instance=True)
async def _static_term_file(request: pytest.FixtureRequest) -> str:
    tmp_path = request.getfixturevalue("tmp_path")
    return f"static://{tmp_path}/static-terms.json"


@register("postgresql", marks=(pytest.mark.postgres,))
async def _postgresql(request: pytest.FixtureRequest) -> str:
    server = request.getfixturevalue("pg_server")  # the session-scoped server
    return str(server.dsn(table=f"lease_{uuid.uuid4().hex[:10]}"))


def _advisory_url(request: pytest.FixtureRequest, **params: str) -> str:
    server = request.getfixturevalue("pg_server")
    table = f"advisory_{uuid.uuid4().hex[:10]}"
    return str(server.dsn(scheme="postgresql+advisory", table=table, **params))


@register(
    "postgresql+advisory", expire=expire_by_closing_and_lapsing, marks=(pytest.mark.postgres,)
)
async def _postgresql_advisory(request: pytest.FixtureRequest) -> str:
    return _advisory_url(request)


@register("postgresql+advisory-immediate", expire=expire_by_closing, marks=(pytest.mark.postgres,))
async def _postgresql_advisory_immediate(request: pytest.FixtureRequest) -> str:
    return _advisory_url(request, takeover="immediate")


async def expire_by_lessor(store: Store, holder: Backend, election: str) -> Backend:
    """etcd: its lessor deletes the key once the lease (whole seconds, at least its minimum)
    has run out; wait until it has. The holder hears its own key's deletion as LeaseLost."""
    async with asyncio.timeout(15):
        while (await holder.observe(election)).holder is not None:
            with contextlib.suppress(LeaseLost):
                await holder.wait_for_change(election, 0.5)  # the key's deletion is an event
    return holder


# A standby's spare must outlive the wait for it to go stale: the release would otherwise
# find it gone, and free the lease for that reason instead.
@register(
    "etcd", expire=expire_by_lessor, stand=stand_with_a_spare, stale_ttl=8.0, ttl_left_step=1.0
)
async def _etcd(request: pytest.FixtureRequest) -> str:
    cluster = request.getfixturevalue("etcd_cluster")  # the session's 3 members
    return str(cluster.url(prefix=f"/leaderd-test/{uuid.uuid4().hex[:10]}/"))


async def expire_by_watching(store: Store, holder: Backend, election: str) -> Backend:
    """kubernetes: no server clock expires a Lease; each daemon judges it lapsed once it has
    seen the same resourceVersion for the holder's ttl on its own clock (the takeover rule).
    Every instance looks now, then waits that long."""
    for backend in store.instances:
        await backend.observe(election)
    await asyncio.sleep(SHORT_TTL * 1.5)
    return holder


@register("kubernetes", expire=expire_by_watching, marks=(pytest.mark.kubernetes,))
async def _kubernetes(request: pytest.FixtureRequest) -> str:
    control_plane = request.getfixturevalue("kube")  # the session's API server
    tmp_path = request.getfixturevalue("tmp_path")
    kubeconfig = control_plane.restricted.kubeconfig(str(tmp_path / "restricted.kubeconfig"))
    prefix = f"t{uuid.uuid4().hex[:10]}-"
    return f"kubernetes:///leaderd-test?lease-prefix={prefix}&kubeconfig={kubeconfig}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Parametrized at collection time, so entries registered anywhere before are included.
    # Only the cross-backend tests of this directory: a backend's own package below (etcd/,
    # postgres/, ...) tests that backend alone, and may have a `store` of its own.
    if "store" in metafunc.fixturenames and metafunc.definition.path.parent == CONTRACT_TESTS:
        params = [pytest.param(name, marks=e.marks, id=name) for name, e in BACKENDS.items()]
        metafunc.parametrize("store", params, indirect=True)


@pytest.fixture
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    name: str = request.param
    entry = BACKENDS[name]
    store = Store(name, await entry.url(request), entry)
    try:
        yield store
    finally:
        await store.close_all()


Opener = Callable[..., Awaitable[SQLiteBackend]]


@pytest.fixture
async def opened() -> AsyncIterator[Opener]:
    """Opens backends on a file (``opened(path, "?query")``) and closes them after the test."""
    backends: list[SQLiteBackend] = []

    async def open_backend(path: Path | str, query: str = "") -> SQLiteBackend:
        backend = SQLiteBackend.from_url(f"sqlite://{path}{query}")
        backends.append(backend)
        await backend.open(ELECTIONS)
        return backend

    yield open_backend
    for backend in backends:
        await backend.close()
