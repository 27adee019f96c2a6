"""The etcd URL: endpoints, prefix, TLS files, credentials; and what is never shown."""

from __future__ import annotations

import pytest

from leaderd.backends import BackendFatal, backend_from_url
from leaderd.backends.etcd.backend import EtcdBackend
from leaderd.backends.etcd.gateway import PASSWORD_ENV, EtcdSettings

SECRET = "pa55:w/rd@x"  # needs percent-encoding in a URL
QUOTED = "pa55%3Aw%2Frd%40x"


def test_every_endpoint_is_kept_in_order_with_the_default_port_and_prefix() -> None:
    s = EtcdSettings.from_url("etcd://h1:2379,h2,[::1]:2381")
    assert s.endpoints == ("http://h1:2379", "http://h2:2379", "http://[::1]:2381")
    assert s.prefix == "/leaderd/" and not s.user and s.ssl_context() is None


def test_the_prefix_always_ends_in_a_slash() -> None:
    assert EtcdSettings.from_url("etcd://h:1/?prefix=/team/a").prefix == "/team/a/"
    assert EtcdSettings.from_url("etcd://h:1/?prefix=/team/a/").prefix == "/team/a/"


def test_both_schemes_are_registered() -> None:
    assert isinstance(backend_from_url("etcd://127.0.0.1:2379"), EtcdBackend)
    backend = backend_from_url("etcd+https://127.0.0.1:2379/?prefix=/x/")
    assert (
        backend.kind == "etcd" and backend.description == "etcd+https://127.0.0.1:2379/?prefix=/x/"
    )


def test_https_endpoints() -> None:
    s = EtcdSettings.from_url("etcd+https://h1:2379,h2:2379")
    assert s.endpoints == ("https://h1:2379", "https://h2:2379")


def test_the_password_comes_from_the_url_or_the_environment_and_is_never_shown() -> None:
    s = EtcdSettings.from_url(f"etcd://root:{QUOTED}@h:2379/?prefix=/p/", env={})
    assert (s.user, s.password) == ("root", SECRET)
    assert SECRET not in s.description and QUOTED not in s.description
    assert s.description == "etcd://root:***@h:2379/?prefix=/p/"
    assert SECRET not in repr(s)
    from_env = EtcdSettings.from_url("etcd://root@h:2379", env={PASSWORD_ENV: SECRET})
    assert (from_env.user, from_env.password) == ("root", SECRET)
    assert SECRET not in from_env.description and SECRET not in repr(from_env)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("etcd://", "bad etcd endpoint"),
        ("etcd://h:99999", "bad etcd endpoint"),
        ("etcd://h:2379/path", "a path or fragment"),
        ("etcd://h:2379/?table=x", "unknown option(s) ['table']"),
        ("etcd://h:2379/?cacert=/ca.pem", "need etcd+https://"),
        ("etcd+https://h:2379/?cert=/c.pem", "both cert= and key="),
        (f"etcd://:{QUOTED}@h:2379", "a password needs a user name"),
    ],
)
def test_bad_urls_are_fatal_in_one_line_without_the_password(url: str, says: str) -> None:
    with pytest.raises(BackendFatal) as caught:
        EtcdSettings.from_url(url)
    message = str(caught.value)
    assert says in message and "\n" not in message
    assert SECRET not in message and QUOTED not in message


def test_unreadable_tls_material_is_fatal_and_names_the_file(tmp_path: object) -> None:
    url = f"etcd+https://h:2379/?cacert={tmp_path}/missing-ca.pem"
    with pytest.raises(BackendFatal, match=r"unusable TLS material \(cacert=.*missing-ca.pem\)"):
        backend_from_url(url)
