"""The daemon's import of aiohttp, without what aiohttp loads for nothing.

- aiohttp (3.10 and later) builds a verified client SSL context when it is imported,
  reading the system's whole CA bundle into it: 70 to 150 ms and about 2 MB of RSS at every
  start. leaderd never uses that context: its only HTTPS client, the etcd gateway's, always
  passes a context of its own (backends/etcd/gateway.py). So OpenSSL's default CA file points at an
  empty one during the import.
- frozenlist's compiled extension is C++: it maps libstdc++ (about 1 MB of RSS) for the
  few frozen lists aiohttp keeps per application (signals, middlewares), which are read,
  never built, per request. Its pure-Python twin (same class, a list inside) does the same.

The environment is put back at once: every SSL context made afterwards loads the bundle as
usual. docs/benchmarks.md, "Start-up and idle memory".
"""

from __future__ import annotations

import importlib
import os
import sys

_IMPORT_ENV = {"SSL_CERT_FILE": os.devnull, "FROZENLIST_NO_EXTENSIONS": "1"}


def import_aiohttp() -> None:
    if "aiohttp" in sys.modules:
        return
    saved = {name: os.environ.get(name) for name in _IMPORT_ENV}
    os.environ.update(_IMPORT_ENV)
    try:
        importlib.import_module("aiohttp")
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
