"""An SQLite export read into Arrow through ADBC's SQLite driver (`SqliteReader`), with the queries that keep each
column's type whatever its first rows hold (`sqlite_query`); readers.ExportSource reads SQLite exports through it."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pyarrow as pa

from ..errors import BadInputError

SQLITE_BATCH_ROWS = 65536


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def sqlite_query(table: str, cols: list[str], text: set[str], guarded: bool, condition: str = "") -> tuple[str, int]:
    """A SELECT of the columns, and how many leading rows to drop from its result. Arrow's SQLite driver types a
    column by its first rows, and a text column often starts with nulls: a first row holding '' in each text column
    (and nulls elsewhere) makes it text. Integers as they are; `guarded`, anything else as null."""
    body = f"SELECT {', '.join(_sqlite_column(c, c in text, guarded) for c in cols)} FROM {quoted(table)}{condition}"
    if not text & set(cols):
        return body, 0
    empty = "''"
    first = ", ".join(f"{empty if c in text else 'NULL'} AS c{i}" for i, c in enumerate(cols))
    return f"SELECT {first} UNION ALL {body}", 1


def _sqlite_column(column: str, text: bool, guarded: bool) -> str:
    q = quoted(column)
    if text:
        return f"CAST({q} AS TEXT)" if guarded else q
    if guarded:
        return f"CASE typeof({q}) WHEN 'integer' THEN {q} WHEN 'real' THEN CAST({q} AS INTEGER) END"
    return q


class TypeMismatch(Exception):
    """A column holds values of another type than its first rows."""


class SqliteReader:
    """SQLite to Arrow through ADBC's SQLite driver (C, no Python object per value), read-only."""

    def __init__(self, path: Path):
        import adbc_driver_manager
        import adbc_driver_sqlite

        self._adbc = adbc_driver_manager
        self.path = path
        try:
            self._db = adbc_driver_sqlite.connect(Path(path).resolve().as_uri() + "?mode=ro")
            self._conn = adbc_driver_manager.AdbcConnection(self._db)
        except adbc_driver_manager.Error as exc:
            raise BadInputError(f"{path}: cannot be opened as an SQLite export ({_first_line(exc)}); export the "
                                "report again with `nsys export --type sqlite`") from None

    def query(self, sql: str) -> pa.Table:
        with self._reader(sql, SQLITE_BATCH_ROWS) as reader:
            return reader.read_all()

    def stream(self, sql: str, batch_rows: int):
        """The query's record batches of `batch_rows` rows, one at a time."""
        with self._reader(sql, batch_rows) as reader:
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                yield batch

    @contextlib.contextmanager
    def _reader(self, sql: str, batch_rows: int):
        """The query's RecordBatchReader; what goes wrong while it is read is a `TypeMismatch` (a value of
        another type than the column's first rows) or a BadInputError naming the file."""
        stmt = self._adbc.AdbcStatement(self._conn)
        try:
            stmt.set_options(**{"adbc.sqlite.query.batch_rows": str(batch_rows)})
            stmt.set_sql_query(sql)
            handle, _ = stmt.execute_query()
            yield pa.RecordBatchReader._import_from_c(handle.address)
        except (self._adbc.Error, pa.ArrowException, OSError) as exc:
            if "type mismatch" in str(exc).lower():
                raise TypeMismatch(str(exc)) from None
            raise BadInputError(f"{self.path}: cannot be read as an SQLite export ({_first_line(exc)}); export "
                                "the report again with `nsys export --type sqlite`") from None
        finally:
            stmt.close()

    def close(self) -> None:
        self._conn.close()
        self._db.close()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
