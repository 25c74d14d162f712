"""Config loading: defaults, environment overrides, and one clear line per mistake."""

import pytest

from worker.config import load_config
from worker.errors import ConfigError


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_minimal_file_gets_defaults(tmp_path):
    config = load_config(write(tmp_path, "database:\n  url: postgresql://db/x\n"), environ={})
    assert config.worker.concurrency == 200
    assert config.delivery.timeout_seconds is None  # the database's default applies
    assert (config.housekeeping.interval_seconds, config.housekeeping.purge_batch_size,
            config.housekeeping.purge_budget_seconds) == (30.0, 1000, 5.0)


def test_database_url_from_the_environment_without_a_file():
    config = load_config(None, environ={"DATABASE_URL": "postgresql://env/x"})
    assert config.database.url == "postgresql://env/x"


def test_environment_overrides_any_key(tmp_path):
    path = write(tmp_path, "database:\n  url: postgresql://db/x\nworker:\n  concurrency: 5\n")
    config = load_config(path, environ={"WEBHOOK_WORKER_WORKER__CONCURRENCY": "7",
                                        "WEBHOOK_WORKER_DATABASE__URL": "postgresql://env/y"})
    assert config.worker.concurrency == 7
    assert config.database.url == "postgresql://env/y"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("database:\n  url: postgresql://db/x\n  pool_size: 3\n", "database.pool_size: unknown key"),
        ("database:\n  url: postgresql://db/x\nworker:\n  concurrency: lots\n",
         "worker.concurrency: Input should be a valid integer"),
        ("worker:\n  concurrency: 3\n", "database.url: missing"),
        ("database:\n  url: postgresql://db/x\ndelivery:\n  timeout_seconds: 30\n  lease_seconds: 30\n",
         "delivery: lease_seconds (30) must be at least timeout_seconds (30) + 5"),
        ("database:\n  url: postgresql://db/x\napi:\n  port: 9000\n  metrics_port: 9000\n",
         "api: metrics_port must differ from port (both 9000)"),
        ("database:\n  url: postgresql://db/x\napi:\n  max_connections: 10\n",
         "api: max_connections_per_address (100) must not exceed max_connections (10)"),
        ("database:\n  url: postgresql://db/x\napi:\n  head_timeout_seconds: 0\n",
         "api.head_timeout_seconds: Input should be greater than 0"),
        ("database:\n  url: postgresql://db/x\nhousekeeping:\n  interval_seconds: 10\n"
         "  purge_budget_seconds: 20\n",
         "housekeeping: purge_budget_seconds (20) must not exceed interval_seconds (10)"),
        ("database:\n  url: postgresql://db/x\nhousekeeping:\n  purge_batch_size: 100001\n",
         "housekeeping.purge_batch_size: Input should be less than or equal to 100000"),
        ("database:\n  url: postgresql://db/x\nhousekeeping:\n  purge_budget_seconds: 0\n",
         "housekeeping.purge_budget_seconds: Input should be greater than 0"),
        ("database: [1, 2]\n", "database: must be a mapping"),
        ("- just a list\n", "the top level must be a mapping"),
    ],
)
def test_bad_config_names_the_key_and_the_problem(tmp_path, text, expected):
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text), environ={})
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_url_values_are_never_echoed(tmp_path):
    path = write(tmp_path, "database:\n  url: 12345\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert "12345" not in str(caught.value)


@pytest.mark.parametrize(("given", "budget"), [("3", 3.0), ("0.5", 0.5), ("5", 5.0), ("60", 5.0)])
def test_a_housekeeping_interval_alone_is_valid_and_the_purge_budget_follows_it(tmp_path, given, budget):
    # the default budget (5 s) is cut to an interval shorter than it; a longer one keeps the default
    from_file = load_config(write(tmp_path, f"database:\n  url: postgresql://db/x\nhousekeeping:\n"
                                            f"  interval_seconds: {given}\n"), environ={})
    from_environment = load_config(None, environ={"DATABASE_URL": "postgresql://env/x",
                                                  "WEBHOOK_WORKER_HOUSEKEEPING__INTERVAL_SECONDS": given})
    for config in (from_file, from_environment):
        assert (config.housekeeping.interval_seconds, config.housekeeping.purge_budget_seconds) == (
            float(given), budget)
