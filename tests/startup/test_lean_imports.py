"""The daemon imports aiohttp without loading the CA bundle into aiohttp's unused client
context, and leaves the CA environment as it found it: later contexts load it as usual."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.daemons import REPO

CHECK = """
import json, os, ssl
from leaderd.startup import lean_imports
lean_imports.import_aiohttp()
from aiohttp import connector
print(json.dumps({
    "aiohttp": connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"],
    "later": ssl.create_default_context().cert_store_stats()["x509_ca"],
    "env": os.environ.get("SSL_CERT_FILE"),
}))
"""


def _system_bundle() -> str:
    import ssl

    bundle = ssl.get_default_verify_paths().cafile
    if not bundle or not os.path.exists(bundle):
        pytest.skip("this host has no system CA bundle file")
    return bundle


@pytest.mark.parametrize("set_by_user", [False, True])
def test_aiohttp_loads_no_ca_and_the_environment_is_put_back(set_by_user: bool) -> None:
    bundle = _system_bundle()
    env = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
    env["PYTHONPATH"] = str(REPO)
    if set_by_user:
        env["SSL_CERT_FILE"] = bundle
    out = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout)
    assert seen["aiohttp"] == 0
    assert seen["later"] > 0
    assert seen["env"] == (bundle if set_by_user else None)


FROZENLIST = """
import json, os
from leaderd.startup import lean_imports
lean_imports.import_aiohttp()
import frozenlist
maps = open("/proc/self/maps").read()
print(json.dumps({
    "pure": frozenlist.FrozenList is frozenlist.PyFrozenList,
    "libstdcxx": "libstdc++" in maps,
    "env": os.environ.get("FROZENLIST_NO_EXTENSIONS"),
}))
"""


def test_aiohttp_comes_without_the_cxx_frozenlist_and_the_environment_is_put_back() -> None:
    env = {k: v for k, v in os.environ.items() if k != "FROZENLIST_NO_EXTENSIONS"}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-c", FROZENLIST], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == {"pure": True, "libstdcxx": False, "env": None}
