"""``python -m shardctl``: the same entry point as the ``shardctl`` console script."""

from .cli import main

if __name__ == "__main__":
    main()
