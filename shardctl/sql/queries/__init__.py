"""Long fixed queries, one ``.sql`` file each, loaded by name: ``load("fingerprint_objects")``.

Each file runs as it is in psql (its header says which variables to ``\\set`` first). A parameter is
written as psql's quoted variable, ``:'name'``; :func:`load` turns each into psycopg's ``%(name)s``
(and doubles any ``%`` so the text stays literal), so callers pass a dict of the parameters.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

_VARIABLE = re.compile(r":'(\w+)'")


@functools.cache
def load(name: str) -> str:
    """The query of ``queries/<name>.sql``, ready for ``conn.execute`` (no trailing semicolon)."""
    text = resources.files(__package__).joinpath(f"{name}.sql").read_text(encoding="utf-8")
    text = text.strip().removesuffix(";").rstrip()
    if _VARIABLE.search(text):
        text = _VARIABLE.sub(r"%(\1)s", text.replace("%", "%%"))
    return text
