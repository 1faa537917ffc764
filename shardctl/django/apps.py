from django.apps import AppConfig


class ShardctlConfig(AppConfig):
    """``INSTALLED_APPS += ["shardctl.django"]``: the ``shardctl_makemigrations`` command."""

    name = "shardctl.django"
    label = "shardctl"
    verbose_name = "shardctl"
