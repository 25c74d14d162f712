"""What a catalogue schema may hold and how a payload is checked against one, without a database:
nothing is retrieved (a real HTTP server on 127.0.0.1 and a file stand by to be asked), references
stay inside the schema, size and depth are bounded, and patterns run on RE2."""

from __future__ import annotations

import json

import pytest

from tests.receiver import Reply
from worker.rules import schemas
from worker.rules.schemas import (
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    PayloadProblem,
    SchemaUnusable,
    payload_problem,
    schema_problem,
)

SECRET = "hunter2-TOPSECRET"


def nested(levels: int) -> dict[str, object]:
    """A schema `levels` properties deep (twice as deep in JSON)."""
    schema: dict[str, object] = {"type": "object"}
    for _ in range(levels):
        schema = {"properties": {"a": schema}}
    return schema


@pytest.fixture
def outside(receiver, tmp_path):
    """A URL and a file a schema could name, each holding a schema with a secret in it."""
    receiver.script("/schema.json", Reply(body=json.dumps({"enum": [SECRET]}).encode(),
                                          headers={"Content-Type": "application/json"}))
    secret_file = tmp_path / "creds.json"
    secret_file.write_text(json.dumps({"enum": [SECRET]}))
    return receiver.url("/schema.json"), secret_file.as_uri()


def test_a_reference_outside_the_schema_is_refused_naming_where_and_nothing_is_fetched(outside, receiver):
    url, file_uri = outside
    for schema, where in [
        ({"$ref": url}, "at /$ref: "),
        ({"properties": {"card": {"$ref": file_uri}}}, "at /properties/card/$ref: "),
        ({"items": {"$dynamicRef": "http://169.254.169.254/latest/meta-data"}}, "at /items/$dynamicRef: "),
        ({"$defs": {"a": {"$ref": "other.json#/x"}}, "$ref": "#/$defs/a"}, "at /$defs/a/$ref: "),
    ]:
        problem = schema_problem(schema)
        assert problem is not None and problem.startswith(where), (schema, problem)
        assert "points outside the schema, and nothing outside it is ever fetched" in problem
    for schema, where in [({"$id": url}, "at /$id: "),
                          ({"$defs": {"a": {"$id": "a.json"}}}, "at /$defs/a/$id: ")]:
        problem = schema_problem(schema)
        assert problem is not None and problem.startswith(where) and "declares no $id" in problem, problem
    problem = schema_problem({"$schema": "http://json-schema.org/draft-07/schema#"})
    assert problem == f"at /$schema: the dialect is draft 2020-12 ({schemas.DIALECT}) or left out"
    assert receiver.requests == []


def test_references_within_the_schema_are_accepted_and_checked():
    local = {"$defs": {"amount": {"type": "integer"}, "named": {"$anchor": "money", "minimum": 0},
                       "a b/c~d": {"type": "string"}},
             "$schema": schemas.DIALECT,
             "properties": {"total": {"$ref": "#/$defs/amount"}, "net": {"$ref": "#money"},
                            "label": {"$ref": "#/$defs/a%20b~1c~0d"}, "self": {"$ref": "#"}}}
    assert schema_problem(local) is None
    assert payload_problem(local, {"total": 3, "net": 2, "label": "x"}) is None
    assert payload_problem(local, {"net": -1}) == PayloadProblem("/net", "-1 is less than the minimum of 0")
    assert payload_problem(local, {"self": {"label": 7}}) == \
        PayloadProblem("/self/label", "expected a string, got the number 7")
    # a pointer must name a schema: not a missing one, not data (`const`), not an unknown keyword
    for schema, problem in [
        ({"$ref": "#/$defs/missing"}, 'at /$ref: "#/$defs/missing" names no schema within this one'),
        ({"$ref": "#/const", "const": {"$ref": "http://127.0.0.1:9/"}},
         'at /$ref: "#/const" names no schema'),
        ({"$ref": "#/mine/a", "mine": {"a": {}}}, 'at /$ref: "#/mine/a" names no schema'),
        ({"$ref": "#nowhere"}, 'at /$ref: "#nowhere" names no $anchor or $dynamicAnchor of this schema'),
    ]:
        found = schema_problem(schema)
        assert found is not None and found.startswith(problem), (schema, found)


def test_a_stored_schema_that_refers_outside_is_unusable_and_the_validator_retrieves_nothing(outside,
                                                                                             receiver):
    url, file_uri = outside
    for schema in ({"$ref": url}, {"properties": {"x": {"$ref": file_uri}}}):
        with pytest.raises(SchemaUnusable) as refused:
            payload_problem(schema, {"x": "guess"})
        assert SECRET not in str(refused.value)
        # past the rule, the validator itself cannot retrieve: its reference does not resolve
        validator = schemas._Validator(schema, registry=schemas._NOTHING_RETRIEVED)
        with pytest.raises(Exception, match="Unresolvable") as failed:
            list(validator.iter_errors({"x": "guess"}))
        assert SECRET not in str(failed.value)
    assert receiver.requests == []


def test_a_schema_deeper_or_larger_than_the_bounds_is_refused_and_never_recursed_into():
    assert schema_problem(nested(MAX_SCHEMA_DEPTH // 2 - 1)) is None
    deep = f"nested more than {MAX_SCHEMA_DEPTH} deep (objects and arrays within each other)"
    assert schema_problem(nested(MAX_SCHEMA_DEPTH // 2)) == deep
    assert schema_problem(nested(100)) == deep  # crashed the check with a RecursionError
    assert schema_problem(nested(5000)) == deep  # deeper than Python's recursion limit
    assert schema_problem({"enum": ["x" * MAX_SCHEMA_BYTES]}) == \
        f"{MAX_SCHEMA_BYTES + 13} bytes of JSON text; at most {MAX_SCHEMA_BYTES}"
    assert schema_problem({"enum": ["x" * (MAX_SCHEMA_BYTES - 13)]}) is None


def doubling(levels: int) -> dict[str, object]:
    """2 KB at 18 levels: each definition names the one before twice, 2^levels schemas to visit."""
    definitions: dict[str, object] = {"l0": {"type": "string"}}
    for i in range(1, levels + 1):
        definitions[f"l{i}"] = {"allOf": [{"$ref": f"#/$defs/l{i - 1}"}, {"$ref": f"#/$defs/l{i - 1}"}]}
    return {"$defs": definitions, "$ref": f"#/$defs/l{levels}"}


def test_a_schema_whose_references_expand_it_past_the_bound_is_refused():
    expands = (f"its references expand it to more than {schemas.MAX_EXPANDED_SCHEMAS} schemas (each $ref "
               "counts the schema it names every time it is met), which a check may have to visit for "
               "each payload")
    assert schema_problem(doubling(18)) == expands  # took 9.7 s a publish
    assert schema_problem(doubling(12)) == expands
    assert schema_problem(doubling(10)) is None and payload_problem(doubling(10), "x") is None
    # definitions no reference names cost nothing; a recursive schema counts its recursion once
    assert schema_problem({"$defs": {f"d{i}": {"type": "string"} for i in range(2000)}}) is None
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}, "next": {"$ref": "#/$defs/node"}}}},
        "$ref": "#/$defs/node"}
    assert schema_problem(tree) is None
    assert payload_problem(tree, {"children": [{"next": {"children": 1}}]}) == PayloadProblem(
        "/children/0/next/children", "expected an array, got the number 1")


def test_patterns_run_on_re2_in_every_keyword_that_uses_one():
    # \p{Lu} is RE2's (and ECMA 262's) and not Python's re, which raises "bad escape \p": each
    # keyword's answer shows the pattern ran on RE2
    upper = r"^\p{Lu}+$"
    assert payload_problem({"pattern": upper}, "ÄB") is None
    assert payload_problem({"pattern": upper}, "ab") == PayloadProblem(
        "", 'the string "ab" does not match the pattern "^\\\\p{Lu}+$"')
    assert payload_problem({"patternProperties": {upper: {"type": "integer"}}}, {"AB": "x"}) == \
        PayloadProblem("/AB", 'expected an integer, got the string "x"')
    assert payload_problem({"patternProperties": {upper: {}}, "additionalProperties": False},
                           {"AB": 1, "ab": 2}).message == f'"ab" does not match any of the regexes: {upper!r}'
    for schema in ({"patternProperties": {upper: {}}, "unevaluatedProperties": False},
                   {"allOf": [{"patternProperties": {upper: {}}}], "unevaluatedProperties": False}):
        assert payload_problem(schema, {"AB": 1}) is None
        assert payload_problem(schema, {"AB": 1, "ab": 2}).message == \
            'Unevaluated properties are not allowed ("ab" was unexpected)'
    # took 105 s on Python's engine with 30 a's; each 2 more multiply that by about 4.5
    backtracking = payload_problem({"pattern": "^(a+)+$"}, "a" * 60 + "!")
    assert backtracking is not None and backtracking.message.endswith('does not match the pattern "^(a+)+$"')


def test_a_pattern_re2_cannot_take_is_refused_when_written_naming_where():
    for schema, where in [({"pattern": r"^(a)\1$"}, "at /pattern: "),
                          ({"properties": {"p": {"pattern": "(?=x)"}}}, "at /properties/p/pattern: "),
                          ({"patternProperties": {"(?<=a)b": {}}}, "at /patternProperties/(?<=a)b: ")]:
        problem = schema_problem(schema)
        assert problem is not None, schema
        assert problem.startswith(where + "RE2, the engine patterns run on, cannot"), problem
    # a pattern Python's re refuses and RE2 takes is accepted: patterns are never compiled by re
    assert schema_problem({"pattern": r"^\p{L}+$"}) is None
    with pytest.raises(SchemaUnusable, match="RE2"):
        payload_problem({"pattern": r"(a)\1"}, "aa")


def test_what_the_catalogue_held_before_keeps_its_answers():
    invoice = {"type": "object", "required": ["invoice_id"],
               "properties": {"invoice_id": {"type": "string"}, "lines": {"type": "array"}}}
    assert schema_problem(invoice) is None and schema_problem(True) is None and schema_problem(False) is None
    assert payload_problem(False, 1) == PayloadProblem("", "no value is allowed here, got the number 1")
    assert schema_problem({"type": "nonsense"}).startswith('at /type: "nonsense" is not valid')
