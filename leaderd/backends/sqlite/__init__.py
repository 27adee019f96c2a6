"""The SQLite backend: one lease row in a local database file (docs/sqlite.md)."""
