"""The per-document state machine, enforced in one place: ``check_transition``.

::

    PENDING ──► QUEUED ──► RUNNING ──► COMPLETED
       │          │  ▲        │
       │          │  └────────┤ (the run that held it died)
       ▼          ▼           ▼
    CANCELLED  CANCELLED    FAILED ──► DEAD_LETTER
                              │            │
                              └──► QUEUED ◄┘ (retry / requeue by a person)

    QUEUED ──► FAILED (the run it was given to ended before it started the document)

An illegal transition is an error, never a silent overwrite. Moving to the state a document is
already in is a no-op and allowed: a retried request must not fail because it already happened.
"""

from __future__ import annotations

import enum


class State(str, enum.Enum):
    PENDING = "PENDING"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    DEAD_LETTER = "DEAD_LETTER"
    CANCELLED = "CANCELLED"


TRANSITIONS: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.QUEUED, State.CANCELLED}),
    # QUEUED -> FAILED: the run the document was given to ended before starting it (its worker
    # killed, its launch failed); left QUEUED, nothing would ever retry it.
    State.QUEUED: frozenset({State.RUNNING, State.CANCELLED, State.FAILED}),
    # RUNNING -> QUEUED: the run that held the document died (killed, crashed) and a new run picks
    # it up; a message queue redelivers what a dead worker never acknowledged, a dead run does not.
    State.RUNNING: frozenset({State.COMPLETED, State.FAILED, State.QUEUED}),
    State.FAILED: frozenset({State.QUEUED, State.DEAD_LETTER}),
    State.DEAD_LETTER: frozenset({State.QUEUED}),
    State.COMPLETED: frozenset(),
    State.CANCELLED: frozenset(),
}

TERMINAL = frozenset({State.COMPLETED, State.CANCELLED})


class IllegalTransition(Exception):
    def __init__(self, document_id: str, current: State, target: State):
        super().__init__(
            f"document {document_id}: {current.value} -> {target.value} is not allowed "
            f"(allowed from {current.value}: "
            f"{', '.join(sorted(s.value for s in TRANSITIONS[current])) or 'none'})"
        )
        self.document_id = document_id
        self.current = current
        self.target = target


def check_transition(document_id: str, current: State, target: State) -> None:
    if current != target and target not in TRANSITIONS[current]:
        raise IllegalTransition(document_id, current, target)
