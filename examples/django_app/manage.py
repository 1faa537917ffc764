#!/usr/bin/env python
"""The Django example's manage.py (SHARDCTL_CONFIG: the fleet's topology file)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gramsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
