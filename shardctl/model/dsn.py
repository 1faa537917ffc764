"""DSN handling: parse, detect inline passwords, mask secrets in any text.

The parser follows libpq's own (``PQconninfoParse``: the URI and key=value forms, the same
keywords and the same error messages) and is used only where psycopg is not loaded: validating a
topology, which the offline commands and a refused fleet command do without psycopg, whose import
costs 0.26 s of CPU and 20 MB more than this module's (0.36 s and 34 MB against 0.10 s and 14 MB,
medians of 9 runs of ``python -c``). Code that has psycopg loaded parses with
``psycopg.conninfo`` (libpq itself), and ``psycopg.connect`` parses the DSN again.
"""

from __future__ import annotations

import json
import os
import re

_URI_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)([^@\s]*)(@)", re.IGNORECASE)
# Not after ? or &: that is a URI query parameter, which ends at the next & (_QUERY_PASSWORD).
_KV_PASSWORD = re.compile(r"(?<![?&])(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&]password=)([^&\s]*)", re.IGNORECASE)
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')

# Every connection shardctl opens (its own and the Router's) talks UTF-8, whatever the server's
# encoding: PostgreSQL converts from LATIN1 and the like, and on SQL_ASCII (no conversion) text then
# comes back as str holding the stored bytes read as UTF-8, not as bytes (psycopg's SQL_ASCII mode).
CLIENT_ENCODING = "UTF8"

# Secret values seen at run time (from password_env variables); masked wherever they appear.
_known_secrets: set[str] = set()


# libpq's connection keywords (PQconninfoOptions, PostgreSQL 18).
KEYWORDS = frozenset(
    [
        "service",
        "user",
        "password",
        "passfile",
        "channel_binding",
        "connect_timeout",
        "dbname",
        "host",
        "hostaddr",
        "port",
        "client_encoding",
        "options",
        "application_name",
        "fallback_application_name",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "sslmode",
        "sslnegotiation",
        "sslcompression",
        "sslcert",
        "sslkey",
        "sslcertmode",
        "sslpassword",
        "sslrootcert",
        "sslcrl",
        "sslcrldir",
        "sslsni",
        "requirepeer",
        "require_auth",
        "min_protocol_version",
        "max_protocol_version",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "gssencmode",
        "krbsrvname",
        "gsslib",
        "gssdelegation",
        "replication",
        "target_session_attrs",
        "load_balance_hosts",
        "scram_client_key",
        "scram_server_key",
        "oauth_issuer",
        "oauth_client_id",
        "oauth_client_secret",
        "oauth_scope",
        "sslkeylogfile",
    ]
)
# Keywords whose values are the client's own files: meaningless, or wrong, on another machine or for
# another OS user (a subscription's libpq runs inside the target server). "sslrootcert=system" names
# no file and is kept.
CLIENT_FILE_KEYWORDS = (
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcrl",
    "sslcrldir",
    "passfile",
    "sslkeylogfile",
)
_URI_PREFIXES = ("postgresql://", "postgres://")
_SPACE = " \t\n\v\f\r"  # C isspace()


def parse(dsn: str) -> dict[str, str]:
    """Parse a libpq DSN (URI or key=value) as libpq does; raises ValueError on bad syntax."""
    try:
        if "\x00" in dsn:  # libpq would silently stop reading there
            raise ValueError("a connection string cannot contain a NUL character")
        if dsn.startswith(_URI_PREFIXES):
            return _parse_uri(dsn)
        return _parse_keyvalue(dsn)
    except ValueError as exc:
        raise ValueError(mask(str(exc)).strip()) from None


def _store(options: dict[str, str], keyword: str, value: str) -> None:
    if keyword == "requiressl":  # libpq's old spelling
        keyword, value = "sslmode", "require" if value.startswith("1") else "prefer"
    if keyword not in KEYWORDS:
        raise ValueError(f'invalid connection option "{keyword}"')
    options[keyword] = value


def _parse_keyvalue(text: str) -> dict[str, str]:
    """``key=value`` pairs separated by blanks; values unquoted or single-quoted, with backslash escapes."""
    options: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        if text[i] in _SPACE:
            i += 1
            continue
        start = i
        while i < n and text[i] != "=" and text[i] not in _SPACE:
            i += 1
        name = text[start:i]
        while i < n and text[i] in _SPACE:
            i += 1
        if i >= n or text[i] != "=":
            raise ValueError(f'missing "=" after "{name}" in connection info string')
        i += 1
        while i < n and text[i] in _SPACE:
            i += 1
        value: list[str] = []
        if i < n and text[i] == "'":
            i += 1
            while True:
                if i >= n:
                    raise ValueError("unterminated quoted string in connection info string")
                if text[i] == "\\":
                    i += 1
                    if i < n:
                        value.append(text[i])
                        i += 1
                    continue
                if text[i] == "'":
                    i += 1
                    break
                value.append(text[i])
                i += 1
        else:
            while i < n and text[i] not in _SPACE:
                if text[i] == "\\":
                    i += 1
                    if i < n:
                        value.append(text[i])
                        i += 1
                else:
                    value.append(text[i])
                    i += 1
            i += 1  # the blank that ended the value
        _store(options, name, "".join(value))
    return options


def _find(text: str, i: int, stops: str) -> int:
    """The index of the first character of ``stops`` at or after ``i`` (``len(text)`` if none)."""
    while i < len(text) and text[i] not in stops:
        i += 1
    return i


def _parse_uri(uri: str) -> dict[str, str]:
    """``postgres[ql]://[user[:password]@][host][:port][,...][/dbname][?param=value&...]``."""
    options: dict[str, str] = {}
    start = len(next(p for p in _URI_PREFIXES if uri.startswith(p)))
    i = _find(uri, start, "@/")
    if i < len(uri) and uri[i] == "@":  # user[:password]@
        colon = _find(uri, start, ":@")
        if colon > start:
            _store(options, "user", _uri_decode(uri[start:colon]))
        if uri[colon] == ":":
            password = uri[colon + 1 : _find(uri, colon, "@")]
            if password:
                try:
                    _store(options, "password", _uri_decode(password))
                except ValueError as exc:  # libpq's message quotes the password itself
                    raise ValueError(str(exc).replace(f'"{password}"', '"***"')) from None
        i += 1
    else:
        i = start
    hosts: list[str] = []
    ports: list[str] = []
    stop = ""
    while True:
        if i < len(uri) and uri[i] == "[":  # an IPv6 address
            close = _find(uri, i + 1, "]")
            if close >= len(uri):
                raise ValueError(
                    'end of string reached when looking for matching "]" in IPv6 host address '
                    f'in URI: "{uri}"'
                )
            if close == i + 1:
                raise ValueError(f'IPv6 host address may not be empty in URI: "{uri}"')
            host, i = uri[i + 1 : close], close + 1
            if i < len(uri) and uri[i] not in ":/?,":
                raise ValueError(
                    f'unexpected character "{uri[i]}" at position {i + 1} in URI '
                    f'(expected ":" or "/"): "{uri}"'
                )
        else:
            end = _find(uri, i, ":/?,")
            host, i = uri[i:end], end
        hosts.append(host)
        stop = uri[i] if i < len(uri) else ""
        if stop == ":":
            end = _find(uri, i + 1, "/?,")
            ports.append(uri[i + 1 : end])
            i = end
            stop = uri[i] if i < len(uri) else ""
        else:
            ports.append("")
        if stop != ",":
            break
        i += 1
    if ",".join(hosts):
        _store(options, "host", _uri_decode(",".join(hosts)))
    if ",".join(ports):
        _store(options, "port", _uri_decode(",".join(ports)))
    if stop == "/":
        end = _find(uri, i + 1, "?")
        if end > i + 1:
            _store(options, "dbname", _uri_decode(uri[i + 1 : end]))
        i = end
        stop = uri[i] if i < len(uri) else ""
    if stop == "?":
        _parse_uri_params(uri[i + 1 :], options)
    # Last: libpq takes any bytes and fails on a later malformed token first (psycopg then cannot
    # decode the bytes); so a value that is not UTF-8 is refused only when the rest parsed.
    for keyword, value in options.items():
        if not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:
                raise ValueError(f"percent-encoded value of {keyword} is not UTF-8") from None
    return options


def _parse_uri_params(params: str, options: dict[str, str]) -> None:
    i = 0
    while i < len(params):
        end = _find(params, i, "&")
        item, i = params[i:end], end + 1
        if "=" not in item:
            raise ValueError(f'missing key/value separator "=" in URI query parameter: "{item}"')
        keyword, value = item.split("=", 1)
        if "=" in value:
            raise ValueError(f'extra key/value separator "=" in URI query parameter: "{keyword}"')
        keyword, value = _uri_decode(keyword), _uri_decode(value)
        if keyword == "ssl" and value == "true":  # JDBC's spelling
            keyword, value = "sslmode", "require"
        if keyword not in KEYWORDS and keyword != "requiressl":
            shown = keyword.encode(errors="surrogateescape").decode(errors="replace")  # as psycopg
            raise ValueError(f'invalid URI query parameter: "{shown}"')
        _store(options, keyword, value)


def _uri_decode(text: str) -> str:
    """Percent-decoding as libpq does it: ``+`` stays ``+``, ``%00`` is refused, and blanks may
    only surround the value (libpq 17+ ends the value at a blank and refuses anything after it).
    Bytes that are not UTF-8 come back as surrogates (``surrogateescape``)."""
    raw = text.encode()
    i, n = 0, len(raw)
    while i < n and raw[i] == 0x20:
        i += 1
    out = bytearray()
    while i < n and raw[i] != 0x20:
        if raw[i] != 0x25:  # "%"
            out.append(raw[i])
            i += 1
            continue
        pair = raw[i + 1 : i + 3]
        if len(pair) < 2 or not all(c in b"0123456789abcdefABCDEF" for c in pair):
            raise ValueError(f'invalid percent-encoded token: "{text}"')
        if pair == b"00":
            raise ValueError(f'forbidden value %00 in percent-encoded value: "{text}"')
        out.append(int(pair, 16))
        i += 3
    while i < n and raw[i] == 0x20:
        i += 1
    if i < n:
        raise ValueError(
            f'unexpected spaces found in "{text}", use percent-encoded spaces (%20) instead'
        )
    return out.decode(errors="surrogateescape")  # bytes that are not UTF-8: _parse_uri refuses them


def has_inline_password(dsn: str) -> bool:
    try:
        return bool(parse(dsn).get("password"))
    except ValueError:
        return bool(
            _URI_PASSWORD.search(dsn) or _KV_PASSWORD.search(dsn) or _QUERY_PASSWORD.search(dsn)
        )


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
    text = _URI_PASSWORD.sub(
        lambda m: m.group(1) + ("***" if m.group(2) else "") + m.group(3), text
    )
    text = _KV_PASSWORD.sub(r"\1***", text)
    text = _QUERY_PASSWORD.sub(r"\1***", text)
    for secret in sorted(_known_secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def connect_kwargs(dsn: str, password_env: str | None, **extra: object) -> dict[str, object]:
    """Keyword arguments for ``psycopg.connect`` with the password taken from the environment, and
    ``client_encoding`` UTF8 (see CLIENT_ENCODING; ``extra`` may override it)."""
    kwargs: dict[str, object] = {"conninfo": dsn, "client_encoding": CLIENT_ENCODING}
    if password_env:
        value = os.environ.get(password_env)
        if value is None:
            from ..errors import ConfigError

            raise ConfigError(f"environment variable {password_env} (password_env) is not set")
        remember_secret(value)
        kwargs["password"] = value
    kwargs.update(extra)
    return kwargs
