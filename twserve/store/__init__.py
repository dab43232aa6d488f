"""The request rows: SQLite by default, PostgreSQL for several instances."""
