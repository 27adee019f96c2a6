"""Throwaway TLS material for the etcd tests, made with openssl: a CA, a server certificate
for 127.0.0.1 and a client certificate it signs, and a second CA that signs nothing we use.
The Kubernetes tests make theirs with ``new_ca``, ``new_signed`` and ``public_key``."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Material:
    cacert: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_cacert: str  # a CA that did not sign the server's certificate


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def new_key(path: str) -> None:
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", path
    )


def public_key(key: str, path: str) -> None:
    _openssl("pkey", "-in", key, "-pubout", "-out", path)


def new_ca(directory: str, name: str) -> tuple[str, str]:
    cert, key = os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")
    new_key(key)
    _openssl("req", "-x509", "-new", "-key", key, "-out", cert, "-days", "2",
             "-subj", f"/CN=leaderd test {name}")  # fmt: skip
    return cert, key


def new_signed(directory: str, name: str, ca: tuple[str, str], extensions: str) -> tuple[str, str]:
    cert, key = os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")
    csr, ext = os.path.join(directory, f"{name}.csr"), os.path.join(directory, f"{name}.ext")
    with open(ext, "w") as f:
        f.write(extensions)
    new_key(key)
    _openssl("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
             "-out", cert, "-days", "2", "-extfile", ext)  # fmt: skip
    return cert, key


def make(directory: str) -> Material:
    ca, other = new_ca(directory, "ca"), new_ca(directory, "other-ca")
    # clientAuth too: etcd's JSON gateway calls the member's own gRPC server with this one.
    usage = "extendedKeyUsage=serverAuth,clientAuth\n"
    server = new_signed(directory, "server", ca, "subjectAltName=IP:127.0.0.1\n" + usage)
    client = new_signed(directory, "leaderd-client", ca, "extendedKeyUsage=clientAuth\n")
    return Material(ca[0], server[0], server[1], client[0], client[1], other[0])
