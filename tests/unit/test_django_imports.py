"""shardctl.django is optional: the core never imports Django, and settings.py can import
shardctl.django before Django is set up (only the models need the app registry)."""

import subprocess
import sys


def imported_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_the_core_does_not_import_django():
    mods = imported_after("import shardctl, shardctl.router, shardctl.cli")
    assert not any(m == "django" or m.startswith("django.") for m in mods)


def test_settings_can_import_shardctl_django_before_setup():
    mods = imported_after("import shardctl.django\nassert callable(shardctl.django.databases)")
    assert "django.db.models" not in mods and "django.apps" not in mods


def test_the_backend_settings_statement_is_local_and_quoted():
    code = (
        "from shardctl.django.backend.base import settings_sql\n"
        "print(settings_sql('insta3', False)); print(settings_sql('we%ird\"s', True)); print(settings_sql('', False))"
    )
    env_code = "import django\nfrom django.conf import settings\nsettings.configure()\n" + code
    out = subprocess.run(
        [sys.executable, "-c", env_code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    first, odd, none = out.stdout.splitlines()
    assert first == "SET LOCAL search_path = insta3, public"
    assert odd == 'SET LOCAL search_path = "we%%ird""s", public'
    assert none == 'SET LOCAL search_path = "$user", public'
