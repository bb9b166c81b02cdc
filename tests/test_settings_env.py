from __future__ import annotations

from pathlib import Path

import pytest

from cachesafe.environment import ConfigError, Env, check_redis_url, parse_database_url

BASE = Path("/srv/app")


def test_postgres_url_becomes_django_settings() -> None:
    db = parse_database_url("postgres://bob:s%40cret@db.example:6543/catalog", base_dir=BASE)
    assert db["ENGINE"] == "cachesafe.db"
    assert (db["NAME"], db["USER"], db["PASSWORD"]) == ("catalog", "bob", "s@cret")
    assert (db["HOST"], db["PORT"]) == ("db.example", "6543")


def test_sqlite_url_is_relative_to_the_project_unless_absolute() -> None:
    assert parse_database_url("sqlite:///var/x.sqlite3", base_dir=BASE)["NAME"] == str(
        BASE / "var/x.sqlite3"
    )
    assert parse_database_url("sqlite:////tmp/x.sqlite3", base_dir=BASE)["NAME"] == "/tmp/x.sqlite3"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://root@localhost/db", "unsupported scheme 'mysql'"),
        ("postgres://postgres@localhost:5432/", "names no database"),
        ("postgres://postgres@localhost:port/db", "bad port"),
        ("localhost:5432", "unsupported scheme"),
    ],
)
def test_bad_database_url_says_what_to_fix(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_database_url(url, base_dir=BASE)


def test_password_is_not_repeated_in_errors() -> None:
    with pytest.raises(ConfigError) as info:
        parse_database_url("postgres://u:hunter2@h:1/", base_dir=BASE)
    assert "hunter2" not in str(info.value)


def test_strict_booleans_and_numbers() -> None:
    env = Env({"DEBUG": "yes", "OFF": "0", "BAD": "maybe", "PORT": "80a", "BIG": "70000"})
    assert env.flag("DEBUG", False) is True
    assert env.flag("OFF", True) is False
    assert env.flag("UNSET", True) is True
    with pytest.raises(ConfigError, match="BAD='maybe' is not a boolean"):
        env.flag("BAD", False)
    with pytest.raises(ConfigError, match="not a whole number"):
        env.integer("PORT", 1)
    with pytest.raises(ConfigError, match="out of range"):
        env.integer("BIG", 1, maximum=65535)


def test_redis_url_is_checked() -> None:
    assert check_redis_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    with pytest.raises(ConfigError, match="not a Redis URL"):
        check_redis_url("http://127.0.0.1:6379")


def test_lists_split_on_commas() -> None:
    assert Env({"H": "a.example, b.example,"}).items("H", []) == ["a.example", "b.example"]
