"""Answer extraction and exact comparison (decimal.Decimal, never floats).

strict: the value after the first `####` of the generated text (already cut at a stop).
flexible: the last number anywhere in the text.
Numbers: thousands commas (5,600), a minus sign (-3, or U+2212), a `$`, trailing zeros
($18.00), a period that ends a sentence (18.) are all handled; a bare comma is no number.
"""
import re
from decimal import Decimal, InvalidOperation

# A number: optional sign, optional $, then either comma-grouped thousands or plain digits,
# (a minus right after a word character is a hyphen, "5-6"),
# then an optional fraction that must have digits (so "18." stops before the period).
_NUM = r"(?:(?<!\w)[-\u2212])?\$?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
NUM_RE = re.compile(_NUM)
STRICT_RE = re.compile(r"####\s*(" + _NUM + ")")


def normalize(s: str | None) -> str | None:
    """A number's text to a canonical decimal string ('$1,800.00' -> '1800'), or None."""
    if s is None:
        return None
    t = s.replace("\u2212", "-").replace("$", "").replace(",", "").replace(" ", "").strip()
    if t.endswith("."):
        t = t[:-1]
    try:
        d = Decimal(t)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    d = d.normalize()
    out = format(d, "f")
    return "0" if out in ("-0", "0") else out


def strict(text: str) -> str | None:
    m = STRICT_RE.search(text)
    return normalize(m.group(1)) if m else None


def flexible(text: str) -> str | None:
    found = NUM_RE.findall(text)
    return normalize(found[-1]) if found else None


def gold(answer: str) -> str:
    """The dataset's gold value: after the final '####' of the worked answer."""
    v = normalize(answer.rsplit("####", 1)[-1].strip())
    if v is None:
        raise ValueError(f"gold answer has no number after '####': {answer[-60:]!r}")
    return v


def same(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    return Decimal(a) == Decimal(b)


def score(text: str, gold_value: str) -> dict:
    """strict, flexible, the scored answer (strict, else flexible), correct, invalid."""
    s, f = strict(text), flexible(text)
    ans = s if s is not None else f
    return {"strict": s, "flexible": f, "answer": ans, "correct": same(ans, gold_value),
            "invalid": ans is None, "strict_invalid": s is None}
