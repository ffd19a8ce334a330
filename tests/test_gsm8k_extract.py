"""Answer extraction pitfalls: exact rationals, commas and spaces, signs, currency, leading points,
fractions, sentence ends."""
import pytest

from pq2verify.gsm8k import extract


@pytest.mark.parametrize("text,strict,flexible", [
    ("so the total is 5,600 dollars\n#### 5,600", "5600", "5600"),
    ("She has -3 left.\n#### -3", "-3", "-3"),
    ("It costs $18.00 in all.\n#### $18.00", "18", "18"),
    ("The answer is 18.", None, "18"),
    ("We need a, b, and c,", None, None),
    ("no number at all", None, None),
    ("", None, None),
    ("#### 1,000,000 then 7", "1000000", "7"),
    ("ages 5-6", None, "6"),                       # a hyphen is no minus sign
    ("#### 2.50", "2.5", "2.5"),
    ("#### \u22124", "-4", "-4"),                   # unicode minus
    ("first #### 3 then #### 4", "3", "4"),          # strict: the first ####
    ("#### ,", None, None),                        # a bare comma is no number
    ("#### .5", "0.5", "0.5"),                      # a leading point
    ("she ate $.75 of it, then -.5", None, "-0.5"),
    ("half: 1/2", None, "0.5"),                     # a fraction, exact
    ("a third is 1/3.", None, "1/3"),               # no finite decimal: kept as p/q
    ("#### 1 000", "1000", "1000"),                 # thousands grouped by a space
    ("in all 12\u202f500.50 m", None, "12500.5"),   # narrow no-break space, decimals
    ("48/2=24", None, "24"),
    ("3 then 7/0", None, "3"),                      # no number divides by zero
    ("1 2 3", None, "3"),                           # single digits are no thousands groups
])
def test_pitfalls(text, strict, flexible):
    assert extract.strict(text) == strict
    assert extract.flexible(text) == flexible


def test_fractions_compare_exactly():
    assert extract.same("1/2", "0.5") and extract.same("2/4", ".5")
    assert not extract.same("1/3", "0.3333333333")
    assert extract.score("so 1/2\n#### 1/2", "0.5")["correct"]


def test_decimal_equality_not_float():
    assert extract.same("18", "18.00")
    assert extract.same(extract.normalize("$1,800.00"), "1800")
    assert not extract.same("0.1", "0.10000001")
    assert not extract.same(None, "3")


def test_score_strict_then_flexible_and_invalid():
    s = extract.score("blah 7 then 9.\n#### 12", "12")
    assert s["answer"] == "12" and s["correct"] and not s["invalid"]
    s = extract.score("I think it is 9.", "9")
    assert s["strict"] is None and s["answer"] == "9" and s["correct"] and s["strict_invalid"]
    s = extract.score("no idea", "9")
    assert s["invalid"] and not s["correct"]


def test_gold():
    assert extract.gold("48/2 = <<48/2=24>>24\n#### 5,600") == "5600"
    assert extract.gold("x\n#### -3") == "-3"
    with pytest.raises(ValueError):
        extract.gold("no marker here")


def test_every_project_gold_parses():
    from pq2verify.gsm8k import data
    test, _, _ = data.load()
    assert len(test) == 1319
    assert all(extract.gold(r["answer"]) is not None for r in test)
