"""URLs a recipe names (regenerate.endpoint): a password inside one (http://user:pass@host) is never
printed or stored as it is."""
from __future__ import annotations

import urllib.parse


def has_userinfo(url: str | None) -> bool:
    """Whether `url` carries a user name or password before its host."""
    if not isinstance(url, str):
        return False
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "@" in url
    return "@" in parts.netloc


def redacted(url: str | None) -> str:
    """`url` with the user name and password before its host replaced by ***, for messages and logs."""
    if not has_userinfo(url):
        return str(url)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "***@" + url.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))
