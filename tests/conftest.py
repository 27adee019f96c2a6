"""Shared test set-up: the PostgreSQL server plugin, loaded once for the whole suite."""

pytest_plugins = ["tests.pg_fixtures"]
