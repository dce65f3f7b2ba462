"""Alembic environment: migrates the connection ``Store.migrate()`` passes in.

For a new revision (developers): ``alembic -c monitor/store/migrations/alembic.ini revision --autogenerate -m "..."``
with ``-x url=sqlite:////tmp/x.db`` pointing at a database migrated to head.
"""

from alembic import context
from sqlalchemy import create_engine, pool

from monitor.store import metadata

config = context.config


def _configure(**kwargs) -> None:
    context.configure(target_metadata=metadata, compare_type=True, **kwargs)


def _url() -> str:
    return context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")


def run_offline() -> None:
    _configure(url=_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
