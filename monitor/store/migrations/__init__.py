"""Alembic migrations of the store's schema (run by ``Store.migrate()``; no alembic.ini needed)."""
