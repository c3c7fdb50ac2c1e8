"""Unit tests of ai_pipeline.states: the per-document state machine."""

from __future__ import annotations

import itertools

import pytest

from ai_pipeline.states import TERMINAL, TRANSITIONS, IllegalTransition, State, check_transition

S = State
# The diagram of the module docstring, written out independently of the TRANSITIONS table.
EXPECTED_ALLOWED = {
    (S.PENDING, S.QUEUED),
    (S.PENDING, S.CANCELLED),
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.CANCELLED),
    (S.QUEUED, S.FAILED),
    (S.RUNNING, S.COMPLETED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.QUEUED),
    (S.FAILED, S.QUEUED),
    (S.FAILED, S.DEAD_LETTER),
    (S.DEAD_LETTER, S.QUEUED),
}

ILLEGAL_SAMPLE = [
    (S.PENDING, S.RUNNING),
    (S.PENDING, S.COMPLETED),
    (S.QUEUED, S.COMPLETED),
    (S.PENDING, S.FAILED),
    (S.RUNNING, S.PENDING),
    (S.RUNNING, S.CANCELLED),
    (S.FAILED, S.COMPLETED),
    (S.DEAD_LETTER, S.RUNNING),
    (S.COMPLETED, S.RUNNING),
    (S.COMPLETED, S.QUEUED),
    (S.CANCELLED, S.QUEUED),
    (S.CANCELLED, S.PENDING),
]


def _ids(pair: tuple[State, State]) -> str:
    return f"{pair[0].value}->{pair[1].value}"


def test_transitions_table_matches_the_documented_diagram() -> None:
    """The TRANSITIONS table allows exactly the moves drawn in the module's diagram."""
    table = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert table == EXPECTED_ALLOWED


def test_every_state_has_an_entry_and_terminal_states_have_no_exit() -> None:
    """Every State is a key of TRANSITIONS, and COMPLETED and CANCELLED lead nowhere."""
    assert set(TRANSITIONS) == set(State)
    assert {S.COMPLETED, S.CANCELLED} == TERMINAL
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()


def test_state_values_are_their_names() -> None:
    """Each State's value is its name, so the database column holds readable strings."""
    assert [s.value for s in State] == [s.name for s in State]
    assert State("DEAD_LETTER") is S.DEAD_LETTER


@pytest.mark.parametrize("pair", sorted(EXPECTED_ALLOWED), ids=_ids)
def test_every_allowed_transition_passes(pair: tuple[State, State]) -> None:
    """Each allowed transition is accepted without an error."""
    assert check_transition("doc-1", *pair) is None


@pytest.mark.parametrize("pair", ILLEGAL_SAMPLE, ids=_ids)
def test_illegal_transitions_raise_naming_both_states(pair: tuple[State, State]) -> None:
    """An illegal transition raises IllegalTransition whose message names both states."""
    current, target = pair
    with pytest.raises(IllegalTransition) as info:
        check_transition("doc-42", current, target)
    error = info.value
    assert (error.document_id, error.current, error.target) == ("doc-42", current, target)
    message = str(error)
    assert f"document doc-42: {current.value} -> {target.value} is not allowed" in message
    allowed = ", ".join(sorted(s.value for s in TRANSITIONS[current])) or "none"
    assert message.endswith(f"(allowed from {current.value}: {allowed})")


def test_illegal_transition_message_from_a_terminal_state_says_none() -> None:
    """From a terminal state the message says no transition is allowed."""
    with pytest.raises(IllegalTransition, match=r"allowed from COMPLETED: none\)$"):
        check_transition("d", S.COMPLETED, S.FAILED)


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.value)
def test_same_state_is_a_no_op(state: State) -> None:
    """Moving a document to the state it is already in is allowed, even from a terminal state."""
    assert check_transition("doc-1", state, state) is None


@pytest.mark.parametrize("pair", list(itertools.product(State, State)), ids=lambda p: _ids(p))
def test_full_product_agrees_with_the_table(pair: tuple[State, State]) -> None:
    """For every (current, target) pair, check_transition accepts exactly what the table allows."""
    current, target = pair
    allowed = current == target or target in TRANSITIONS[current]
    assert allowed == (current == target or pair in EXPECTED_ALLOWED)
    if allowed:
        check_transition("doc-1", current, target)
    else:
        with pytest.raises(IllegalTransition) as info:
            check_transition("doc-1", current, target)
        assert current.value in str(info.value) and target.value in str(info.value)
