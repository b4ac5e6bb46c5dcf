"""The ``grove`` commands, one module per family; ``grove/cli.py`` assembles them into one app."""
