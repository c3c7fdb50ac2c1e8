"""Unit tests of ai_pipeline.documents: reading files, normalising text, the content id."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from ai_pipeline.documents import (
    ID_HEX_LENGTH,
    Document,
    DocumentError,
    RejectedFile,
    content_id,
    load,
    normalise_text,
    parse_document,
    read_document,
    reject,
)
from ai_pipeline_tests.support import EXAMPLES, rejected_id

INBOX = EXAMPLES / "inbox"
BAD = EXAMPLES / "bad"
TICKET = INBOX / "support-ticket-refund-delay.txt"
HEX_ID = re.compile(rf"[0-9a-f]{{{ID_HEX_LENGTH}}}")


def _arrival_ns(path: Path) -> int:
    stat = os.stat(path)
    return max(stat.st_mtime_ns, stat.st_ctime_ns)


# --- the content id --------------------------------------------------------------------------


def test_same_bytes_five_times_give_the_same_id(tmp_path: Path) -> None:
    """The same bytes give a byte-identical id every time, directly and read from five files."""
    data = TICKET.read_bytes()
    direct = {content_id(data) for _ in range(5)}
    assert len(direct) == 1
    ids = []
    for i in range(5):
        path = tmp_path / f"copy-{i}.txt"
        path.write_bytes(data)
        ids.append(read_document(path).document_id)
    assert len(set(ids)) == 1
    assert all(isinstance(i, str) and i.encode("ascii") == ids[0].encode("ascii") for i in ids)
    assert ids[0] == read_document(TICKET).document_id


def test_one_changed_letter_changes_the_id(tmp_path: Path) -> None:
    """Changing a single letter of the content gives a different id."""
    data = TICKET.read_bytes()
    position = data.index(b"refund")
    changed = data[:position] + b"R" + data[position + 1 :]
    assert len(changed) == len(data) and changed != data
    original_path, changed_path = tmp_path / "a.txt", tmp_path / "b.txt"
    original_path.write_bytes(data)
    changed_path.write_bytes(changed)
    assert read_document(original_path).document_id != read_document(changed_path).document_id
    assert content_id(data) != content_id(changed)


def test_crlf_and_lf_line_ends_give_the_same_id(tmp_path: Path) -> None:
    """CRLF (and bare CR) line ends normalise to LF, so the id does not change."""
    lf = "Line one\nLine two\n\nLine three\n"
    variants = {
        "lf.txt": lf,
        "crlf.txt": lf.replace("\n", "\r\n"),
        "cr.txt": lf.replace("\n", "\r"),
    }
    ids = set()
    for name, text in variants.items():
        path = tmp_path / name
        path.write_bytes(text.encode("utf-8"))
        doc = read_document(path)
        assert doc.text == "Line one\nLine two\n\nLine three"
        ids.add(doc.document_id)
    assert len(ids) == 1


def test_trailing_spaces_and_blank_lines_do_not_change_the_id(tmp_path: Path) -> None:
    """Trailing spaces, extra blank lines and a byte-order mark are normalised away."""
    plain = tmp_path / "plain.md"
    plain.write_text("# Title\n\nBody text.\n", encoding="utf-8")
    messy = tmp_path / "messy.md"
    messy.write_bytes("\ufeff\n\n# Title   \t\n\n\n\n\nBody text.  \n\n\n".encode())
    assert read_document(plain).document_id == read_document(messy).document_id
    assert read_document(messy).text == "# Title\n\nBody text."


def test_unicode_nfc_normalisation_keeps_the_id(tmp_path: Path) -> None:
    """A decomposed accent (NFD) gives the same id as the composed one (NFC)."""
    composed, decomposed = tmp_path / "nfc.txt", tmp_path / "nfd.txt"
    composed.write_text("Caf\u00e9 Sørensen", encoding="utf-8")
    decomposed.write_text("Cafe\u0301 Sørensen", encoding="utf-8")
    assert read_document(composed).document_id == read_document(decomposed).document_id


def test_normalise_text_collapses_blank_runs_but_keeps_paragraphs() -> None:
    """normalise_text keeps one blank line between paragraphs and strips the ends."""
    assert normalise_text("  \n\na  \r\n\r\n\r\n\r\nb\n\n") == "a\n\nb"


def test_same_content_under_two_file_names_gives_the_same_id(tmp_path: Path) -> None:
    """The id depends on the content only, not on the file name or folder."""
    first = tmp_path / "one" / "invoice.txt"
    second = tmp_path / "two" / "totally-different-name.txt"
    first.parent.mkdir()
    second.parent.mkdir()
    shutil.copyfile(TICKET, first)
    shutil.copyfile(TICKET, second)
    a, b = read_document(first), read_document(second)
    assert a.document_id == b.document_id
    assert (a.source, b.source) == (str(first), str(second))


def test_duplicate_in_bad_folder_has_the_id_of_the_original() -> None:
    """The byte-identical copy in examples/bad loads as a document with the original's id."""
    copy = load(BAD / "copy-of-support-ticket-refund-delay.txt")
    assert isinstance(copy, Document)
    assert copy.document_id == read_document(TICKET).document_id


def test_pdf_id_is_the_hash_of_its_raw_bytes() -> None:
    """A PDF's id comes from its bytes, not from the extracted text."""
    path = INBOX / "q3-report-northwind.pdf"
    doc = read_document(path)
    assert doc.document_id == content_id(path.read_bytes())
    assert doc.document_id != content_id(doc.text.encode("utf-8"))


def test_text_id_is_the_hash_of_the_normalised_text() -> None:
    """A text document's id is the hash of its normalised UTF-8 text."""
    doc = read_document(TICKET)
    assert doc.document_id == content_id(doc.text.encode("utf-8"))


@pytest.mark.parametrize("folder", [INBOX, BAD], ids=["inbox", "bad"])
def test_ids_are_lowercase_hex_of_the_configured_length(folder: Path) -> None:
    """Every id, of a document or of a rejected file, is lower-case hex of ID_HEX_LENGTH."""
    paths = sorted(folder.iterdir())
    assert paths
    for path in paths:
        result = load(path)
        assert len(result.document_id) == ID_HEX_LENGTH == 20
        assert HEX_ID.fullmatch(result.document_id), (path.name, result.document_id)


def test_rejected_id_differs_from_the_document_id_of_the_same_bytes() -> None:
    """A rejection of a readable file never shares the id of the document made of it."""
    rejected = reject(TICKET, "some reason")
    assert rejected.document_id != read_document(TICKET).document_id
    assert rejected.document_id == rejected_id(TICKET)


# --- formats -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind", "phrase"),
    [
        ("contract-freelance-design-agreement.md", "md", "# Freelance Design Services Agreement"),
        ("product-review-aurora-q7-headphones.md", "md", "Aurora Q7"),
        ("q2-report-hangzhou-branch-zh.md", "md", "杭州星禾科技有限公司"),
        ("support-ticket-refund-delay.txt", "txt", "Ticket:      #48213"),
        ("contract-office-lease-shenzhen-zh.txt", "txt", "深圳前海海澜物业管理有限公司"),
        ("news-offshore-wind-farm-approval.html", "html", "Tidewater Renewables"),
        ("news-city-library-opening-zh.html", "html", "云杉图书馆正式向公众开放"),
        ("product-review-brevana-espresso-machine.html", "html", "Brevana Duo 900"),
        ("q3-report-northwind.pdf", "pdf", "Northwind Traders"),
        ("service-agreement-acme-logistics.pdf", "pdf", "Warehousing and Distribution Services"),
        ("trading-update-helix-home-retail.pdf", "pdf", "Helix Home Retail"),
    ],
)
def test_sample_documents_load_with_their_kind_and_text(name: str, kind: str, phrase: str) -> None:
    """Each supported format of the sample inbox loads as a Document with its visible text."""
    path = INBOX / name
    doc = load(path)
    assert isinstance(doc, Document)
    assert doc.kind == kind
    assert doc.source == str(path)
    assert doc.size_bytes == path.stat().st_size
    assert phrase in doc.text
    assert doc.text == normalise_text(doc.text)


def test_every_inbox_sample_loads_and_ids_are_distinct() -> None:
    """All 16 inbox samples load as documents with 16 different ids."""
    docs = [load(p) for p in sorted(INBOX.iterdir())]
    assert len(docs) == 16
    assert all(isinstance(d, Document) for d in docs)
    assert len({d.document_id for d in docs}) == 16


def test_markdown_and_htm_suffixes_map_to_md_and_html(tmp_path: Path) -> None:
    """``.markdown`` is read as md and ``.htm`` as html (upper case suffixes too)."""
    (tmp_path / "a.MARKDOWN").write_text("# Hi\n", encoding="utf-8")
    (tmp_path / "b.htm").write_text("<p>Hello <b>there</b></p>", encoding="utf-8")
    assert read_document(tmp_path / "a.MARKDOWN").kind == "md"
    doc = read_document(tmp_path / "b.htm")
    assert doc.kind == "html"
    # Inline markup does not split a sentence.
    assert doc.text == "Hello there"


@pytest.mark.parametrize(
    ("name", "present", "absent"),
    [
        (
            "news-offshore-wind-farm-approval.html",
            ["Skagen Reef wind farm wins approval after two-year review", "Mette Lund"],
            [
                "| The Coastal Ledger",  # the <title> suffix
                "window.dataLayer",  # <script> in <head>
                "We use cookies",  # <script> at the end of <body>
                "font-family",  # <style>
                "--accent",
                "Subscribe",  # the navigation bar
                "All rights reserved",  # the footer
                "Cookie settings",
            ],
        ),
        (
            "news-city-library-opening-zh.html",
            ["锦江区云杉图书馆正式开馆", "馆长吴佳琪"],
            [
                "- 蓉城晚报网",
                "点击分享到朋友圈",
                "分享成功",
                "广告位加载完成",
                "PingFang SC",
                "下载客户端",  # the channel bar
                "版权所有",  # the footer
                "招聘信息",
            ],
        ),
        (
            "product-review-brevana-espresso-machine.html",
            ["Brevana Duo 900"],
            [
                "expensive disappointment | KitchenBench",
                "application/ld+json",
                "loadDeals",
                "{",
                "Newsletter",  # the navigation bar
                "earns a commission",  # the footer
            ],
        ),
    ],
)
def test_html_samples_keep_only_visible_text(
    name: str, present: list[str], absent: list[str]
) -> None:
    """HTML pages keep their main text (headed by the title they show) and drop <title>,
    <script> and <style> content, navigation bars and footers."""
    text = read_document(INBOX / name).text
    for phrase in present:
        assert phrase in text
    for phrase in absent:
        assert phrase not in text


def test_html_with_head_drops_title_script_style_and_noscript(tmp_path: Path) -> None:
    """Content of <title>, <style>, <script>, <noscript> and <template> never reaches the text."""
    page = tmp_path / "page.html"
    page.write_text(
        "<!DOCTYPE html><html><head><title>TITLE-MARKER</title>"
        "<style>.x{color:red} STYLE-MARKER</style><script>var s='SCRIPT-MARKER';</script>"
        "</head><body><h1>Visible heading</h1><script>BODY-SCRIPT-MARKER()</script>"
        "<noscript>NOSCRIPT-MARKER</noscript><template>TEMPLATE-MARKER</template>"
        "<p>Visible &amp; paragraph</p></body></html>",
        encoding="utf-8",
    )
    text = read_document(page).text
    assert text == "Visible heading\n\nVisible & paragraph"
    assert "MARKER" not in text


def test_html_title_without_explicit_head_is_not_text(tmp_path: Path) -> None:
    """A <title> is not visible text even when the page omits the optional <head> tags."""
    page = tmp_path / "no-head.html"
    page.write_text(
        "<!DOCTYPE html><html><title>TITLE-MARKER</title><body><p>Body text</p></body></html>",
        encoding="utf-8",
    )
    assert read_document(page).text == "Body text"


# --- bad inputs --------------------------------------------------------------------------------

BAD_INPUTS = [
    ("empty.txt", "the file is empty"),
    ("binary-garbage.txt", "not valid UTF-8 text"),
    ("spreadsheet.xlsx", "unsupported file type '.xlsx'"),
    ("scanned-no-text.pdf", "no extractable text"),
]


@pytest.mark.parametrize(("name", "reason"), BAD_INPUTS)
def test_bad_inputs_load_as_rejected_files(name: str, reason: str) -> None:
    """Each bad sample comes back from load() as a RejectedFile whose reason names the problem."""
    path = BAD / name
    result = load(path)
    assert isinstance(result, RejectedFile)
    assert reason in result.reason
    assert result.source == str(path)
    assert result.size_bytes == path.stat().st_size
    assert result.kind == ("other" if path.suffix == ".xlsx" else path.suffix.lstrip("."))


@pytest.mark.parametrize(("name", "reason"), BAD_INPUTS)
def test_bad_inputs_raise_document_error_naming_the_file(name: str, reason: str) -> None:
    """read_document() raises DocumentError with the path, the reason, and both in its message."""
    path = BAD / name
    with pytest.raises(DocumentError) as info:
        read_document(path)
    assert reason in info.value.reason
    assert info.value.path == str(path)
    assert str(info.value) == f"{path}: {info.value.reason}"


def test_binary_garbage_reason_names_the_offending_byte() -> None:
    """The UTF-8 error says at which byte and which byte value decoding failed."""
    with pytest.raises(DocumentError) as info:
        read_document(BAD / "binary-garbage.txt")
    assert info.value.reason == "not valid UTF-8 text (byte 0: b'\\xff')"


def test_unsupported_type_reason_lists_supported_types(tmp_path: Path) -> None:
    """A file without a suffix is rejected and the reason lists the supported suffixes."""
    path = tmp_path / "README"
    path.write_text("hello", encoding="utf-8")
    result = load(path)
    assert isinstance(result, RejectedFile)
    assert result.reason.startswith("unsupported file type '(none)'")
    assert ".txt, .md, .markdown, .html, .htm, .pdf" in result.reason


def test_missing_file_is_a_document_error(tmp_path: Path) -> None:
    """A path that does not exist raises DocumentError saying it cannot be read."""
    path = tmp_path / "gone.txt"
    with pytest.raises(DocumentError) as info:
        read_document(path)
    assert info.value.path == str(path)
    assert info.value.reason.startswith("cannot be read")
    rejected = load(path)
    assert isinstance(rejected, RejectedFile) and rejected.size_bytes == 0


def test_whitespace_only_and_nul_bytes_are_rejected(tmp_path: Path) -> None:
    """Text of only white space or markup, and text with NUL bytes, is not a document."""
    (tmp_path / "blank.txt").write_text(" \n\t\n  ", encoding="utf-8")
    (tmp_path / "markup.html").write_text("<html><body><script>x()</script></body></html>")
    (tmp_path / "nul.txt").write_bytes(b"abc\x00def")
    assert "no text" in load(tmp_path / "blank.txt").reason  # type: ignore[union-attr]
    assert "no text" in load(tmp_path / "markup.html").reason  # type: ignore[union-attr]
    assert "NUL bytes" in load(tmp_path / "nul.txt").reason  # type: ignore[union-attr]


def test_unreadable_pdf_bytes_are_rejected() -> None:
    """Bytes that are not a PDF under a .pdf name are rejected as not a readable PDF."""
    with pytest.raises(DocumentError) as info:
        parse_document(b"this is not a pdf at all", "fake.pdf")
    assert info.value.reason.startswith("not a readable PDF")
    assert info.value.path == "fake.pdf"


def test_oversize_file_is_rejected_via_max_bytes(tmp_path: Path) -> None:
    """A file over max_bytes is rejected with its size and the limit; at the limit it loads."""
    path = tmp_path / "big.txt"
    shutil.copyfile(TICKET, path)
    size = path.stat().st_size
    with pytest.raises(DocumentError) as info:
        read_document(path, max_bytes=size - 1)
    assert info.value.reason == f"too large: {size} bytes, the limit is {size - 1}"
    rejected = load(path, max_bytes=size - 1)
    assert isinstance(rejected, RejectedFile)
    assert rejected.reason.startswith("too large")
    assert isinstance(load(path, max_bytes=size), Document)


def test_load_of_oversize_file_never_reads_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rejecting a file over max_bytes does not read more than max_bytes of it into memory."""
    path = tmp_path / "huge.txt"
    path.write_bytes(b"x" * 200_000)
    sizes_read: list[int] = []
    original = Path.read_bytes

    def spy(self: Path) -> bytes:
        data = original(self)
        sizes_read.append(len(data))
        return data

    monkeypatch.setattr(Path, "read_bytes", spy)
    result = load(path, max_bytes=1_000)
    assert isinstance(result, RejectedFile)
    assert max(sizes_read, default=0) <= 1_000
