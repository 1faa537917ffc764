"""shardctl's own DSN parser and SQL quoting agree with libpq and psycopg (which the offline commands
must not import, so shardctl.model cannot use them)."""

from __future__ import annotations

import math
import re

import jinja2
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from psycopg import conninfo, sql

from shardctl.model import dsn as dsnlib
from shardctl.model.identifiers import quote_ident, quote_literal

NOT_UTF8 = "error: a percent-encoded value is not UTF-8"


def uri_password(text: str) -> str | None:
    """The raw password of a URI DSN (``scheme://user:password@``), as libpq splits it."""
    scheme = next((p for p in ("postgresql://", "postgres://") if text.startswith(p)), None)
    if scheme is None:
        return None
    rest = text[len(scheme) :]
    userinfo = re.match(r"[^@/]*@", rest)
    if not userinfo or ":" not in userinfo.group(0):
        return None
    return userinfo.group(0)[:-1].split(":", 1)[1]


def libpq_parse(text: str) -> dict[str, str] | str:
    try:
        return conninfo.conninfo_to_dict(text)
    except UnicodeDecodeError:  # libpq accepts the bytes; psycopg fails to decode them
        return NOT_UTF8
    except Exception as exc:  # noqa: BLE001 - psycopg.ProgrammingError with libpq's message
        message = str(exc).strip()
        password = uri_password(text)
        if password:  # shardctl does not repeat a password libpq quotes back
            message = message.replace(f'"{password}"', '"***"')
        return "error: " + dsnlib.mask(message)  # and masks the message, as before


def ours(text: str) -> dict[str, str] | str:
    try:
        return dsnlib.parse(text)
    except ValueError as exc:
        return NOT_UTF8 if "is not UTF-8" in str(exc) else "error: " + str(exc)


KNOWN = [
    "",
    "   ",
    "host=a",
    "host = a  port= 5432 ",
    "host='a b' dbname='x\\'y'",
    "host=a\\ b",
    "host='unterminated",
    "nonsense",
    "=x",
    "host=a bogus=1",
    "requiressl=1",
    "requiressl=0 host=h",
    "host=''",
    "password=s3cr=t",
    "postgresql://",
    "postgres://",
    "postgresql://u:p@h1,h2:5/db?sslmode=&ssl=true",
    "postgresql://[::1]:5/x",
    "postgresql://[::1",
    "postgresql://[]/x",
    "postgresql://[::1]x/y",
    "postgresql://h?user=a@b",
    "postgresql://h/%41?requiressl=0",
    "postgresql://h/%4",
    "postgresql://h/%00",
    "postgresql://h/%zz",
    "postgresql://h/db?a",
    "postgresql://h/db?sslmode=a=b",
    "postgresql://h/db?bogus=1",
    "postgresql://h/db?&",
    "postgresql://h/db?sslmode=require&",
    "postgresql://h/db?sslmode=require&&x=1",
    "postgresql://u@",
    "postgresql://:pw@h",
    "postgresql://u:@h",
    "postgresql://h:,:6/",
    "postgresql://h,[::1]:7,k/d",
    "postgresql://app@127.0.0.1:1/app",
    "host=127.0.0.1 port=1 dbname=app user=app",
    "postgresql://a%40b:p%2Fw@h/d%20b?application_name=x%26y",
    "POSTGRESQL://h/d",
    "postgresql:/h",
    "postgresql://h/db?ssl=true",
    "postgresql://h/db?ssl=false",
    "host=a\\",
    "host='a\\",
    "postgresql://,",
    "postgresql://:",
    "postgresql:// h /d",
    "postgresql://h/d b",
    "postgresql://h/%20d%20",
    "postgresql://h/d?application_name= x ",
]


@pytest.mark.parametrize("text", KNOWN)
def test_known_dsns_parse_as_libpq_does(text):
    assert ours(text) == libpq_parse(text)


# What a Python str can hold and libpq/PostgreSQL text can: no NUL, no lone surrogate.
TEXT = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://app:my secret@db/app",
        "postgresql://app:bad%zzsecret@db/app",
        "postgresql://app:nul%00secret@db/app",
    ],
)
def test_a_bad_password_is_not_repeated_in_the_error(dsn):
    with pytest.raises(ValueError) as caught:
        dsnlib.parse(dsn)
    assert "secret" not in str(caught.value)
    with pytest.raises(Exception) as from_libpq:  # which libpq's own message does
        conninfo.conninfo_to_dict(dsn)
    assert "secret" in str(from_libpq.value)


def test_nul_is_refused_not_cut_off():
    with pytest.raises(ValueError, match="NUL"):
        dsnlib.parse("host=a\x00b")


URI_PIECES = st.sampled_from(
    [
        "postgresql://",
        "postgres://",
        "u",
        ":",
        "@",
        "p",
        "h",
        "[",
        "]",
        "::1",
        ",",
        "5432",
        "/",
        "db",
        "?",
        "&",
        "=",
        "sslmode",
        "ssl",
        "true",
        "user",
        "%41",
        "%2",
        "%",
        "x y",
        "application_name",
        "requiressl",
        "1",
        "'",
        "\\",
        " ",
    ]
)
KV_PIECES = st.sampled_from(
    [
        "host",
        "port",
        "user",
        "password",
        "dbname",
        "sslmode",
        "requiressl",
        "bogus",
        "=",
        " ",
        "  ",
        "\t",
        "'",
        "\\",
        "a",
        "b c",
        "1",
        "\\'",
        "x=y",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(URI_PIECES, max_size=14).map("".join))
@example("postgresql://u:p@h/db")
@example(
    "postgresql://%dbpostgresql://%2"
)  # libpq's token error first, then bytes that are not UTF-8
@example("postgresql://h?%db=1")
def test_uri_forms_parse_as_libpq_does(text):
    assert ours(text) == libpq_parse(text)


@settings(max_examples=400, deadline=None)
@given(st.lists(KV_PIECES, max_size=14).map("".join))
def test_key_value_forms_parse_as_libpq_does(text):
    assert ours(text) == libpq_parse(text)


@settings(max_examples=300, deadline=None)
@given(st.text(TEXT, max_size=30))
def test_any_text_parses_as_libpq_does(text):
    assert ours(text) == libpq_parse(text)


@settings(max_examples=300, deadline=None)
@given(st.text(TEXT, min_size=1, max_size=40))
@example('a"b')
@example("Select")
def test_quote_ident_matches_psycopg(name):
    quoted = quote_ident(name)
    assert quoted == name or quoted == sql.Identifier(name).as_string(None)


def test_an_undefined_template_name_is_named_by_the_ident_filter():
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["ident"] = quote_ident
    with pytest.raises(jinja2.UndefinedError, match="shcema"):
        env.from_string("ALTER TABLE {{ shcema|ident }}.photos").render(schema="insta1")


def test_quote_ident_refuses_an_empty_name():
    with pytest.raises(ValueError):
        quote_ident("")


@settings(max_examples=300, deadline=None)
@given(st.none() | st.booleans() | st.integers() | st.floats() | st.text(TEXT))
@example(-0.0)
@example("a\\'b")
@example(float("-inf"))
def test_quote_literal_matches_psycopg(value):
    assert quote_literal(value) == sql.Literal(value).as_string(None)
    if isinstance(value, float) and math.isnan(value):
        assert quote_literal(value) == "'NaN'::float8"


def test_quote_literal_refuses_nul_and_other_types():
    with pytest.raises(ValueError):
        quote_literal("a\x00b")
    with pytest.raises(TypeError):
        quote_literal(b"bytes")
