"""How a refused value is put in words for people: in JSON's terms (the string "7", an array of 2
items, true, null), never in Python's reprs ('7', [1, 2], True, None). The one wording of validation
problems (pydantic's for requests, forms and settings; jsonschema's for payloads and schemas) that
the API, the console, the CLI and the configuration show."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # jsonschema costs half a second to import: the CLI and the worker need it not
    from jsonschema.exceptions import SchemaError
    from jsonschema.exceptions import ValidationError as PayloadError
    from pydantic_core import ErrorDetails

# A value quoted in a message is cut to this many characters: a message names it, it does not carry it.
QUOTED_CHARS = 60
# JSON Schema's type names, as a sentence says them
TYPE_WORDS = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true or false",
              "null": "null", "array": "an array", "object": "an object"}
# pydantic's messages for these quote Python reprs ('a', 'b' or 'c'); every other is plain words
_QUOTING_PYDANTIC_TYPES = {"literal_error", "enum", "string_pattern_mismatch", "url_scheme",
                           "union_tag_invalid", "union_tag_not_found"}
_PYTHON_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'")


def json_text(value: Any, limit: int = QUOTED_CHARS) -> str:
    """A value written as JSON (a string in double quotes), cut to `limit` characters with '…'."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    except ValueError:  # a circular structure: nothing a request or a payload can hold
        text = str(value)
    text = "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def quoted(name: str, limit: int = QUOTED_CHARS) -> str:
    """A name (an endpoint's, an event type's) quoted in a message: "invoice.paid"."""
    return json_text(name, limit)


def described(value: Any) -> str:
    """A value as a sentence names it: the string "7", the number 7, true, null, an array of 2
    items, an object with 1 field."""
    if isinstance(value, bool) or value is None:
        return json_text(value)
    if isinstance(value, str):
        return f"the string {json_text(value)}"
    if isinstance(value, int | float):
        return f"the number {json_text(value)}"
    if isinstance(value, list):
        return f"an array of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, dict):
        return f"an object with {len(value)} field{'' if len(value) == 1 else 's'}"
    return json_text(value)


def schema_error(error: PayloadError | SchemaError) -> str:
    """A jsonschema error, of a payload against its schema or of a schema against JSON Schema itself,
    in plain words."""
    keyword, expected, value = error.validator, error.validator_value, error.instance
    if keyword is None:  # the schema `false`, or a subschema that is
        return f"no value is allowed here, got {described(value)}"
    if keyword == "type":
        types = expected if isinstance(expected, list) else [expected]
        wanted = " or ".join(TYPE_WORDS.get(str(t), json_text(t)) for t in types)
        return f"expected {wanted}, got {described(value)}"
    if keyword == "required" and isinstance(value, dict) and isinstance(expected, list):
        missing = [name for name in expected if name not in value]
        if missing:
            names = ", ".join(json_text(name) for name in missing)
            return f"missing the required field{'' if len(missing) == 1 else 's'} {names}"
    if keyword == "enum" and isinstance(expected, list):
        return f"{described(value)} is not one of {', '.join(json_text(v) for v in expected)}"
    if keyword == "const":
        return f"expected {json_text(expected)}, got {described(value)}"
    if keyword == "pattern":
        return f"{described(value)} does not match the pattern {json_text(expected)}"
    if keyword == "format":
        return f"{described(value)} is not in the format {json_text(expected)}"
    if keyword in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"):
        unit = {"L": "character", "I": "item", "P": "field"}[keyword[3]]
        bound = "at least" if keyword.startswith("min") else "at most"
        size = len(value) if isinstance(value, str | list | dict) else "?"
        need = "needed" if keyword.startswith("min") else "allowed"
        return f"{bound} {expected} {unit}{'' if expected == 1 else 's'} {need}, got {size}"
    return _without_reprs(error.message, error)


def _without_reprs(message: str, error: PayloadError | SchemaError) -> str:
    """jsonschema's own message with every Python repr of the values it quotes written as JSON."""
    values: list[Any] = []
    _collect(error.instance, values, 2)
    _collect(error.validator_value, values, 3)
    # the longest first, so that a list is rewritten whole before its items are looked for
    for found in sorted({repr(v): v for v in values}.items(), key=lambda item: -len(item[0])):
        python, value = found
        plain = json_text(value, limit=10**6)
        if python != plain:
            message = message.replace(python, plain)
    return message


def _collect(value: Any, into: list[Any], depth: int) -> None:
    """The value and what it holds (keys, items), `depth` levels down, at most a few hundred."""
    if len(into) > 300:
        return
    into.append(value)
    if depth and isinstance(value, list):
        for item in value:
            _collect(item, into, depth - 1)
    elif depth and isinstance(value, dict):
        for key, item in value.items():
            into.append(key)
            _collect(item, into, depth - 1)


def field_message(error: ErrorDetails) -> str:
    """What pydantic found wrong with one field, in plain words: its message, with the values it
    quotes ('a', 'b' or 'c') in JSON's double quotes; our own validators' messages as they wrote
    them. The field's name, and the words for an unknown or a missing one, are the caller's."""
    message = error["msg"]
    if error["type"] == "value_error":
        return message.removeprefix("Value error, ")
    if error["type"] in _QUOTING_PYDANTIC_TYPES:
        return _PYTHON_QUOTED.sub(lambda m: json_text(m.group(1).replace("\\'", "'"), limit=10**6), message)
    return message
