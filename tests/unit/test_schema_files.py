"""The files of sql/: each function, view and trigger is defined in exactly one place."""

import re
from collections import Counter

from worker import schema

_DEFINITION = re.compile(r"^CREATE (?:OR REPLACE )?(FUNCTION|VIEW|TRIGGER) ([\w.]+)",
                         re.MULTILINE | re.IGNORECASE)


def test_each_function_view_and_trigger_is_defined_once_in_the_whole_of_sql():
    texts = [m.sql for m in schema.load_migrations()] + [d.sql for d in schema.load_definitions()]
    defined = Counter((kind.upper(), name) for text in texts for kind, name in _DEFINITION.findall(text))
    assert defined, "no definitions found"
    assert [what for what, count in defined.items() if count > 1] == []
