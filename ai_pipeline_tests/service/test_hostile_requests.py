"""The submission service under hostile requests, on a real ``serve`` process: input a database
cannot store is a 4xx on SQLite and PostgreSQL alike; one set of name rules for JSON and
multipart; limits enforced before a body is read; URLs never taken from the ``Host`` header."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from ai_pipeline_tests.dagster_procs import DagsterProcess
from ai_pipeline_tests.service.conftest import (
    OPERATOR_KEY,
    auth,
    failed_into_review,
    serving,
    submit_text,
)
from ai_pipeline_tests.support import results_store, sample_text

OPERATOR = ("alice", OPERATOR_KEY)


def upload(url: str, name: str, data: bytes) -> httpx.Response:
    """A multipart upload whose file name is sent as written, UTF-8, control characters and
    backslashes included (httpx would percent-encode or escape them, as browsers do)."""
    boundary = "hostile-boundary-7d1e"
    body = (
        (
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="file"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return httpx.post(
        f"{url}/api/v1/tasks",
        content=body,
        headers=auth("acme") | {"content-type": f"multipart/form-data; boundary={boundary}"},
        timeout=30,
    )


def raw_json(url: str, body: str) -> httpx.Response:
    """A JSON body sent as written (escapes such as ``\\u0000`` left to the server)."""
    return httpx.post(
        f"{url}/api/v1/tasks",
        content=body.encode(),
        headers=auth("acme") | {"content-type": "application/json"},
        timeout=30,
    )


def test_what_a_database_cannot_store_is_refused_on_both_backends(
    service: DagsterProcess, tmp_path: Path
) -> None:
    """NUL in a task id (GET, DELETE, events), in a JSON name, a multipart file name, JSON text
    and a review item's id or reason, and a lone surrogate in JSON text: each a 4xx, never a 5xx,
    nothing recorded, no traceback in the service's log."""
    url = service.url
    answers = {
        "GET id": httpx.get(f"{url}/api/v1/tasks/%00", headers=auth("acme"), timeout=30),
        "GET id inside": httpx.get(
            f"{url}/api/v1/tasks/ab%00cd-analyse-v1-00000000", headers=auth("acme"), timeout=30
        ),
        "DELETE id": httpx.delete(f"{url}/api/v1/tasks/%00", headers=auth("acme"), timeout=30),
        "events id": httpx.get(f"{url}/api/v1/tasks/%00/events", headers=auth("acme"), timeout=30),
        "JSON name": raw_json(url, '{"text": "Acme Corp grew.", "name": "a\\u0000b.txt"}'),
        "JSON text": raw_json(url, '{"text": "Acme\\u0000Corp grew.", "name": "a.txt"}'),
        "JSON surrogate": raw_json(url, '{"text": "Acme \\ud800 grew.", "name": "a.txt"}'),
        "multipart name": upload(url, "a\x00b.txt", b"Acme Corp grew."),
        "multipart text": upload(url, "a.txt", b"Acme\x00Corp grew."),
        "review id": httpx.post(
            f"{url}/review/%00/reject", data={"reason": "x"}, auth=OPERATOR, timeout=30
        ),
        "thumbnail id": httpx.get(f"{url}/review/%00/thumbnail.png", auth=OPERATOR, timeout=30),
    }
    for what, response in answers.items():
        assert 400 <= response.status_code < 500, (what, response.status_code, response.text)
    assert results_store().documents.rows() == []

    # A reason with a NUL, on a real item's form.
    task = submit_text(url, "acme", sample_text(8101))
    document_id = failed_into_review("acme", task)
    page = httpx.get(f"{url}/review", auth=OPERATOR, timeout=30).text
    token = page.split('name="token" value="', 1)[1].split('"', 1)[0]
    nul_reason = httpx.post(
        f"{url}/review/{document_id}/reject",
        data={"token": token, "reason": "bad\x00scan"},
        auth=OPERATOR,
        timeout=30,
    )
    assert nul_reason.status_code == 400 and "NUL" in nul_reason.text
    assert results_store().reviews.messages(document_id) == []
    log = service.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "Internal Server Error" not in log, log[-3000:]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_one_set_of_name_rules_for_json_and_multipart(service: DagsterProcess) -> None:
    """A path (``/`` or ``\\``) is cut to its last part; over 255 characters, a control character,
    an unsupported suffix: 422, whether the name came as JSON or as a multipart file name."""
    url = service.url
    long_name = "n" * 300 + ".txt"
    for name, status in [
        (long_name, 422),
        ("bad\x07name.txt", 422),
        ("tab\tname.txt", 422),
        ("tool.exe", 422),
    ]:
        as_json = raw_json(url, json.dumps({"text": "Acme Corp grew.", "name": name}))
        as_file = upload(url, name, b"Acme Corp grew.")
        assert (as_json.status_code, as_file.status_code) == (status, status), (
            name,
            as_json.text,
            as_file.text,
        )
    stored = []
    for i, name in enumerate(["c:\\users\\ann\\notes.txt", "../../etc/notes.txt"]):
        text = f"Acme Corp grew {i} percent."
        as_json = raw_json(url, json.dumps({"text": text, "name": name}))
        as_file = upload(url, name, f"Globex {text}".encode())
        assert (as_json.status_code, as_file.status_code) == (202, 202), (
            as_json.text,
            as_file.text,
        )
        stored += [as_json.json()["task_id"], as_file.json()["task_id"]]
    names = {
        t["task_id"]: t["name"]
        for t in httpx.get(f"{url}/api/v1/tasks", headers=auth("acme"), timeout=30).json()["tasks"]
    }
    assert [names[t] for t in stored] == ["notes.txt"] * 4


def raw_request(port: int, head: str, body: bytes = b"") -> tuple[int, float]:
    """Send a request as written on a socket (no body unless given) and read the status line:
    the status and how long the answer took."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        status_line = s.makefile("rb").readline().decode()
    return int(status_line.split()[1]), time.perf_counter() - started


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_body_over_the_limit_is_refused_before_it_is_read(service: DagsterProcess) -> None:
    """A declared Content-Length of 50 MB is answered 413 without a byte of the body being
    sent (the server does not wait for it); a chunked body with no length is refused once it
    passes the limit, answered before the body has ended; a Content-Length that is not a number
    is 400."""
    assert service.port
    key = auth("acme")["Authorization"]
    for kind in ("application/json", "multipart/form-data; boundary=x"):
        status, seconds = raw_request(
            service.port,
            "POST /api/v1/tasks HTTP/1.1\nHost: 127.0.0.1\n"
            f"Authorization: {key}\nContent-Type: {kind}\nContent-Length: 50000000\n",
        )
        assert status == 413 and seconds < 10, (kind, status, seconds)

    # 11 MiB of a chunked JSON body (its limit is twice 5 MiB and 64 KiB), and never its last
    # chunk: the answer comes while the body is still open, so the server did not wait for it.
    chunk = b"%x\r\n" % (1024 * 1024) + b"a" * (1024 * 1024) + b"\r\n"
    status, seconds = raw_request(
        service.port,
        "POST /api/v1/tasks HTTP/1.1\nHost: 127.0.0.1\n"
        f"Authorization: {key}\nContent-Type: application/json\nTransfer-Encoding: chunked\n",
        chunk * 11,
    )
    assert status == 413 and seconds < 15, (status, seconds)
    status, _ = raw_request(
        service.port,
        "POST /api/v1/tasks HTTP/1.1\nHost: 127.0.0.1\n"
        f"Authorization: {key}\nContent-Type: application/json\nContent-Length: 12abc\n",
    )
    assert status == 400
    assert results_store().documents.rows() == []


def no_host_in(response: httpx.Response, host: str = "evil.example") -> None:
    text = response.text + json.dumps(dict(response.headers))
    assert host not in text, (response.request.url, response.status_code, text[:2000])


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_host_header_changes_no_url(service: DagsterProcess, tmp_path: Path) -> None:
    """With ``Host: evil.example`` on every request, no response (the submission's poll and
    SSE URLs, the task, its stream, the review page's links and forms, a decision's redirect)
    names that host: the URLs start with the configured public URL; a service without one hands
    out paths."""
    evil = {"Host": "evil.example"}
    url = service.url
    submitted = httpx.post(
        f"{url}/api/v1/tasks",
        json={"text": sample_text(8201), "name": "host.txt"},
        headers=auth("acme") | evil,
        timeout=30,
    )
    assert submitted.status_code == 202, submitted.text
    no_host_in(submitted)
    task = submitted.json()["task_id"]
    assert submitted.json()["poll_url"] == f"{url}/api/v1/tasks/{task}"
    assert submitted.json()["sse_url"] == f"{url}/api/v1/tasks/{task}/events"
    for path in (f"/api/v1/tasks/{task}", "/api/v1/tasks", "/openapi.json", "/docs"):
        no_host_in(httpx.get(url + path, headers=auth("acme") | evil, timeout=30))
    with httpx.stream(
        "GET", f"{url}/api/v1/tasks/{task}/events", headers=auth("acme") | evil, timeout=30
    ) as stream:
        lines = stream.iter_lines()
        first = next(lines) + next(lines)
    assert "evil.example" not in first

    document_id = failed_into_review("acme", task)
    page = httpx.get(f"{url}/review", headers=evil, auth=OPERATOR, timeout=30)
    no_host_in(page)
    assert f'action="{url}/review/{document_id}/reject"' in page.text
    token = page.text.split('name="token" value="', 1)[1].split('"', 1)[0]
    decided = httpx.post(
        f"{url}/review/{document_id}/reject",
        data={"token": token, "reason": "unreadable"},
        headers=evil,
        auth=OPERATOR,
        timeout=30,
    )
    assert decided.status_code == 303
    no_host_in(decided)
    assert decided.headers["location"].startswith(f"{url}/review?")

    # Without a public URL: paths, whatever the Host.
    with serving(tmp_path / "paths.log", ["--public-url", ""]) as bare:
        again = httpx.post(
            f"{bare.url}/api/v1/tasks",
            json={"text": sample_text(8202), "name": "host.txt"},
            headers=auth("acme") | evil,
            timeout=30,
        )
        assert again.status_code == 202, again.text
        other = again.json()["task_id"]
        assert again.json()["poll_url"] == f"/api/v1/tasks/{other}"
        assert again.json()["sse_url"] == f"/api/v1/tasks/{other}/events"
        other_doc = failed_into_review("acme", other)
        bare_page = httpx.get(f"{bare.url}/review", headers=evil, auth=OPERATOR, timeout=30)
        no_host_in(bare_page)
        assert f'action="/review/{other_doc}/reject"' in bare_page.text
