"""A photo-sharing site on a shardctl fleet. The shardctl glue is the four marked lines."""

import os

import shardctl.django

SECRET_KEY = "example-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "gramsite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "shardctl.django", "gram"]  # shardctl: the command

DATABASES = shardctl.django.databases(
    os.environ.get("SHARDCTL_CONFIG", "shardctl.yaml")
)  # shardctl
DATABASE_ROUTERS = ["shardctl.django.DatabaseRouter"]  # shardctl
MIDDLEWARE = ["shardctl.django.ShardMiddleware"]  # shardctl
