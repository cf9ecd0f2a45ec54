"""Database access: one engine per URL, short transactions, lock retries, versioned schema.

Contract:
  * :func:`open_db` returns a :class:`Database` for a workspace (default URL
    ``sqlite:///<workspace>/workbench.db``) or for any SQLAlchemy URL (``db_url`` argument or the
    ``LOLCATS_DB_URL`` environment variable). The schema is created or upgraded on first open.
  * ``Database.write(fn)`` runs ``fn(session)`` in one write transaction and commits;
    ``Database.read(fn)`` runs it in a read transaction. Both retry the *whole* transaction with
    backoff when another process holds the database lock, so ``fn`` must only touch the
    database (no side effects outside it) and return plain data.
  * A lock that outlasts ``LOLCATS_DB_RETRY_TIMEOUT`` seconds (default 120) raises
    :class:`jobs.errors.DatabaseBusyError` with a clear message; a lock is never a crash.

SQLite (the default, one machine): WAL journal so readers never block the writer and the writer
never blocks readers; ``busy_timeout`` (``LOLCATS_DB_BUSY_TIMEOUT`` seconds, default 5) so a
connection waits for a lock before it gives up; ``synchronous=NORMAL`` (safe against process
crashes, which is the failure that matters here). Write transactions start with
``BEGIN IMMEDIATE``: a transaction that reads first and upgrades to a writer later can fail at
once with SQLITE_BUSY, without waiting, when another writer committed in between.

PostgreSQL (shared deployments, several worker machines): pass a URL such as
``postgresql+psycopg://user:password@host/lolcats`` (install ``psycopg``). Claims and transitions
are single conditional UPDATEs, so they stay atomic across machines; each worker only signals
processes on its own host and judges other hosts' jobs by their heartbeat. The workspace
folder must then be shared storage mounted at the same path on every worker host.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, inspect, select, text
from sqlalchemy.exc import DatabaseError, OperationalError
from sqlalchemy.orm import Session

from core.workspace import workspace_root
from jobs.errors import DatabaseBusyError, DatabaseDamagedError, JobsError
from jobs.models import FORMER_KIND_NAMES, Base, Job, SchemaVersion

T = TypeVar("T")

DB_URL_ENV = "LOLCATS_DB_URL"
BUSY_TIMEOUT_ENV = "LOLCATS_DB_BUSY_TIMEOUT"
RETRY_TIMEOUT_ENV = "LOLCATS_DB_RETRY_TIMEOUT"
DB_FILENAME = "workbench.db"

# ---------------------------------------------------------------------------------------------
# Schema versions. A fresh database gets the current tables from the ORM metadata and is stamped
# SCHEMA_VERSION; an older one runs UPGRADES[v] for every v above its version, in order, inside
# the same write transaction that bumps the version row.
#
# Why not Alembic: the database is created on the fly, in any workspace, by whichever process
# opens it first (CLI, worker, runner, Streamlit), possibly several at once. Alembic would need
# its script folder and env.py located at run time and does not serialise concurrent first
# openers. A version row upgraded under the database write lock (BEGIN IMMEDIATE on SQLite, an
# advisory lock on PostgreSQL) is atomic and safe under that concurrency, with no extra files.
# To change the schema: edit jobs/models.py, bump SCHEMA_VERSION, add UPGRADES[new] with the
# ALTER statements that bring a previous-version database to the new shape.
# ---------------------------------------------------------------------------------------------
SCHEMA_VERSION = 2


def _rename_kinds(conn: Connection) -> None:
    """Version 2: jobs stored under a former kind name take the kind's name."""
    for old, new in FORMER_KIND_NAMES.items():
        conn.execute(Job.__table__.update().where(Job.kind == old).values(kind=new))


UPGRADES: dict[int, Callable[[Connection], None]] = {2: _rename_kinds}
_PG_SCHEMA_LOCK_KEY = 0x10CA7  # advisory lock id that serialises schema creation on PostgreSQL


def busy_timeout_s() -> float:
    return float(os.environ.get(BUSY_TIMEOUT_ENV, "5"))


def retry_timeout_s() -> float:
    return float(os.environ.get(RETRY_TIMEOUT_ENV, "120"))


def is_lock_error(exc: BaseException) -> bool:
    """True for the transient 'someone else holds the lock' errors worth retrying."""
    if not isinstance(exc, OperationalError):
        return False
    message = str(getattr(exc, "orig", exc)).lower()
    return any(s in message for s in ("database is locked", "database is busy", "database table is locked",
                                      "deadlock detected", "could not serialize access"))


@dataclass
class RetryStats:
    """Counts lock retries in this process (observability and tests)."""

    retries: int = 0


retry_stats = RetryStats()


def retry_on_lock(fn: Callable[[], T], *, what: str = "database operation", timeout: float | None = None) -> T:
    """Call ``fn`` until it stops failing with a lock error; exponential backoff with jitter.

    Raises :class:`DatabaseBusyError` once ``timeout`` seconds (default ``LOLCATS_DB_RETRY_TIMEOUT``)
    have passed; any other exception propagates unchanged.
    """
    timeout = retry_timeout_s() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        try:
            return fn()
        except OperationalError as exc:
            if not is_lock_error(exc):
                raise
            if time.monotonic() + delay > deadline:
                raise DatabaseBusyError(
                    f"{what}: the database stayed locked by another process for more than {timeout:.0f} s; "
                    "check for a stuck process holding a transaction on it, or raise "
                    f"{RETRY_TIMEOUT_ENV}"
                ) from exc
            retry_stats.retries += 1
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)


class Database:
    """An engine plus the workspace it belongs to. Create with :func:`open_db`."""

    def __init__(self, engine: Engine, workspace: Path):
        self.engine = engine
        self.url = engine.url.render_as_string(hide_password=False)
        self.workspace = workspace
        self._write_engine = engine.execution_options(lolcats_write=True)

    def _transaction(self, fn: Callable[[Session], T], bind) -> T:
        with Session(bind=bind, expire_on_commit=False) as session:
            with session.begin():
                return fn(session)

    def write(self, fn: Callable[[Session], T], *, what: str = "database write", timeout: float | None = None) -> T:
        """Run ``fn(session)`` in one write transaction, retried while the database is locked."""
        return self._run(lambda: self._transaction(fn, self._write_engine), what, timeout)

    def read(self, fn: Callable[[Session], T], *, what: str = "database read", timeout: float | None = None) -> T:
        """Run ``fn(session)`` in one read transaction, retried while the database is locked."""
        return self._run(lambda: self._transaction(fn, self.engine), what, timeout)

    def _run(self, call: Callable[[], T], what: str, timeout: float | None) -> T:
        try:
            return retry_on_lock(call, what=what, timeout=timeout)
        except DatabaseError as exc:
            if isinstance(exc, OperationalError) or not _damaged(exc):
                raise
            where = self.url.removeprefix("sqlite:///")
            raise DatabaseDamagedError(
                f"{what}: the job database {where} is damaged ({exc.orig}); move it aside (for example: mv "
                f"{where} {where}.damaged) and start again with a new, empty one: the run folders in the "
                "workspace are untouched, only the job list and its logs are lost"
            ) from None


_engines: dict[tuple[str, str, int], Database] = {}
_engines_lock = threading.Lock()


def resolve_url(workspace: Path, db_url: str | None = None) -> str:
    return db_url or os.environ.get(DB_URL_ENV) or f"sqlite:///{workspace / DB_FILENAME}"


def open_db(workspace: str | os.PathLike | None = None, db_url: str | None = None) -> Database:
    """The :class:`Database` of a workspace (cached per URL and process; schema ensured)."""
    root = workspace_root(workspace)
    url = resolve_url(root, db_url)
    key = (url, str(root), os.getpid())  # pooled connections must not cross a fork
    with _engines_lock:
        db = _engines.get(key)
        if db is None:
            db = Database(_create_engine(url), root)
            _ensure_schema(db)
            _engines[key] = db
    return db


def _damaged(exc: DatabaseError) -> bool:
    """SQLite's errors for a file that is not a database or whose pages are corrupt."""
    text = str(exc.orig).lower()
    return "not a database" in text or "malformed" in text or "corrupt" in text


def close_all() -> None:
    """Dispose every cached engine of this process (tests, shutdown)."""
    with _engines_lock:
        for (_url, _root, pid), db in list(_engines.items()):
            if pid == os.getpid():
                db.engine.dispose()
        _engines.clear()


def _create_engine(url: str) -> Engine:
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    busy = busy_timeout_s()
    engine = create_engine(url, connect_args={"timeout": busy})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        # SQLAlchemy emits BEGIN itself (see _on_begin), so the driver must not.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy * 1000)}")
        # Switching to WAL needs a moment of exclusive access; retried like any lock.
        retry_on_lock(lambda: _exec_pragma(cursor, "PRAGMA journal_mode = WAL"), what="enabling WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        immediate = conn.get_execution_options().get("lolcats_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _exec_pragma(cursor, sql: str) -> None:
    import sqlite3

    try:
        cursor.execute(sql)
    except sqlite3.OperationalError as exc:  # raw driver error: wrap so retry_on_lock sees it
        raise OperationalError(sql, None, exc) from exc


def _current_version(session: Session) -> int | None:
    if not inspect(session.connection()).has_table(SchemaVersion.__tablename__):
        return None
    return session.scalar(select(SchemaVersion.version).where(SchemaVersion.id == 1)) or 0


def _ensure_schema(db: Database) -> None:
    # Fast path, no write lock: an up-to-date database (the common case) is only read, so opening
    # one never waits for a writer.
    if db.read(_current_version, what="checking the job database schema") == SCHEMA_VERSION:
        return

    def create_or_upgrade(session: Session) -> None:
        conn = session.connection()
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_SCHEMA_LOCK_KEY})
        if not inspect(conn).has_table(SchemaVersion.__tablename__):
            Base.metadata.create_all(conn)
            session.add(SchemaVersion(id=1, version=SCHEMA_VERSION))
            return
        row = session.scalar(select(SchemaVersion).where(SchemaVersion.id == 1))
        current = row.version if row else 0
        if current > SCHEMA_VERSION:
            raise JobsError(
                f"the job database {db.url} has schema version {current}, newer than this code "
                f"understands ({SCHEMA_VERSION}); upgrade the lolcats-workbench package"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            UPGRADES[version](conn)
        if row is None:
            session.add(SchemaVersion(id=1, version=SCHEMA_VERSION))
        else:
            row.version = SCHEMA_VERSION

    db.write(create_or_upgrade, what="creating the job database schema")


def schema_version(db: Database) -> int:
    return db.read(lambda s: s.scalar(select(SchemaVersion.version).where(SchemaVersion.id == 1)))
