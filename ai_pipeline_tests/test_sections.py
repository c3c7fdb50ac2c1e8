"""Cutting long documents into sections and merging their analyses (plain code)."""

from __future__ import annotations

import pytest

from ai_pipeline.analyses.document_analysis import SUMMARY_CHARS, merge
from ai_pipeline.analyses.document_analysis import DocumentAnalysis as Analysis
from ai_pipeline.declaration import Section, split_sections


def clauses(n: int, words: int = 40) -> str:
    return "\n".join(
        f"{i}. Clause {i} says " + " ".join(f"term{i}x{j}" for j in range(words)) + "."
        for i in range(1, n + 1)
    )


def test_a_short_document_is_one_section() -> None:
    (only,) = split_sections("# Title\n\nA short note.", max_chars=1000)
    assert (only.index, only.title, only.text) == (1, "Title", "# Title\n\nA short note.")


def test_numbered_clauses_are_cut_at_their_numbers_and_joined_up_to_the_budget() -> None:
    text = clauses(60)
    one_clause = max(len(line) for line in text.splitlines())
    sections = split_sections(text, max_chars=one_clause + 1)
    assert len(sections) == 60
    assert [s.title.split(" ", 1)[0] for s in sections] == [f"{i}." for i in range(1, 61)]
    # Up to three clauses fit a section: each section starts at a clause, in order, none lost.
    wider = split_sections(text, max_chars=3 * one_clause + 4)
    assert 20 <= len(wider) < 30
    assert all(s.text[0].isdigit() and len(s.text) <= 3 * one_clause + 4 for s in wider)
    assert "\n".join(s.text.replace("\n\n", "\n") for s in wider) == text


def test_headings_articles_and_chinese_clauses_are_marks() -> None:
    text = "# Scope\nalpha " * 1 + "\n## Terms\nbeta\nArticle 3 Payment\ngamma\n第四条 保密\ndelta"
    titles = [s.title for s in split_sections(text, max_chars=24)]
    assert titles == ["Scope", "Terms", "Article 3 Payment", "第四条 保密"]


def test_without_marks_whole_paragraphs_then_sentences() -> None:
    paragraphs = [f"Paragraph {i} " + "word " * 30 for i in range(10)]
    text = "\n\n".join(p.strip() for p in paragraphs)
    sections = split_sections(text, max_chars=400)
    assert all(len(s.text) <= 400 for s in sections)
    assert [p for s in sections for p in s.text.split("\n\n")] == [p.strip() for p in paragraphs]
    long_paragraph = " ".join(f"Sentence {i} is here." for i in range(200))
    cut = split_sections(long_paragraph, max_chars=100)
    assert all(len(s.text) <= 100 for s in cut)
    assert all(s.text.endswith(".") for s in cut)
    assert split_sections("x" * 250, max_chars=100)[-1].text == "x" * 50


@pytest.mark.parametrize("cut", ["budget", "clauses"])
@pytest.mark.parametrize("budget", [40, 120, 500, 5000])
def test_sections_keep_every_character_in_order(cut: str, budget: int) -> None:
    """Whatever the budget and the way of cutting, the sections hold the whole text in its order:
    only white space between pieces changes (nothing is lost, repeated or moved)."""
    prose = " ".join(f"Sentence {i} of a paragraph that has no marks at all." for i in range(40))
    chinese = "。".join(f"第{i}句话说明了合同的一项义务" for i in range(30)) + "。"
    text = f"{clauses(12)}\n\n{prose}\n\n{'x' * 700}\n\n第一条 租金\n{chinese}\n\n第二条 押金\n两个月。"
    sections = split_sections(text, budget, cut)  # type: ignore[arg-type]
    assert [s.index for s in sections] == list(range(1, len(sections) + 1))
    assert "".join("".join(s.text.split()) for s in sections) == "".join(text.split())
    with pytest.raises(ValueError):
        split_sections(text, 0)


def analysis(**kw: object) -> Analysis:
    base: dict[str, object] = {
        "keywords": ["k"],
        "summary": "s",
        "sentiment": "neutral",
        "entities": [],
        "confidence": 0.9,
    }
    return Analysis.model_validate({**base, **kw})


def part(index: int, length: int, **fields: object) -> tuple[Section, Analysis]:
    return Section(index, f"s{index}", "x" * length), analysis(**fields)


def test_merge_weighs_sections_and_keeps_the_schema() -> None:
    a = part(1, 100, keywords=["Rent", "Term"], summary="First part.", sentiment="negative",
             entities=["Acme", "Oslo"], confidence=0.95)  # fmt: skip
    b = part(2, 300, keywords=["rent", "Deposit"], summary="Second.", sentiment="positive",
             entities=["acme", "Bergen"], confidence=0.8)  # fmt: skip
    c = part(3, 150, keywords=["Notice"], summary="Third.", sentiment="negative", confidence=0.9)
    merged = merge([a, b, c])
    assert merged.keywords == ["Rent", "Term", "Deposit"]  # twice first, then by first place
    assert merged.entities == ["Acme", "Oslo", "Bergen"]
    assert merged.summary == "First part. Second. Third."
    assert merged.sentiment == "positive"  # 300 characters against 250
    assert merged.confidence == 0.8
    long = merge([part(i, 1, summary="y" * 150) for i in range(1, 4)])
    assert len(long.summary) <= SUMMARY_CHARS
    Analysis.model_validate(merged.model_dump())
    assert merge([a]) == a[1]


def test_merge_keeps_the_twenty_most_named_entities() -> None:
    """Sections naming 35 entities merge into the 20 named most often (then first), within the
    output model's bound."""
    names = [f"Party {i}" for i in range(35)]
    parts = [part(1, 10, entities=names[:20]), part(2, 10, entities=names[15:35])]
    merged = merge(parts)
    assert merged.entities == names[15:20] + names[:15]
    Analysis.model_validate(merged.model_dump())
