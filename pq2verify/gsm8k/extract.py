"""Answer extraction and exact comparison (rationals, never floats).

strict: the value after the first `####` of the generated text (already cut at a stop).
flexible: the last number anywhere in the text.
Numbers: thousands grouped by commas (5,600) or by spaces (1 000, also no-break and thin
spaces), a minus sign (-3, or U+2212), a `$`, trailing zeros ($18.00), a leading point (.5),
a fraction of integers (1/2), a period that ends a sentence (18.) are all handled; a bare comma
is no number. Values are compared as exact rationals (fractions.Fraction): 1/2 == 0.5.
"""
import re
from fractions import Fraction

_SP = "[ \u00a0\u2009\u202f]"           # space, no-break space, thin space, narrow no-break space
# An unsigned number: comma- or space-grouped thousands, or plain digits, then an optional
# fraction that must have digits (so "18." stops before the period); or a leading point (.5)
# not glued to a word or another point; or a fraction of integers (1/2).
_INT = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d{1,3}(?:" + _SP + r"\d{3})+(?![\d,])|\d+)"
_UNSIGNED = (r"(?:\d+/\d+(?![\d/])"
             r"|" + _INT + r"(?:\.\d+)?"
             r"|(?<![\w.])\.\d+)")
# optional sign (a minus right after a word character is a hyphen, "5-6"), optional $
_NUM = r"(?:(?<!\w)[-\u2212])?\$?" + _UNSIGNED
NUM_RE = re.compile(_NUM)
STRICT_RE = re.compile(r"####\s*(" + _NUM + ")")


def value(s: str | None) -> Fraction | None:
    """A number's text to an exact rational ('$1,800.00' -> 1800, '1/2' -> 1/2), or None."""
    if s is None:
        return None
    t = re.sub(_SP, "", s.replace("\u2212", "-").replace("$", "").replace(",", "")).strip()
    if t.endswith("."):
        t = t[:-1]
    if not any(ch.isdigit() for ch in t):
        return None   # '..' would read as 0 once its point gets a leading zero
    if t.startswith(("-.", ".")):
        t = t.replace(".", "0.", 1)
    try:
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def normalize(s: str | None) -> str | None:
    """Canonical text of a number: '1800', '-2.5', or 'p/q' where no finite decimal exists."""
    v = value(s)
    if v is None:
        return None
    if v.denominator == 1:
        return str(v.numerator)
    d = v.denominator
    twos = fives = 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    if d != 1:
        return f"{v.numerator}/{v.denominator}"
    places = max(twos, fives)
    digits = str(abs(v.numerator) * 10 ** places // v.denominator).rjust(places + 1, "0")
    return ("-" if v < 0 else "") + digits[:-places] + "." + digits[-places:]


def strict(text: str) -> str | None:
    m = STRICT_RE.search(text)
    return normalize(m.group(1)) if m else None


def flexible(text: str) -> str | None:
    for found in reversed(NUM_RE.findall(text)):
        v = normalize(found)
        if v is not None:                 # skip a 3/0
            return v
    return None


def gold(answer: str) -> str:
    """The dataset's gold value: after the final '####' of the worked answer."""
    v = normalize(answer.rsplit("####", 1)[-1].strip())
    if v is None:
        raise ValueError(f"gold answer has no number after '####': {answer[-60:]!r}")
    return v


def same(a: str | None, b: str | None) -> bool:
    va, vb = value(a), value(b)
    return va is not None and vb is not None and va == vb


def score(text: str, gold_value: str) -> dict:
    """strict, flexible, the scored answer (strict, else flexible), correct, invalid."""
    s, f = strict(text), flexible(text)
    ans = s if s is not None else f
    return {"strict": s, "flexible": f, "answer": ans, "correct": same(ans, gold_value),
            "invalid": ans is None, "strict_invalid": s is None}
