"""What a catalogue JSON Schema may hold, and a payload checked against one: nothing is retrieved,
references stay inside the schema, its size and depth are bounded, and patterns run on RE2."""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

import re2
from jsonschema import Draft202012Validator, FormatChecker, _keywords, _utils
from jsonschema.exceptions import SchemaError, best_match
from jsonschema.protocols import Validator
from jsonschema.validators import extend
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource

from worker.rules import wording

# A schema is at most this much JSON text and this deep (objects and arrays within each other): a
# bound on what checking it and compiling it may cost, far above what payload schemas need.
# Deeper ones once crashed the check with a RecursionError.
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 64
# Schemas a check may visit with every $ref followed: a 2 KB schema whose $defs each named the one
# before twice (allOf) took 9.7 s a publish at 18 levels, 2^18 schemas.
MAX_EXPANDED_SCHEMAS = 10_000
# The one dialect: draft 2020-12. A `$schema` naming another is refused.
DIALECT = "https://json-schema.org/draft/2020-12/schema"
# A problem quotes the offending value, which may be large: a message carries this much.
MAX_MESSAGE_CHARS = 300
# Compiled schemas and patterns kept, by their text: compiling costs far more than using one.
_SCHEMAS_KEPT = 256
_PATTERNS_KEPT = 1024

# The keywords of draft 2020-12 whose values are schemas (as `referencing` reads the dialect):
# a schema, a list of schemas, or an object of schemas.
_IN_VALUE = ("additionalProperties", "contains", "contentSchema", "else", "if", "items", "not",
             "propertyNames", "then", "unevaluatedItems", "unevaluatedProperties")
_IN_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_IN_OBJECT = ("$defs", "definitions", "dependentSchemas", "patternProperties", "properties")
_DEFINITIONS = ("$defs", "definitions")


@dataclass(frozen=True)
class PayloadProblem:
    """Why a payload does not follow its type's schema: where (an RFC 6901 JSON pointer into the
    payload, '' for the payload itself) and what."""

    pointer: str
    message: str

    def __str__(self) -> str:
        where = f"payload at {self.pointer}" if self.pointer else "payload"
        return f"{where}: {self.message}"


class SchemaUnusable(Exception):
    """A stored schema that breaks the rules schema_problem() applies when one is written (it was
    stored before them, or written around them in SQL): it checks nothing, and publishes of its type
    are refused until it is replaced."""


def json_pointer(path: Iterable[str | int]) -> str:
    """The RFC 6901 pointer of a path of keys and indexes ('' for the document itself)."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def short(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 1] + "…"


# --- Patterns: RE2, which runs in time linear in the text whatever the pattern ------------------------

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a pattern it refuses is our answer, not a line on stderr


@functools.lru_cache(maxsize=_PATTERNS_KEPT)
def _pattern(pattern: str) -> Any:
    return re2.compile(pattern, _RE2_OPTIONS)


def pattern_problem(pattern: str) -> str | None:
    """Why RE2 cannot take a pattern, or None. RE2 leaves out what no engine runs in time linear in
    the text: backreferences and look-around."""
    try:
        _pattern(pattern)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) \
            else str(exc)
        return f"RE2, the engine patterns run on, cannot take this pattern: {reason}"
    return None


class _Re2Search:
    """What jsonschema's keywords use of the `re` module (re.search), answered by RE2."""

    @staticmethod
    def search(pattern: str, text: str) -> Any:
        return _pattern(pattern).search(text)


F = TypeVar("F", bound=Callable[..., Any])


def _on_re2(function: F, **names: Any) -> F:
    """A copy of one of jsonschema's own functions whose module-level `re` is RE2, and whose other
    module-level `names` are the given ones. jsonschema has no setting for its regex engine: this
    keeps its keywords' semantics and messages, with Python's backtracking engine swapped out."""
    calls = set(function.__code__.co_names)
    if not set(names) <= calls or not ({"re"} | set(names)) & calls:
        raise ImportError(f"jsonschema's {function.__name__} no longer calls re.search as "
                          "worker.rules.schemas expects: its patterns would run on Python's backtracking "
                          "engine")
    module = {**function.__globals__, "re": _Re2Search, **names}
    copy = types.FunctionType(function.__code__, module, function.__name__, function.__defaults__,
                              function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    module[function.__name__] = copy  # a function that calls itself (evaluated keys) calls the copy
    return copy  # type: ignore[return-value]


# Every use of a pattern in draft 2020-12: `pattern`, `patternProperties`, and the two keywords that
# ask which properties `patternProperties` matched.
_RE2_KEYWORDS = {
    "pattern": _on_re2(_keywords.pattern),
    "patternProperties": _on_re2(_keywords.patternProperties),
    "additionalProperties": _on_re2(
        _keywords.additionalProperties,
        find_additional_properties=_on_re2(_utils.find_additional_properties)),
    "unevaluatedProperties": _on_re2(
        _keywords.unevaluatedProperties,
        find_evaluated_property_keys_by_schema=_on_re2(_utils.find_evaluated_property_keys_by_schema)),
}
_Validator = extend(Draft202012Validator, _RE2_KEYWORDS)  # type: ignore[no-untyped-call]


def _retrieve_nothing(uri: str) -> Resource[Any]:
    """A catalogue schema is the whole of itself: no URL is fetched, no file read, whatever it names."""
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


# The metaschemas (bundled with jsonschema) and nothing else; a reference to anything else fails.
_NOTHING_RETRIEVED: Registry[Any] = Registry(retrieve=_retrieve_nothing)  # type: ignore[call-arg]


# --- The rule a schema is written by, and read by ---------------------------------------------------


def _depth(document: Any) -> int:
    """How deep objects and arrays nest in a JSON document ({} is 1, a string 0), without recursing."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Iterable[Any] = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_SCHEMA_DEPTH:  # one beyond the bound is enough to refuse it
            stack.extend((child, depth + 1) for child in children)
    return deepest


Path = tuple[str | int, ...]


def _children(where: Path, schema: Any) -> Iterator[tuple[Path, Any]]:
    """The schemas directly within a schema, with their paths: what draft 2020-12 reads as a schema,
    not the data of `const`, `enum`, `default` or `examples`, nor unknown keywords."""
    if not isinstance(schema, dict):
        return
    for keyword in _IN_VALUE:
        if keyword in schema:
            yield (*where, keyword), schema[keyword]
    for keyword in _IN_LIST:
        if isinstance(schema.get(keyword), list):
            yield from (((*where, keyword, i), each) for i, each in enumerate(schema[keyword]))
    for keyword in _IN_OBJECT:
        if isinstance(schema.get(keyword), dict):
            yield from (((*where, keyword, key), each) for key, each in schema[keyword].items())


def _subschemas(schema: Any) -> Iterator[tuple[Path, Any]]:
    """Every schema within a schema, itself first, with its path."""
    stack: list[tuple[Path, Any]] = [((), schema)]
    while stack:
        where, found = stack.pop()
        yield where, found
        stack.extend(_children(where, found))


def _expansion(edges: dict[str, list[str]]) -> int:
    """How many schemas a check may visit with every reference followed: each schema counts itself,
    the schemas within it and those its references name, as often as it is reached; a reference back
    into one being expanded (a recursive schema, bounded by the payload's depth) counts once. Past
    MAX_EXPANDED_SCHEMAS the count stops growing."""
    cost: dict[str, int] = {}
    on_path: set[str] = set()
    stack: list[tuple[str, bool]] = [("", False)]
    while stack:
        node, finished = stack.pop()
        if finished:
            on_path.discard(node)
            cost[node] = min(MAX_EXPANDED_SCHEMAS + 1, 1 + sum(cost.get(each, 1) for each in edges[node]))
        elif node not in cost and node not in on_path:
            on_path.add(node)
            stack.append((node, True))
            stack.extend((each, False) for each in edges[node] if each not in cost and each not in on_path)
    return cost[""]


def _reference_problem(reference: str, places: set[str], anchors: dict[str, str]) -> str | None:
    """Why a `$ref` or `$dynamicRef` does not name a part of the schema it is in, or None."""
    if reference not in ("", "#") and not reference.startswith("#"):
        return (f"{wording.quoted(reference)} points outside the schema, and nothing outside it is ever "
                "fetched: refer to a part of the schema itself (\"#/$defs/name\" or an $anchor)")
    fragment = unquote(reference[1:])
    if fragment.startswith("/") or fragment == "":
        if fragment not in places:
            return f"{wording.quoted(reference)} names no schema within this one"
    elif fragment not in anchors:
        return f"{wording.quoted(reference)} names no $anchor or $dynamicAnchor of this schema"
    return None


def _target(reference: str, anchors: dict[str, str]) -> str:
    """The JSON pointer of the schema a local reference (checked by _reference_problem) names."""
    fragment = unquote(reference[1:])
    return fragment if fragment.startswith("/") or fragment == "" else anchors[fragment]


def _content_problem(schema: Any) -> str | None:
    """The first `$id`, `$schema`, reference or pattern a catalogue schema may not hold, naming where,
    or the references that make it expand past MAX_EXPANDED_SCHEMAS."""
    found = sorted(_subschemas(schema), key=lambda item: json_pointer(item[0]))
    places = {json_pointer(path) for path, _ in found}
    anchors = {each[keyword]: json_pointer(path) for path, each in found if isinstance(each, dict)
               for keyword in ("$anchor", "$dynamicAnchor") if isinstance(each.get(keyword), str)}
    edges: dict[str, list[str]] = {}
    for path, each in found:
        where = json_pointer(path)
        # definitions are visited only where a reference names them
        edges[where] = [json_pointer(child) for child, _ in _children(path, each)
                        if child[len(path)] not in _DEFINITIONS]
        if not isinstance(each, dict):
            continue
        if "$id" in each:
            return (f"at {where}/$id: a catalogue schema declares no $id: it would name the schema as a "
                    "resource of its own, and references stay within the schema (use $defs and "
                    "\"#/$defs/name\", or $anchor)")
        if "$schema" in each and each["$schema"] not in (DIALECT, DIALECT + "#"):
            return f"at {where}/$schema: the dialect is draft 2020-12 ({DIALECT}) or left out"
        for keyword in ("$ref", "$dynamicRef"):
            if keyword in each:
                problem = _reference_problem(each[keyword], places, anchors)
                if problem is not None:
                    return f"at {where}/{keyword}: {problem}"
                edges[where].append(_target(each[keyword], anchors))
        if isinstance(each.get("pattern"), str):
            problem = pattern_problem(each["pattern"])
            if problem is not None:
                return f"at {where}/pattern: {problem}"
        for pattern in each.get("patternProperties") or {}:
            problem = pattern_problem(pattern)
            if problem is not None:
                return f"at {json_pointer((*path, 'patternProperties', pattern))}: {problem}"
    if _expansion(edges) > MAX_EXPANDED_SCHEMAS:
        return (f"its references expand it to more than {MAX_EXPANDED_SCHEMAS} schemas (each $ref counts "
                "the schema it names every time it is met), which a check may have to visit for each "
                "payload")
    return None


def schema_problem(schema: Any) -> str | None:
    """What is wrong with a JSON Schema (draft 2020-12) as the catalogue holds one, naming where in it,
    or None: the rule the CLI, the API and the console write a schema by, and publishes read one by.
    Besides being a JSON Schema: at most MAX_SCHEMA_BYTES of JSON and MAX_SCHEMA_DEPTH deep; no `$id`;
    every `$ref` and `$dynamicRef` a part of the schema itself, together expanding it to at most
    MAX_EXPANDED_SCHEMAS schemas; every pattern one RE2 takes."""
    if not isinstance(schema, (dict, bool)):
        return "a JSON Schema is an object or a boolean"
    depth = _depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        return f"nested more than {MAX_SCHEMA_DEPTH} deep (objects and arrays within each other)"
    size = len(schema_text(schema).encode())
    if size > MAX_SCHEMA_BYTES:
        return f"{size} bytes of JSON text; at most {MAX_SCHEMA_BYTES}"
    try:
        # formats are not checked: `format: regex` would compile patterns on Python's engine, and
        # _content_problem() puts them to RE2, the one they run on
        Draft202012Validator.check_schema(schema, format_checker=FormatChecker(formats=()))
    except SchemaError as error:
        where = json_pointer(error.absolute_path)
        message = wording.schema_error(error)
        return short(f"at {where}: {message}" if where else message)
    return _content_problem(schema)


def schema_text(schema: Any) -> str:
    """A schema as the JSON text its problem and compiled validator are kept by."""
    return json.dumps(schema, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@functools.lru_cache(maxsize=_SCHEMAS_KEPT)
def stored_schema_problem(schema_text: str) -> str | None:
    """schema_problem() of a stored schema, by its JSON text: the catalogue's listings show it."""
    return schema_problem(json.loads(schema_text))


@functools.lru_cache(maxsize=_SCHEMAS_KEPT)
def checker(schema_text: str) -> Validator:
    """The compiled validator of a stored schema, given as JSON text; SchemaUnusable when the schema
    breaks schema_problem()'s rules. Nothing it meets is retrieved; its patterns run on RE2."""
    problem = stored_schema_problem(schema_text)
    if problem is not None:
        raise SchemaUnusable(problem)
    validator: Validator = _Validator(json.loads(schema_text), registry=_NOTHING_RETRIEVED)
    return validator


def first_problem(validator: Validator, payload: Any) -> PayloadProblem | None:
    """The first error of a payload (the one jsonschema's best_match ranks first: the deepest, most
    specific one), or None when it follows the schema."""
    error = best_match(validator.iter_errors(payload))
    if error is None:
        return None
    return PayloadProblem(json_pointer(error.absolute_path), short(wording.schema_error(error)))


def payload_problem(schema: Any, payload: Any) -> PayloadProblem | None:
    """A payload checked against a schema, here and now (worker.web.schema_checks runs the same
    check in processes of their own, within a time budget); SchemaUnusable for a schema that
    breaks the catalogue's rules."""
    if schema is None:
        return None
    return first_problem(checker(schema_text(schema)), payload)
