"""The daemon's import of aiohttp, without the CA bundle aiohttp loads for nothing.

aiohttp (3.10 and later) builds a verified client SSL context when it is imported, reading
the system's whole CA bundle into it: 70 to 150 ms and about 2 MB of RSS at every start
(docs/benchmarks.md, "Start-up and idle memory"). leaderd never uses that context: its only
HTTPS client, the etcd gateway's, always passes a context of its own (etcd_gateway.py). So
the daemon imports aiohttp with OpenSSL's default CA file pointed at an empty one, and puts
the environment back at once: every context made afterwards loads the bundle as usual.
"""

from __future__ import annotations

import importlib
import os
import sys

_CA_FILE = "SSL_CERT_FILE"


def import_aiohttp() -> None:
    if "aiohttp" in sys.modules:
        return
    saved = os.environ.get(_CA_FILE)
    os.environ[_CA_FILE] = os.devnull
    try:
        importlib.import_module("aiohttp")
    finally:
        if saved is None:
            del os.environ[_CA_FILE]
        else:
            os.environ[_CA_FILE] = saved
