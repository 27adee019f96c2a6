"""The backend registry the contract suite runs against: one entry per backend.

Each entry says how to make a fresh, empty store (a SQLite file, a PostgreSQL table) for
one test, how to make a holder's lease lapse, and which contract features it lacks.
``store.new()`` opens a new backend instance on that store; each instance stands for a
separate daemon. Every test of test_contract.py runs once per entry.

To add a backend, register one more entry, e.g. for PostgreSQL::

    @register("postgresql", marks=(pytest.mark.postgres,))
    async def _postgresql(request: pytest.FixtureRequest) -> str:
        server = request.getfixturevalue("pg_server")  # the session-scoped server
        return server.url + f"?table=lease_{uuid.uuid4().hex[:8]}"

    @register("postgresql+advisory", expire=expire_by_closing, marks=(pytest.mark.postgres,),
              lacks={"ttl": "an advisory lock held by a live session has no expiry time"})
    async def _advisory(request: pytest.FixtureRequest) -> str: ...

(and import the fixture the URL function needs, e.g. ``from tests.pg_fixtures import
pg_server``, at the top of this file so pytest can find it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import pytest

from leaderd.backends import Backend, backend_from_url
from leaderd.backends.base import LeaseLost
from tests.etcd.fixtures import etcd_cluster  # noqa: F401 - the fixture the etcd entry uses

# Elections every instance opens; tests use these names.
ELECTIONS = ("default", "other")
# The ttl of a lease a test wants to see lapse; long enough to outlive a slow request.
SHORT_TTL = 0.4
# The ttl of a lease that must not lapse during a test.
LONG_TTL = 60.0

# Contract features a backend may lack; an entry names what it lacks and why.
EXPIRY = "expiry"  # a holder's lease can lapse (store.expire)
TTL = "ttl"  # expires_in reports the seconds left of the ttl
DURABLE = "durable"  # terms survive closing every instance and opening a new one
# An expired, unreleased lease still names its holder and is taken over only by naming its
# version (rule 3); backends whose expiry is a release (a session's end) lack it.
TAKEOVER = "takeover"
# A release may reserve the free lease for one node id for one ttl (a hand-over).
HANDOVER = "handover"
# A release names the version it was last answered and changes nothing once a renewal moved
# it (docs/algorithm.md, "A release in doubt").
VERSIONED_RELEASE = "versioned release"


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


@dataclass
class Entry:
    url: Callable[[pytest.FixtureRequest], Awaitable[str]]
    expire: Expire = expire_by_ttl
    lacks: Mapping[str, str] = field(default_factory=dict)
    marks: tuple[pytest.MarkDecorator, ...] = ()
    # The store lives inside one instance (static): every "daemon" is that instance.
    single_instance: bool = False


BACKENDS: dict[str, Entry] = {}


def register(
    name: str,
    *,
    expire: Expire = expire_by_ttl,
    lacks: Mapping[str, str] | None = None,
    marks: tuple[pytest.MarkDecorator, ...] = (),
    single_instance: bool = False,
) -> Callable[[Callable[[pytest.FixtureRequest], Awaitable[str]]], object]:
    """Register a backend: the decorated coroutine returns the URL of a fresh, empty store."""

    def decorate(url: Callable[[pytest.FixtureRequest], Awaitable[str]]) -> object:
        BACKENDS[name] = Entry(url, expire, lacks or {}, marks, single_instance)
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
        self.require(EXPIRY)
        return await self.entry.expire(self, holder, election)

    def require(self, feature: str) -> None:
        """Skip, saying why, when this backend lacks a feature the test checks."""
        if feature in self.entry.lacks:
            pytest.skip(f"{self.name} lacks {feature}: {self.entry.lacks[feature]}")

    async def restart(self) -> None:
        """Close every instance, as if every daemon stopped."""
        self.require(DURABLE)
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


_ONE_PROCESS = "static:// has one process, whose release and renewal never cross"


@register(
    "static",
    single_instance=True,
    lacks={
        EXPIRY: "static leases never expire",
        DURABLE: "static:// without a term file keeps terms in memory (tests/backends)",
        TTL: "static leases have no ttl",
        TAKEOVER: "static leases never expire",
        HANDOVER: "static:// has one node: no standby to hand over to",
        VERSIONED_RELEASE: _ONE_PROCESS,
    },
)
async def _static(request: pytest.FixtureRequest) -> str:
    return "static://"


@register(
    "static-with-term-file",
    single_instance=True,
    lacks={EXPIRY: "static leases never expire", TTL: "static leases have no ttl",
           TAKEOVER: "static leases never expire",
           HANDOVER: "static:// has one node: no standby to hand over to",
           VERSIONED_RELEASE: _ONE_PROCESS},
)  # fmt: skip
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


_NO_TTL = {TTL: "an advisory lock held by a live session has no expiry time"}
_NO_TAKEOVER = {
    **_NO_TTL,
    TAKEOVER: "takeover=immediate: a session's end frees the lock",
    VERSIONED_RELEASE: "takeover=immediate: a release frees the lock whatever the "
    "row says; it runs on the lock's own session, after every renewal it sent",
}


@register("postgresql+advisory", expire=expire_by_closing_and_lapsing, lacks=_NO_TTL,
          marks=(pytest.mark.postgres,))  # fmt: skip
async def _postgresql_advisory(request: pytest.FixtureRequest) -> str:
    return _advisory_url(request)


@register("postgresql+advisory-immediate", expire=expire_by_closing, lacks=_NO_TAKEOVER,
          marks=(pytest.mark.postgres,))  # fmt: skip
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


@register("etcd", expire=expire_by_lessor, lacks={TAKEOVER: "etcd's lessor deletes an expired "
          "key: it is then free, never an expired lease to take over by its version",
          VERSIONED_RELEASE: "a keepalive does not move the key's mod revision; the engine "
          "never leads on a term whose release is in doubt (docs/etcd.md)"})  # fmt: skip
async def _etcd(request: pytest.FixtureRequest) -> str:
    cluster = request.getfixturevalue("etcd_cluster")  # the session's 3 members
    return str(cluster.url(prefix=f"/leaderd-test/{uuid.uuid4().hex[:10]}/"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Parametrized at collection time, so entries registered anywhere before are included.
    if "store" in metafunc.fixturenames:
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
