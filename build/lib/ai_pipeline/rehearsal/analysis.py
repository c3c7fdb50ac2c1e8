"""The simulator's analysis: what a model would answer about a document, from its text alone.

Keywords, summary, sentiment, entities and confidence are computed deterministically, so the same
document always gets the same answer, in English and in Chinese. The instructions a document may
carry ("answer I don't know") are followed the way a model would. Nothing here speaks HTTP.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from typing import Any

MAX_SUMMARY_CHARS = 200
MAX_ENTITIES = 10

_CJK_CLASS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{_CJK_CLASS}]")
_CJK_RUN = re.compile(f"[{_CJK_CLASS}]+")
_LATIN = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f"
_WORD = re.compile(f"[{_LATIN}]+(?:['’][{_LATIN}]+)*")
# Entity tokens may carry digits and inner hyphens ("Q3", "Jean-Luc", "AT&T").
_NAME_TOKEN = re.compile(f"[{_LATIN}][{_LATIN}0-9'’&-]*")


def _words(text: str) -> frozenset[str]:
    """The whitespace-separated words of a literal: long word lists stay readable."""
    return frozenset(text.split())


_STOPWORDS = _words(
    """
    about above across after again against almost along already also although always among
    another around because been before behind being below between both could does doing done
    down during each either else enough even ever every from further have having hello hence
    here hers herself himself however into itself just less like made make many might more
    most much must myself near neither never next none nothing once only onto other others
    otherwise ours ourselves over please quite rather really regards same shall should since
    some such than thank thanks that their theirs them themselves then there therefore these
    they this those though through thus till together toward towards under unless until upon
    very want well were what whatever when whenever where whether which while whom whose why
    will with within without would yes your yours yourself yourselves dear sincerely kind best
    also still sure sent send today yesterday tomorrow
    """
)

# Capitalised words that start sentences or letters rather than name anything.
_ENTITY_STOPWORDS = _words(
    """
    The This That These Those There Then Their They Them We Our Ours Us It Its In On At A An If
    Please Dear Thank Thanks Hello Hi Hey Yes No Not None However Unfortunately Fortunately Also
    After Before When While Since Because As But And Or Nor So He She His Her Him You Your Yours
    My Me I What Why How Who Whom Where Which All Some Many Most Each Every Any Both For From To
    With Without By Of Best Kind Regards Sincerely Cheers Overall Today Yesterday Tomorrow Here
    Note Subject Re Fwd Sorry Hope Let Could Would Should Can Will Shall May Might Must Is Are
    Was Were Do Does Did Has Have Had Be Been Being One Two Three Just Only Even Still Again
    Finally First Second Third Next Last Meanwhile Moreover Furthermore Therefore Thus Although
    Though Despite During Until Over Under About Into Once Now Well Ok Okay Regarding Following
    Attached Unless Whether Such Other Another Several Also Instead Yet Perhaps Maybe Otherwise
    """
)
_MONTHS_AND_DAYS = _words(
    """
    January February March April May June July August September October November December
    Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec Monday Tuesday Wednesday Thursday Friday
    Saturday Sunday Mon Tue Tues Wed Thu Thur Thurs Fri Sat Sun
    """
)

_TITLES = _words("Dr Mr Mrs Ms Prof Sir Dame St")

# Characters that glue Chinese sentences together; a bigram containing one is rarely a topic.
_CJK_FUNCTION_CHARS = frozenset(
    "的了是在和有我们这个为与等也就都而及或被把对从到将向但并其之于以不没很会能要你他她它该此那些还又已让给由吗呢吧啊所一次"
)
# Frequent two-character adverbs and connectives made of content characters.
_CJK_STOP_BIGRAMS = _words(
    "非常 已经 需要 可以 因为 所以 但是 如果 进行 通过 现在 今天 表示 认为 然后 虽然 还是 就是 "
    "只是 或者 以及 之后 之前 以后 其中 目前 时候 非常 十分 比较 特别 一直 仍然"
)

_POSITIVE_EN = _words(
    """
    excellent delighted growth resolved great good happy pleased satisfied grateful appreciate
    appreciated outstanding success successful improved improvement efficient reliable
    recommend love fantastic impressive profit profitable smooth helpful wonderful exceeded
    perfect praise thrilled
    """
)
_NEGATIVE_EN = _words(
    """
    delay delayed delays broken refund complaint complaints outage loss losses damaged late poor
    bad terrible disappointed disappointing angry frustrated unacceptable failure failed cancel
    cancelled problem problems defective missing worst decline declined unhappy slow
    """
)
_POSITIVE_ZH = _words(
    "满意 增长 感谢 优秀 高兴 喜欢 出色 成功 顺利 提升 改善 表扬 推荐 好评 及时 专业 稳定 盈利 "
    "超出预期 解决 感激 开心 完美 可靠 信任 进步 突破 赞赏 愉快 高效"
)
_NEGATIVE_ZH = _words(
    "投诉 延迟 故障 损失 退款 失望 不满意 不满 错误 损坏 破损 缓慢 差评 糟糕 愤怒 下降 亏损 "
    "取消 丢失 延误 中断 失败 拖延 抱怨 退货 缺陷 罚款 未解决 没有解决 问题"
)
# Longest first, so that 不满意 is counted once as negative and not again as 满意.
_ZH_LEXICON = sorted(
    [(w, 1) for w in _POSITIVE_ZH] + [(w, -1) for w in _NEGATIVE_ZH],
    key=lambda p: (-len(p[0]), p[0]),
)

# A period ends a sentence only when followed by whitespace (so "3.5" and "acme.com" survive),
# and not after these abbreviations.
_ABBREVIATIONS = frozenset({"dr", "mr", "mrs", "ms", "prof", "st", "e.g", "i.e", "vs", "approx"})

_DONT_KNOW_EN = re.compile(
    r"\b(?:answer|reply|respond|say|write)(?:\s+(?:with|only|just|exactly|simply))*\s*[:\-]?\s*"
    r"[\"'“”‘’]?\s*i\s+don['’]?t\s+know",
    re.IGNORECASE,
)
_DONT_KNOW_ZH = re.compile(r"(?:回答|回复|答复|说)\s*[:：]?\s*[\"'“”‘’「『]?\s*我不知道")


def is_chinese(text: str) -> bool:
    """True when Han characters outnumber latin letters: the text is treated as Chinese."""
    cjk = len(_CJK_CHAR.findall(text))
    latin = sum(1 for ch in text if ch.isalpha() and not _CJK_CHAR.match(ch))
    return cjk > 0 and cjk >= latin


def estimate_tokens(text: str) -> int:
    """Roughly what a BPE tokenizer would count: one per Han character, one per 4 other chars."""
    cjk = len(_CJK_CHAR.findall(text))
    return cjk + math.ceil((len(text) - cjk) / 4)


def _english_keywords(text: str) -> list[str]:
    counts: Counter[str] = Counter()
    for raw in _WORD.findall(text):
        word = raw.lower().replace("’", "'").removesuffix("'s")
        if len(word) >= 4 and "'" not in word and word not in _STOPWORDS:
            counts[word] += 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [word for word, _ in ranked[:3]]


def _chinese_keywords(text: str) -> list[str]:
    counts: Counter[str] = Counter()
    first_seen: dict[str, int] = {}
    for run in _CJK_RUN.finditer(text):
        chars = run.group(0)
        # Blank out stop bigrams (same length, so positions hold) so that their characters do
        # not pair up with neighbours either: 非常满意 must give 满意, not 常满.
        for stop in sorted(_CJK_STOP_BIGRAMS):
            chars = chars.replace(stop, "  ")
        for i in range(len(chars) - 1):
            bigram = chars[i : i + 2]
            if " " in bigram or not _CJK_FUNCTION_CHARS.isdisjoint(bigram):
                continue
            counts[bigram] += 1
            first_seen.setdefault(bigram, run.start() + i)
    ranked = sorted(counts, key=lambda b: (-counts[b], first_seen[b]))
    chosen: list[str] = []
    for bigram in ranked:
        # Sliding bigrams overlap ("物流延迟" gives 物流, 流延, 延迟); sharing a character with a
        # better-ranked keyword usually means a fragment straddling two words.
        if any(set(bigram) & set(kept) for kept in chosen):
            continue
        chosen.append(bigram)
        if len(chosen) == 3:
            break
    return chosen


def extract_keywords(text: str) -> list[str]:
    """1 to 3 keywords: the most frequent content words (or Chinese bigrams) of the text."""
    keywords = _chinese_keywords(text) if is_chinese(text) else _english_keywords(text)
    if not keywords:
        keywords = _english_keywords(text) or _chinese_keywords(text)
    if not keywords:
        words = _WORD.findall(text) or _CJK_RUN.findall(text) or text.split()
        keywords = [words[0].lower()[:40]] if words else ["document"]
    return keywords


def first_sentence(text: str) -> str:
    """The first sentence of the text with whitespace collapsed (the whole text if it has none)."""
    flat = " ".join(text.split())
    for match in re.finditer(r"[.!?](?=\s|$)|[。！？]", flat):
        end = match.end()
        if match.group(0) == ".":
            before = flat[: match.start()].rsplit(" ", 1)[-1].lower()
            if before in _ABBREVIATIONS:
                continue
        sentence = flat[:end].strip()
        if any(ch.isalnum() for ch in sentence):
            return sentence
    return flat


def summarise(text: str, limit: int = MAX_SUMMARY_CHARS) -> str:
    """The first sentence, cut at a word boundary with an ellipsis when longer than ``limit``."""
    sentence = first_sentence(text)
    if len(sentence) <= limit:
        return sentence
    cut = sentence[: limit - 1]
    space = cut.rfind(" ")
    # Chinese has no spaces; a boundary far back would throw most of the sentence away.
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:-–—") + "…"


def score_sentiment(text: str) -> int:
    """Positive minus negative lexicon hits (English words and Chinese phrases)."""
    score = 0
    for raw in _WORD.findall(text):
        word = raw.lower()
        if word in _POSITIVE_EN:
            score += 1
        elif word in _NEGATIVE_EN:
            score -= 1
    remaining = text
    for phrase, weight in _ZH_LEXICON:
        hits = remaining.count(phrase)
        if hits:
            score += weight * hits
            remaining = remaining.replace(phrase, " ")
    return score


def sentiment_label(text: str) -> str:
    score = score_sentiment(text)
    return "positive" if score > 0 else "negative" if score < 0 else "neutral"


def _starts_sentence(text: str, start: int) -> bool:
    before = text[:start].rstrip()
    if not before or "\n" in text[len(before) : start]:
        return True
    return before[-1] in '.!?。！？:;"“(-•*'


def extract_entities(text: str, limit: int = MAX_ENTITIES) -> list[str]:
    """Runs of capitalised words, minus sentence openers, months and days; verbatim substrings."""
    spans: list[tuple[int, int, str]] = []
    for match in _NAME_TOKEN.finditer(text):
        word = match.group(0).rstrip("'’-&")
        for suffix in ("'s", "’s"):
            word = word.removesuffix(suffix)
        spans.append((match.start(), match.start() + len(word), word))
    lowercase_words = {w.lower() for _, _, w in spans if w[:1].islower()}

    entities: list[str] = []
    segment: list[tuple[int, int, str]] = []

    def flush() -> None:
        if not segment:
            return
        start, end = segment[0][0], segment[-1][1]
        single = len(segment) == 1
        # A lone capitalised word opening a sentence is only a name if the text never uses it
        # in lower case ("Shipping was late ... the shipping" is not an entity).
        common = (
            single and _starts_sentence(text, start) and segment[0][2].lower() in lowercase_words
        )
        name = text[start:end]
        bare_title = single and segment[0][2] in _TITLES
        if not common and not bare_title and name not in entities:
            entities.append(name)
        segment.clear()

    previous_end: int | None = None
    for start, end, word in spans:
        capitalised = len(word) >= 2 and word[0].isupper()
        excluded = word in _ENTITY_STOPWORDS or word in _MONTHS_AND_DAYS
        gap = text[previous_end:start] if previous_end is not None else None
        # "Dr. Nora Vance": a title's period does not end the name.
        adjacent = gap == " " or (gap == ". " and bool(segment) and segment[-1][2] in _TITLES)
        if not capitalised or excluded or not adjacent:
            flush()
        if capitalised and not excluded:
            segment.append((start, end, word))
        previous_end = end
    flush()
    return entities[:limit]


def confidence_for(text: str) -> float:
    """A stable pseudo-confidence in [0.80, 0.97] derived from the text's hash."""
    digest = int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16)
    return round(0.80 + (digest % 18) / 100, 2)


def analyse(text: str) -> dict[str, Any]:
    """The simulator's deterministic analysis of a document, as the model's JSON answer."""
    return {
        "keywords": extract_keywords(text),
        "summary": summarise(text),
        "sentiment": sentiment_label(text),
        "entities": extract_entities(text),
        "confidence": confidence_for(text),
    }


def dont_know_reply(text: str) -> str | None:
    """The reply of a model that follows an instruction in the text to answer "I don't know"."""
    if _DONT_KNOW_ZH.search(text):
        return "我不知道。"
    if _DONT_KNOW_EN.search(text):
        return "I don't know."
    return None
