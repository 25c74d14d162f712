"""Refused values are put in JSON's words, never in Python's reprs: payload and schema errors
(jsonschema), field errors (pydantic) and values echoed back, in the API, the console and the config."""

from __future__ import annotations

from typing import Literal

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from pydantic import BaseModel, Field, ValidationError

from worker.rules.wording import described, field_message, json_text, quoted, schema_error


def payload_error(schema: object, payload: object) -> str:
    error = best_match(Draft202012Validator(schema).iter_errors(payload))
    assert error is not None
    return schema_error(error)


@pytest.mark.parametrize(("schema", "payload", "said"), [
    ({"type": "object", "properties": {"n": {"type": "integer"}}}, {"n": "7"},
     'expected an integer, got the string "7"'),
    ({"type": "object"}, [1, 2], "expected an object, got an array of 2 items"),
    ({"type": ["integer", "null"]}, True, "expected an integer or null, got true"),
    ({"type": "boolean"}, None, "expected true or false, got null"),
    ({"required": ["a", "b"]}, {}, 'missing the required fields "a", "b"'),
    ({"enum": ["a", "b"]}, "c", 'the string "c" is not one of "a", "b"'),
    ({"const": True}, None, "expected true, got null"),
    ({"pattern": "^a+$"}, "bb", 'the string "bb" does not match the pattern "^a+$"'),
    ({"maxLength": 2}, "abcd", "at most 2 characters allowed, got 4"),
    ({"minItems": 2}, [1], "at least 2 items needed, got 1"),
    ({"additionalProperties": False}, {"x": 1, "y": None},
     'Additional properties are not allowed ("x", "y" were unexpected)'),
    ({"not": {"const": None}}, None, 'null should not be valid under {"const": null}'),
    (False, 1, "no value is allowed here, got the number 1"),
])
def test_payload_errors_say_values_in_json_s_words(schema, payload, said):
    assert payload_error(schema, payload) == said


def test_schema_errors_say_values_in_json_s_words():
    with pytest.raises(SchemaError) as caught:
        Draft202012Validator.check_schema({"properties": {"a": {"minimum": "zero"}}})
    assert schema_error(caught.value) == 'expected a number, got the string "zero"'
    with pytest.raises(SchemaError) as caught:
        Draft202012Validator.check_schema({"type": "nonsense"})
    assert schema_error(caught.value) == '"nonsense" is not valid under any of the given schemas'


class Shape(BaseModel):
    body_format: Literal["raw", "slack", "envelope"] = "raw"
    name: str = Field(default="a", pattern="^[a-z]+$")
    count: int = 0


@pytest.mark.parametrize(("data", "said"), [
    ({"body_format": "nope"}, 'Input should be "raw", "slack" or "envelope"'),
    ({"name": "B"}, 'String should match pattern "^[a-z]+$"'),
    ({"count": [1, 2]}, "Input should be a valid integer"),  # the value is never echoed
])
def test_field_errors_quote_the_choices_in_json_s_double_quotes(data, said):
    with pytest.raises(ValidationError) as caught:
        Shape.model_validate(data)
    assert field_message(caught.value.errors()[0]) == said


def test_values_and_names_are_written_as_json_and_cut():
    assert json_text("7") == '"7"' and json_text([1, 2]) == "[1, 2]"
    assert json_text(None) == "null" and json_text(True) == "true"
    assert json_text({"a": "é"}) == '{"a": "é"}'
    assert json_text("x" * 100) == '"' + "x" * 58 + "…"
    assert json_text("bad\nline") == '"bad\\nline"'
    assert quoted("invoice.paid") == '"invoice.paid"'
    assert described(7) == "the number 7" and described({"a": 1}) == "an object with 1 field"
