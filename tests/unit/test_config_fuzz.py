"""Fuzzed configuration: whatever the file or the environment holds, load_config returns a Config or
raises a one-line ConfigError, and never echoes a URL."""

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.config import Config, load_config
from worker.errors import ConfigError

SECTIONS = {name: list(field.annotation.model_fields) for name, field in Config.model_fields.items()}
BASE_ENV = {"DATABASE_URL": "postgresql://x"}
# Loading YAML (pure Python PyYAML) dominates the run time, so these stay modest.
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ_FILES = settings(FUZZ, max_examples=60)

# Line breaks are kept out of generated keys here: a key is echoed in "section.key: unknown key", and
# test_a_key_with_a_line_break_still_gives_a_one_line_config_error covers that case on its own.
keys = st.text(alphabet=st.characters(blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029",
                                      blacklist_categories=["Cs"]), max_size=12)
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
yaml_data = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=10,
)
section_names = st.sampled_from(sorted(SECTIONS)) | keys
field_names = st.sampled_from(sorted({k for fields in SECTIONS.values() for k in fields})) | keys
sections = st.dictionaries(field_names, yaml_data, max_size=6) | yaml_data
documents = st.dictionaries(section_names, sections, max_size=6) | yaml_data


def scratch(tmp_path_factory):
    """One file per test, rewritten by each example (function-scoped fixtures do not mix with @given)."""
    path = tmp_path_factory.getbasetemp() / "fuzz-config.yaml"
    return path


def load(path, environ):
    """load_config's answer: a Config, or the ConfigError it raised. Any other exception escapes."""
    try:
        config = load_config(path, environ=environ)
    except ConfigError as exc:
        message = str(exc)
        assert message, "a ConfigError has a message"
        assert "\n" not in message and "\r" not in message, f"multi-line ConfigError: {message!r}"
        return exc
    assert isinstance(config, Config)
    return config


@given(data=documents)
@FUZZ_FILES
def test_any_yaml_document_gives_a_config_or_a_config_error(tmp_path_factory, data):
    path = scratch(tmp_path_factory)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    load(path, dict(BASE_ENV))


@given(data=documents)
@FUZZ_FILES
def test_any_yaml_document_without_a_database_url_gives_a_config_or_a_config_error(tmp_path_factory, data):
    path = scratch(tmp_path_factory)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    load(path, {})


@given(text=st.text())
@FUZZ
def test_any_text_as_the_file_gives_a_config_or_a_config_error(tmp_path_factory, text):
    path = scratch(tmp_path_factory)
    path.write_text(text, encoding="utf-8")
    load(path, dict(BASE_ENV))


YAML_SNIPPETS = st.sampled_from(
    ["database:\n", "  url: ", "worker:\n", "  concurrency: ", "- ", "{", "}", "[", "]", ": ", "'", '"',
     "&a ", "*a", "!!binary ", "!!python/object:os.system ", "? ", "\t", "---\n", "...\n", "%YAML 1.1\n",
     "\n", "  ", "#", "|\n", ">\n", "<<: ", "!!set ", "!!str ", "!!null ", "2001-12-14", ".inf", ".nan"]
)

@given(parts=st.lists(YAML_SNIPPETS | st.text(max_size=8), max_size=30))
@FUZZ
def test_yaml_shaped_text_as_the_file_gives_a_config_or_a_config_error(tmp_path_factory, parts):
    path = scratch(tmp_path_factory)
    path.write_text("".join(parts), encoding="utf-8")
    load(path, dict(BASE_ENV))


def env_name(section: str, key: str) -> str:
    return f"WEBHOOK_WORKER_{section.upper()}__{key.upper()}"


env_keys = st.sampled_from(sorted({k for fields in SECTIONS.values() for k in fields} | {"url"})) | keys
env_values = st.text(max_size=30) | st.sampled_from(
    ["", "[", "{", "a: b: c", "'", "- x", "!!binary x", "&a *a"]
)
env_overrides = st.lists(st.tuples(st.sampled_from(sorted(SECTIONS)), env_keys, env_values), max_size=6)


PLACEHOLDER_URL = "postgresql://placeholder"


def message_of(answer) -> str:
    return str(answer) if isinstance(answer, ConfigError) else ""


def assert_url_values_not_echoed(environ, message):
    """No value under a key naming a URL appears in the message, unless it would appear anyway: in
    the message got with the value replaced, or as part of another variable (which may be echoed)."""
    for name, value in environ.items():
        if "URL" not in name.upper() or len(value) <= 6:
            continue
        others = [text for n, v in environ.items() if n != name for text in (n, v)]
        if any(value in other for other in others):
            continue
        baseline = message_of(load(None, {**environ, name: PLACEHOLDER_URL}))
        if value in baseline:
            continue  # the text is part of the wording, not an echo (e.g. a value of "integer")
        assert value not in message, f"{name}'s value echoed in {message!r}"


@given(overrides=env_overrides,
       data=st.dictionaries(st.sampled_from(sorted(SECTIONS)), sections, max_size=4))
@FUZZ_FILES
def test_environment_overrides_on_top_of_a_file_give_a_config_or_a_config_error(
    tmp_path_factory, overrides, data
):
    path = scratch(tmp_path_factory)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    environ = dict(BASE_ENV)
    environ.update({env_name(section, key): value for section, key, value in overrides})
    load(path, environ)


@given(url=yaml_data, rest=st.dictionaries(st.sampled_from(sorted(SECTIONS)), sections, max_size=4))
@FUZZ_FILES
def test_a_database_url_in_the_file_is_never_echoed(tmp_path_factory, url, rest):
    rest.pop("database", None)
    path = scratch(tmp_path_factory)
    path.write_text(yaml.safe_dump({"database": {"url": url}, **rest}), encoding="utf-8")
    answer = load(path, {})
    if not isinstance(answer, ConfigError) or not isinstance(url, str) or len(url) <= 6:
        return
    path.write_text(yaml.safe_dump({"database": {"url": PLACEHOLDER_URL}, **rest}), encoding="utf-8")
    if url not in message_of(load(path, {})):
        assert url not in str(answer)


@given(url=st.text(min_size=7, max_size=40), concurrency=yaml_data)
@FUZZ
def test_a_database_url_from_the_environment_is_never_echoed(url, concurrency):
    environ = {"DATABASE_URL": url, "WEBHOOK_WORKER_WORKER__CONCURRENCY": yaml.safe_dump(concurrency)}
    answer = load(None, environ)
    if isinstance(answer, ConfigError):
        assert_url_values_not_echoed(environ, str(answer))


# --- Product bugs the fuzzing above found (fixed), each shown on its own. ---


@given(overrides=env_overrides)
@settings(FUZZ, report_multiple_bugs=False)
def test_any_environment_overrides_give_a_config_or_a_config_error(overrides):
    environ = dict(BASE_ENV)
    environ.update({env_name(section, key): value for section, key, value in overrides})
    answer = load(None, environ)
    if isinstance(answer, ConfigError):
        assert_url_values_not_echoed(environ, str(answer))


@pytest.mark.parametrize("value", ["[", "a: b: c", "'unterminated", "{x", "- a\n b: c"])
def test_an_environment_override_that_is_not_yaml_is_a_config_error(value):
    with pytest.raises(ConfigError, match=r"WEBHOOK_WORKER_WORKER__ID: not a valid YAML value"):
        load_config(None, environ={**BASE_ENV, "WEBHOOK_WORKER_WORKER__ID": value})


def test_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"database:\n  url: postgresql://x\nworker:\n  id: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"config\.yaml"):
        load_config(path, environ={})


@pytest.mark.parametrize("text", ['worker:\n  "con\\ncurrency": 3\n', '"data\\nbase": {}\n'])
def test_a_key_with_a_line_break_still_gives_a_one_line_config_error(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, environ=BASE_ENV)
    assert "\n" not in str(excinfo.value)


# Built here rather than written out, so that no test's generated text picks them up as constants.
BAD_TAGS = ["!!" + tag for tag in ("timestamp x", "timestamp ", "int x", "float x", "bool x")]


@pytest.mark.parametrize("value", BAD_TAGS)
def test_a_malformed_yaml_tag_in_the_file_is_a_config_error(tmp_path, value):
    path = tmp_path / "config.yaml"
    path.write_text(f"database:\n  url: postgresql://x\nworker:\n  id: {value}\n")
    with pytest.raises(ConfigError):
        load_config(path, environ={})


@pytest.mark.parametrize("value", BAD_TAGS)
def test_a_malformed_yaml_tag_in_an_environment_override_is_a_config_error(value):
    with pytest.raises(ConfigError):
        load_config(None, environ={**BASE_ENV, "WEBHOOK_WORKER_WORKER__ID": value})
