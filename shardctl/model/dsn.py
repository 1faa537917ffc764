"""DSN handling: parse, detect inline passwords, mask secrets in any text."""

from __future__ import annotations

import json
import os
import re

from psycopg import conninfo as _conninfo

_URI_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)([^@\s]*)(@)", re.IGNORECASE)
# Not after ? or &: that is a URI query parameter, which ends at the next & (_QUERY_PASSWORD).
_KV_PASSWORD = re.compile(r"(?<![?&])(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&]password=)([^&\s]*)", re.IGNORECASE)
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')

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
        return bool(_URI_PASSWORD.search(dsn) or _KV_PASSWORD.search(dsn) or _QUERY_PASSWORD.search(dsn))


def remember_secret(value: str | None) -> None:
    if value:
        _known_secrets.add(value)


def mask(text: str) -> str:
    """Replace every password in ``text`` (DSN forms and known secret values) by ``***``.

    A JSON document (``--json`` output) is masked string by string, so that a password
    running up to the closing quote of a JSON string cannot swallow the quote and leave
    invalid JSON behind.
    """
    if not text:
        return text
    if text.lstrip()[:1] in ("{", "["):
        try:
            json.loads(text)
        except ValueError:
            pass
        else:
            return _JSON_STRING.sub(_mask_json_string, text)
    return _mask_text(text)


def _mask_json_string(match: re.Match) -> str:
    literal = match.group(0)
    value = json.loads(literal)
    masked = _mask_text(value)
    return literal if masked == value else json.dumps(masked)


def _mask_text(text: str) -> str:
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
            from ..errors import ConfigError

            raise ConfigError(f"environment variable {password_env} (password_env) is not set")
        remember_secret(value)
        kwargs["password"] = value
    kwargs.update(extra)
    return kwargs
