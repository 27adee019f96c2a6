"""Backend URLs as they may be shown: in logs, errors and the API, never with a password."""

from __future__ import annotations

import urllib.parse


def redact_url(url: str) -> str:
    """The URL with its password (and any password= query parameter) replaced by ***."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable backend URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, sep, _password = userinfo.partition(":")
        netloc = f"{user}{':***' if sep else ''}@{hostport}"
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    redacted_query = [(k, "***" if k.lower() in ("password", "passfile") else v) for k, v in query]
    text = urllib.parse.urlunsplit(
        (parts.scheme, netloc, parts.path, urllib.parse.urlencode(redacted_query), "")
    )
    if not netloc and url[len(parts.scheme) + 1 :].startswith("//"):
        text = f"{parts.scheme}://{text[len(parts.scheme) + 1 :]}"  # as written: sqlite:///x.db
    return text
