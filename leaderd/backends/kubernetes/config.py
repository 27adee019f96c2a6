"""Where the API server is and who leaderd is to it: the ``kubernetes://`` URL, then a
kubeconfig file (``?kubeconfig=PATH``, else $KUBECONFIG), else the pod's service account
(in-cluster), else ~/.kube/config (docs/kubernetes.md, "URL").

``kubernetes:///NAMESPACE?lease-prefix=leaderd-``: the namespace may be left out (the pod's
own, from the mounted namespace file or $POD_NAMESPACE, else the kubeconfig context's, else
"default"). A token file (the service account's, or a kubeconfig ``tokenFile``) is read again
whenever it changes on disk (transport.py), so a rotated token is used at once.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import ssl
import tempfile
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base import BackendFatal

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_PREFIX = "leaderd-"
_PARAMS = ("lease-prefix", "kubeconfig", "context", "serviceaccount")
_USAGE = "expected kubernetes:///NAMESPACE?lease-prefix=leaderd-[&kubeconfig=PATH]"
# An RFC 1123 DNS subdomain: what a Lease's name must be.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True)
class KubeSettings:
    """A parsed ``kubernetes://`` URL and the credentials it resolved to."""

    server: str  # https://host:port, no trailing slash
    namespace: str
    prefix: str
    description: str  # the URL as given (it carries no secret), safe to log and serve
    source: str  # "in-cluster" or "kubeconfig PATH": where the credentials came from
    token: str = field(default="", repr=False)  # a static bearer token
    token_file: str = ""  # read again whenever it changes (rotation)
    cafile: str = ""
    cadata: str = field(default="", repr=False)  # PEM text
    cert: str = ""  # client certificate and key: files, or PEM text in cert_data/key_data
    key: str = ""
    cert_data: str = field(default="", repr=False)
    key_data: str = field(default="", repr=False)
    insecure: bool = False

    @classmethod
    def from_url(cls, url: str, env: Mapping[str, str] | None = None) -> KubeSettings:
        env = os.environ if env is None else env
        try:
            parts = urllib.parse.urlsplit(url)
            query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
        except ValueError:
            raise BackendFatal(f"invalid kubernetes URL: {_USAGE}") from None
        # Only what the URL form allows is shown: an option it does not know (a token someone
        # put there) is named, never its value.
        known = urllib.parse.urlencode({k: v for k, v in query.items() if k in _PARAMS}, safe="/")
        description = f"kubernetes://{parts.path}" + (f"?{known}" if known else "")
        unknown = sorted(set(query) - set(_PARAMS))
        if unknown or parts.netloc or parts.fragment or parts.path.count("/") > 1:
            what = f"unknown option(s) {unknown}" if unknown else "a host, fragment or long path"
            raise BackendFatal(f"kubernetes URL {description} has {what}: {_USAGE}")
        prefix = query.get("lease-prefix", DEFAULT_PREFIX)
        if prefix and not _NAME.match(prefix + "x"):
            raise BackendFatal(
                f"{description}: lease-prefix {prefix!r} must start a Lease name "
                "(lowercase letters, digits, '-' and '.')"
            )
        namespace = parts.path.strip("/")
        kubeconfig = query.get("kubeconfig") or env.get("KUBECONFIG", "").split(":")[0]
        sa_dir = query.get("serviceaccount", SERVICE_ACCOUNT_DIR)
        if kubeconfig:
            found = _from_kubeconfig(kubeconfig, query.get("context", ""), description)
        elif env.get("KUBERNETES_SERVICE_HOST"):
            found = _in_cluster(env, sa_dir, description)
        else:
            home = Path(env.get("HOME", "~")).expanduser() / ".kube" / "config"
            found = _from_kubeconfig(str(home), query.get("context", ""), description)
        namespace = namespace or found.pop("namespace", "") or env.get("POD_NAMESPACE", "")
        found.pop("namespace", None)
        namespace = namespace or "default"
        if not _NAME.match(namespace):
            raise BackendFatal(f"{description}: namespace {namespace!r} is not a valid name")
        return cls(namespace=namespace, prefix=prefix, description=description, **found)

    def lease_name(self, election: str) -> str:
        """The Lease an election is stored in; BackendFatal when it cannot be a Lease name."""
        name = self.prefix + election
        if len(name) > 253 or not _NAME.match(name):
            raise BackendFatal(
                f"election {election!r} gives the Lease name {name!r}, which Kubernetes refuses: "
                "use lowercase letters, digits, '-' and '.' (253 characters at most)"
            )
        return name

    def ssl_context(self) -> ssl.SSLContext:
        """TLS to the API server with the resolved CA and client certificate."""
        try:
            context = ssl.create_default_context(
                cafile=self.cafile or None, cadata=self.cadata or None
            )
            if self.insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if self.cert or self.cert_data:
                _load_client_cert(context, self)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise BackendFatal(
                f"{self.description}: unusable TLS material ({self.source}): {exc}"
            ) from None
        return context


def _load_client_cert(context: ssl.SSLContext, settings: KubeSettings) -> None:
    """ssl loads a certificate from files only: PEM data goes through a private temp dir."""
    if settings.cert:
        context.load_cert_chain(settings.cert, settings.key or None)
        return
    with tempfile.TemporaryDirectory(prefix="leaderd-kube-") as tmp:
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        for path, text in ((cert, settings.cert_data), (key, settings.key_data)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(text)
        context.load_cert_chain(cert, key)


def _in_cluster(env: Mapping[str, str], sa_dir: str, description: str) -> dict[str, Any]:
    """The pod's service account: $KUBERNETES_SERVICE_HOST/PORT, the mounted token and CA."""
    host, port = env["KUBERNETES_SERVICE_HOST"], env.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host
    token_file = os.path.join(sa_dir, "token")
    if not os.path.exists(token_file):
        raise BackendFatal(
            f"{description}: in a pod, but no service-account token at "
            f"{token_file} (automountServiceAccountToken: false?)"
        )
    namespace = ""
    with contextlib.suppress(OSError):  # else the downward API's $POD_NAMESPACE, or "default"
        namespace = Path(sa_dir, "namespace").read_text().strip()
    cafile = os.path.join(sa_dir, "ca.crt")
    return {
        "server": f"https://{host}:{port}",
        "source": "in-cluster",
        "token_file": token_file,
        "cafile": cafile if os.path.exists(cafile) else "",
        "namespace": namespace,
    }


def _from_kubeconfig(path: str, context_name: str, description: str) -> dict[str, Any]:
    """The current (or named) context's cluster and user from a kubeconfig file."""
    config = _read_kubeconfig(path, description)
    where = f"kubeconfig {path}"
    context_name = context_name or str(config.get("current-context") or "")
    context = _named(config, "contexts", context_name, "context", where, description)
    cluster = _named(
        config, "clusters", str(context.get("cluster", "")), "cluster", where, description
    )
    user = _named(config, "users", str(context.get("user", "")), "user", where, description)
    if not cluster.get("server"):
        raise BackendFatal(f"{description}: {where}: cluster has no server")
    if user.get("exec") or user.get("auth-provider"):
        raise BackendFatal(
            f"{description}: {where}: exec and auth-provider credentials are not "
            "supported; use a token, tokenFile or a client certificate"
        )
    base = os.path.dirname(os.path.abspath(path))
    return {
        "server": str(cluster["server"]).rstrip("/"),
        "source": where,
        "token": str(user.get("token") or ""),
        "token_file": _relative(base, user.get("tokenFile")),
        "cafile": _relative(base, cluster.get("certificate-authority")),
        "cadata": _decoded(cluster.get("certificate-authority-data")),
        "cert": _relative(base, user.get("client-certificate")),
        "key": _relative(base, user.get("client-key")),
        "cert_data": _decoded(user.get("client-certificate-data")),
        "key_data": _decoded(user.get("client-key-data")),
        "insecure": bool(cluster.get("insecure-skip-tls-verify", False)),
        "namespace": str(context.get("namespace") or ""),
    }


def _read_kubeconfig(path: str, description: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise BackendFatal(
            f"{description}: cannot read kubeconfig {path}: {exc.strerror or exc}"
        ) from None
    try:
        loaded = json.loads(text)  # JSON is YAML: a JSON kubeconfig needs no YAML parser
    except ValueError:
        loaded = _yaml(text, path, description)
    if not isinstance(loaded, dict):
        raise BackendFatal(f"{description}: kubeconfig {path} is not a mapping")
    return loaded


def _yaml(text: str, path: str, description: str) -> Any:
    try:
        import yaml  # type: ignore[import-untyped]  # the optional extra leaderd[kubernetes]
    except ImportError:
        raise BackendFatal(
            f"{description}: kubeconfig {path} is YAML: install PyYAML "
            "(pip install 'leaderd[kubernetes]') or write it as JSON"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BackendFatal(
            f"{description}: kubeconfig {path} is not valid YAML: {str(exc).splitlines()[0]}"
        ) from None


def _named(
    config: dict[str, Any], kind: str, name: str, inner: str, where: str, description: str
) -> dict[str, Any]:
    for entry in config.get(kind) or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(inner) or {}
            return value if isinstance(value, dict) else {}
    raise BackendFatal(f"{description}: {where} has no {inner} named {name!r}")


def _relative(base: str, path: Any) -> str:
    """kubeconfig paths are relative to the file that names them."""
    return os.path.join(base, str(path)) if path else ""


def _decoded(data: Any) -> str:
    return base64.b64decode(str(data)).decode() if data else ""
