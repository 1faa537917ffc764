"""DSN handling: parse, detect inline passwords, mask secrets in any text."""

from __future__ import annotations

import os
import re

from psycopg import conninfo as _conninfo

# A password runs to the next blank (or ``@`` / ``&`` in a URI), but never past the ``"`` that
# closes a JSON string: ``mask`` also runs over JSON documents (``--json``), whose closing
# quote and comma must survive. Inside a JSON string a literal ``"`` is always escaped (``\"``).
_NOT_JSON_END = r'(?!"\s*(?:[,}\]]|$))'
_URI_PASSWORD = re.compile(rf"(postgres(?:ql)?://[^:/@\s]*:)((?:{_NOT_JSON_END}[^@\s])*)(@)",
                           re.IGNORECASE | re.MULTILINE)
_KV_PASSWORD = re.compile(rf"(password\s*=\s*)('(?:[^'\\]|\\.)*'|(?:{_NOT_JSON_END}\S)+)",
                          re.IGNORECASE | re.MULTILINE)
_QUERY_PASSWORD = re.compile(rf"([?&]password=)((?:{_NOT_JSON_END}[^&\s])*)", re.IGNORECASE | re.MULTILINE)

# Secret values seen at run time (from password_env variables); masked wherever they appear.
_known_secrets: set[str] = set()


def parse(dsn: str) -> dict[str, str]:
    """Parse a libpq DSN (URI or key=value); raises ValueError on bad syntax."""
    try:
        return _conninfo.conninfo_to_dict(dsn)
    except Exception as exc:  # psycopg.ProgrammingError carries libpq's message
        raise ValueError(mask(str(exc)).strip()) from None


def has_inline_password(dsn: str) -> bool:
    try:
        return bool(parse(dsn).get("password"))
    except ValueError:
        return bool(_URI_PASSWORD.search(dsn) or _KV_PASSWORD.search(dsn))


def remember_secret(value: str | None) -> None:
    if value:
        _known_secrets.add(value)


def mask(text: str) -> str:
    """Replace every password in ``text`` (DSN forms and known secret values) by ``***``."""
    if not text:
        return text
    text = _URI_PASSWORD.sub(lambda m: m.group(1) + ("***" if m.group(2) else "") + m.group(3), text)
    text = _KV_PASSWORD.sub(r"\1***", text)
    text = _QUERY_PASSWORD.sub(r"\1***", text)
    for secret in sorted(_known_secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def connect_kwargs(dsn: str, password_env: str | None, **extra: object) -> dict[str, object]:
    """Keyword arguments for ``psycopg.connect`` with the password taken from the environment."""
    kwargs: dict[str, object] = {"conninfo": dsn}
    if password_env:
        value = os.environ.get(password_env)
        if value is None:
            from .errors import ConfigError

            raise ConfigError(f"environment variable {password_env} (password_env) is not set")
        remember_secret(value)
        kwargs["password"] = value
    kwargs.update(extra)
    return kwargs
