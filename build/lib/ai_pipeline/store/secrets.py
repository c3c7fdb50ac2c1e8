"""Secrets shared by every web process on one results database, kept across restarts.

A secret is made once, by whichever process first asks for it (an insert that does nothing when
another process won the race), and read by every other: two ``ai-pipeline serve`` processes, or
one restarted, sign and check with the same key. Only processes that can read the results database
see it, which is what may decide a review item anyway.
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ai_pipeline.store.database import Database
from ai_pipeline.store.documents import utcnow
from ai_pipeline.store.tables import service_secrets


class Secrets:
    def __init__(self, db: Database):
        self.db = db

    def shared(self, name: str) -> bytes:
        """The secret called ``name`` (32 random bytes), made now if no process made it before."""

        def made(conn: Connection) -> str:
            conn.execute(
                self.db.insert(service_secrets)
                .values(name=name, value=secrets.token_hex(32), created_at=utcnow())
                .on_conflict_do_nothing()
            )
            return str(
                conn.execute(
                    sa.select(service_secrets.c.value).where(service_secrets.c.name == name)
                ).scalar_one()
            )

        return bytes.fromhex(self.db.write(made))
