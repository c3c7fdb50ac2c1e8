"""A library's error text reaches the terminal as one plain line (``ai_pipeline.cli.library_logs``)."""

from __future__ import annotations

import io
import logging
import uuid

import pytest

from ai_pipeline.cli.library_logs import PlainStream, plain, plainly

SQLALCHEMY_TEXT = (
    "Exception while writing logger call to event log: (psycopg2.OperationalError) server "
    "closed the connection unexpectedly\n\tThis probably means the server terminated abnormally\n"
    "\n[SQL: UPDATE asset_check_executions SET partition=%(partition)s WHERE run_id = "
    "%(run_id_1)s]\n[parameters: {'partition': 'd1', 'password': 'hunter2'}]\n"
    "(Background on this error at: https://sqlalche.me/e/21/e3q8)\n"
)


def test_the_first_line_stays_the_statement_its_parameters_and_the_link_go() -> None:
    assert plain(SQLALCHEMY_TEXT) == (
        "Exception while writing logger call to event log: (psycopg2.OperationalError) server "
        "closed the connection unexpectedly"
    )
    assert (
        plain("postgresql://u:secret@db/x unreachable")
        == "postgresql://u:[REDACTED]@db/x unreachable"
    )


def test_on_stderr_such_a_text_is_one_line_once_and_anything_else_as_it_comes() -> None:
    out = io.StringIO()
    stream = PlainStream(out)  # type: ignore[arg-type]

    stream.write(SQLALCHEMY_TEXT)
    stream.write(SQLALCHEMY_TEXT)
    stream.write("run 2/6: 25 documents …\n")

    assert out.getvalue() == plain(SQLALCHEMY_TEXT) + "\nrun 2/6: 25 documents …\n"


def test_a_library_log_record_is_plain_and_said_once(capsys: pytest.CaptureFixture[str]) -> None:
    said = f"Retrying failed database connection {uuid.uuid4().hex}"  # new to this process
    with plainly():
        for _ in range(3):
            logging.getLogger().warning("%s: %s", said, SQLALCHEMY_TEXT)
    err = capsys.readouterr().err
    assert err.count(said) == 1
    assert "[SQL:" not in err and "sqlalche.me" not in err and "hunter2" not in err
