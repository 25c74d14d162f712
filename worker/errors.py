"""The error every part raises for a wrong setting, so the CLI can answer it with exit status 2."""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration problem (the file, the environment, the keys), worded as one line naming the
    dotted key."""
