"""A throwaway PostgreSQL server for tests: initdb + pg_ctl in a temporary directory.

Listens on 127.0.0.1 (a free port) and on a Unix socket in its own directory. Local
connections are trusted, except the role ``PASSWORD_USER`` which must give
``PASSWORD`` over TCP (to test that passwords never leak into messages).
As root, every PostgreSQL program runs as the ``postgres`` OS user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path

PASSWORD_USER = "leaderd_pw"
PASSWORD = "s3cr3t-Pa55word"  # a test fixture, not a secret

_CONFIG = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{sockdir}'
max_connections = 200
shared_buffers = 16MB
fsync = off
synchronous_commit = off
full_page_writes = off
log_min_messages = warning
log_connections = off
"""

_HBA = f"""
local all all trust
local replication all trust
host all {PASSWORD_USER} 127.0.0.1/32 scram-sha-256
host all all 127.0.0.1/32 trust
"""


class PgServerError(RuntimeError):
    """The test server could not be set up or started; the message says why."""


def find_bindir() -> Path:
    """Where initdb, pg_ctl and postgres live: pg_config, Debian's layout, or PATH."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            candidates.append(Path(out.stdout.strip()))
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    candidates += [Path(p) for p in versions]
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    raise PgServerError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found via pg_config, "
        "/usr/lib/postgresql/*/bin or PATH: install the postgresql package"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PgServer:
    """One PostgreSQL cluster in a temporary directory, controlled by pg_ctl."""

    def __init__(
        self,
        base_dir: str | None = None,
        *,
        config: str = "",
        env: dict[str, str] | None = None,
        primary: PgServer | None = None,
    ) -> None:
        """``config``: lines appended to postgresql.conf; ``env``: the server's environment
        (e.g. LD_PRELOAD for libfaketime); ``primary``: be a hot standby of that server."""
        self.bindir = find_bindir()
        self.config = config
        self.env = dict(env or {})
        self.root = Path(tempfile.mkdtemp(prefix="leaderd-pg-", dir=base_dir))
        self.datadir = self.root / "data"
        self.sockdir = self.root / "sock"
        self.logfile = self.root / "postgres.log"
        self.port = _free_port()
        self.host = "127.0.0.1"
        self._run_as: list[str] = []
        if os.geteuid() == 0:
            self._run_as = self._demote_prefix()
        if primary is None:
            self._initdb()
        else:
            self._clone(primary)

    # -- set-up -----------------------------------------------------------------

    def _demote_prefix(self) -> list[str]:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise PgServerError("running as root but no 'postgres' OS user exists") from exc
        self.sockdir.mkdir()
        for path in (self.root, self.sockdir):
            os.chown(path, pw.pw_uid, pw.pw_gid)
        self.root.chmod(0o755)
        if shutil.which("runuser"):
            return ["runuser", "-u", "postgres", "--"]
        return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups"]

    def _run(
        self, *args: str, timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        cmd = [
            *self._run_as,
            *(["env", *(f"{k}={v}" for k, v in env.items())] if env else []),
            *args,
        ]
        try:
            return subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, check=True, cwd=self.root
            )
        except subprocess.CalledProcessError as exc:
            raise PgServerError(
                f"{' '.join(args[:2])} failed (exit {exc.returncode}): "
                f"{(exc.stderr or exc.stdout).strip()[-2000:]}{self._log_tail()}"
            ) from exc

    def _initdb(self) -> None:
        self.sockdir.mkdir(exist_ok=True)
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        )
        conf = _CONFIG.format(port=self.port, sockdir=self.sockdir)
        with (self.datadir / "postgresql.conf").open("a") as f:
            f.write(conf + self.config + "\n")
        self._write(self.datadir / "pg_hba.conf", _HBA)
        self.start()
        self.psql(f"CREATE ROLE {PASSWORD_USER} LOGIN SUPERUSER PASSWORD '{PASSWORD}'")

    def _clone(self, primary: PgServer) -> None:
        """A hot standby streaming from ``primary`` (pg_basebackup -R), on its own port."""
        self.sockdir.mkdir(exist_ok=True)
        self._run(
            str(self.bindir / "pg_basebackup"),
            "-h", str(primary.sockdir), "-p", str(primary.port), "-U", "postgres",
            "-D", str(self.datadir), "-R", "--no-sync", "-X", "stream",
        )  # fmt: skip
        conf = _CONFIG.format(port=self.port, sockdir=self.sockdir)
        with (self.datadir / "postgresql.conf").open("a") as f:
            f.write(conf + "hot_standby = on\n" + self.config + "\n")
        self.start()

    def _write(self, path: Path, text: str) -> None:
        path.write_text(text)
        if self._run_as:
            pw = pwd.getpwnam("postgres")
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _log_tail(self) -> str:
        try:
            lines = self.logfile.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            return ""
        return "\n--- postgres.log ---\n" + "\n".join(lines) if lines else ""

    # -- control ----------------------------------------------------------------

    def start(self) -> None:
        """Start the server (after stop or kill) and wait until it accepts connections."""
        deadline = time.monotonic() + 30
        while True:
            try:
                self._run(
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-l",
                    str(self.logfile),
                    "-w",
                    "-t",
                    "30",
                    "start",
                    env=self.env,
                )
                return
            except PgServerError:
                # pg_ctl may give up waiting on a busy machine while the server comes up.
                if self.is_running():
                    return
                # After a SIGKILL, orphaned backends may hold the old shared memory for a moment.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: "fast" (disconnects clients) or "immediate"."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def kill(self) -> None:
        """SIGKILL the postmaster (a crash); its backends exit when they notice."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)

    def signal_all(self, sig: signal.Signals) -> None:
        """Signal the postmaster and every process it forked (SIGSTOP: nothing answers,
        not even a CancelRequest, until SIGCONT)."""
        postmaster = self.postmaster_pid()
        if postmaster is None:
            return
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True,
                                  text=True, check=False).stdout.split()  # fmt: skip
        for pid in [postmaster, *map(int, children)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.datadir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def is_running(self) -> bool:
        pid = self.postmaster_pid()
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def ensure_running(self) -> None:
        if not self.is_running():
            self.start()

    def cleanup(self) -> None:
        """Stop the server (if running) and remove its directory."""
        if self.is_running():
            try:
                self.stop("immediate")
            except PgServerError:
                self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- access -----------------------------------------------------------------

    def dsn(
        self,
        user: str = "postgres",
        password: str | None = None,
        database: str = "postgres",
        scheme: str = "postgresql",
        **params: str,
    ) -> str:
        """A URL for TCP on 127.0.0.1; ``params`` become the query string."""
        auth = urllib.parse.quote(user, safe="")
        if password is not None:
            auth += ":" + urllib.parse.quote(password, safe="")
        query = "?" + urllib.parse.urlencode(params) if params else ""
        return f"{scheme}://{auth}@{self.host}:{self.port}/{database}{query}"

    def psql(self, sql: str) -> str:
        """Run SQL as the superuser over the Unix socket; return unaligned output."""
        out = self._run(
            str(self.bindir / "psql"),
            "-h",
            str(self.sockdir),
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
            "-AtX",
            "-c",
            sql,
        )
        return out.stdout.strip()


if __name__ == "__main__":
    server = PgServer()
    try:
        print(server.dsn(), server.psql("SELECT version()"))
    finally:
        server.cleanup()


class FakeTimeServer(PgServer):
    """A PostgreSQL server whose wall clock can be stepped while it runs."""

    def __init__(self) -> None:
        libs = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
        if not libs:
            raise AssertionError("libfaketime is needed: apt-get install libfaketime")
        self.offset_dir = Path(tempfile.mkdtemp(prefix="leaderd-faketime-"))
        self.offset_dir.chmod(0o755)  # the postgres user reads the offset file
        self.offset_file = self.offset_dir / "offset"
        self.step(0)
        env = {
            "LD_PRELOAD": libs[0],
            "FAKETIME_TIMESTAMP_FILE": str(self.offset_file),
            "FAKETIME_NO_CACHE": "1",  # read the offset at every call: a step is at once
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # the server's timeouts keep real time
        }
        super().__init__(env=env)

    def step(self, seconds: int) -> None:
        tmp = self.offset_file.with_suffix(".new")
        tmp.write_text(f"{seconds:+d}\n")
        tmp.chmod(0o644)
        tmp.replace(self.offset_file)  # whole, never half-written

    def server_now(self) -> float:
        return float(self.psql("SELECT extract(epoch FROM now())"))

    def cleanup(self) -> None:
        super().cleanup()
        shutil.rmtree(self.offset_dir, ignore_errors=True)
