"""Edges of the report rendering that single-point fault injection showed unpinned. The table model
(pq2verify.report.table): a code cell is not a bad cell, a Cell is immutable and hashable, the
wrong-width row error names its table, and the console table's title, unpadded edges and one-line
cells. Every expected value is derived by hand in the test's docstring, never taken from the
function under test."""
import dataclasses

import pytest

from pq2verify.report.table import Cell, Table, code

F = "tests/test_render_faults.py"


def repro(test: str) -> str:
    return f"reproduce: .venv/bin/python -m pytest -q -p no:randomly '{F}::{test}'"


# --- report.table -------------------------------------------------------------------------------
def test_a_code_cell_and_a_plain_cell_are_not_bad():
    """Cell('x') and code('./pq2 check') are neither marked bad: a command to copy is not the
    metric that failed. The JSON lists no bad cell for a row of the two, and the console prints
    neither in red."""
    t = "test_a_code_cell_and_a_plain_cell_are_not_bad"
    assert Cell("x").bad is False and code("./pq2 check").bad is False, repro(t)
    tab = Table(("a", "cmd"))
    tab.add(Cell("x"), code("./pq2 check"))
    assert tab.json()["rows"] == [{"status": "", "cells": ["x", "./pq2 check"], "bad": []}], (tab.json(), repro(t))
    from rich.console import Console
    con = Console(force_terminal=True, color_system="standard", width=120, record=True)
    con.print(tab.console())
    out = con.export_text(styles=True)
    assert "\x1b[1;31m" not in out, (repr(out), repro(t))


def test_a_cell_is_immutable_and_hashable():
    """Cell is a frozen dataclass: one Cell may sit in several tables, so marking it bad in one
    must be impossible (FrozenInstanceError), and equal cells hash alike (a frozen dataclass with
    eq gets __hash__ from its fields)."""
    t = "test_a_cell_is_immutable_and_hashable"
    c = Cell("0.9")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.bad = True
    assert c.bad is False, repro(t)
    assert hash(Cell("0.9", bad=True)) == hash(Cell("0.9", bad=True)), repro(t)
    assert len({Cell("a"), Cell("a"), Cell("b")}) == 2, repro(t)


def test_a_row_of_the_wrong_width_names_its_table():
    """A 2-column table given 1 cell: 'checks: 1 cells for 2 columns' when titled 'checks',
    'table: 1 cells for 2 columns' when untitled."""
    t = "test_a_row_of_the_wrong_width_names_its_table"
    with pytest.raises(ValueError) as e:
        Table(("a", "b"), title="checks").add("x")
    assert str(e.value) == "checks: 1 cells for 2 columns", (str(e.value), repro(t))
    with pytest.raises(ValueError) as e:
        Table(("a", "b")).add("x")
    assert str(e.value) == "table: 1 cells for 2 columns", (str(e.value), repro(t))


def _console_lines(tab: Table, width: int) -> list[str]:
    from rich.console import Console
    con = Console(width=width, record=True, force_terminal=False)
    con.print(tab.console())
    return con.export_text().splitlines()


def test_the_console_table_shows_its_title_and_keeps_each_cell_on_one_unpadded_line():
    """Table ('name', 'value') titled 'checks', one row ('a b c d e f g h i j', 'x').
    - the title is the first line printed ('checks', centred, so stripped).
    - pad_edge=False: the SIMPLE_HEAD box draws one blank edge column and the first cell starts
      right after it, so the header line reads ' name' (one space), not '  name' (two).
    - no_wrap: on a 16-column console the 19-character first cell cannot fit; it is cut to one
      line, so the printout is title, blank, header, rule, the one row, blank: 6 lines; a wrapped
      cell would add lines (at its spaces). The cut row still begins ' a b'."""
    t = "test_the_console_table_shows_its_title_and_keeps_each_cell_on_one_unpadded_line"
    tab = Table(("name", "value"), title="checks")
    tab.add("a b c d e f g h i j", "x")
    wide = _console_lines(tab, 80)
    assert wide[0].strip() == "checks", (wide, repro(t))
    head = next(x for x in wide if "name" in x)
    assert head.startswith(" name") and not head.startswith("  "), (wide, repro(t))
    narrow = _console_lines(tab, 16)
    assert len(narrow) == 6, (narrow, repro(t))
    row = next(x for x in narrow if "a b" in x)
    assert row.startswith(" a b"), (narrow, repro(t))


# --- report.html --------------------------------------------------------------------------------
def test_an_image_mark_is_a_link_named_by_its_alt_text_or_its_file():
    """'![map of c](c.png)' (the error map beside the page) becomes a link to c.png reading its
    alt text 'map of c'; '![](c.png)' has no alt text, so the link reads the file name c.png."""
    from pq2verify.report import html
    t = "test_an_image_mark_is_a_link_named_by_its_alt_text_or_its_file"
    got = html.inline("see ![map of c](c.png)")
    assert got == 'see <a href="c.png">map of c</a>', (got, repro(t))
    got = html.inline("![](c.png)")
    assert got == '<a href="c.png">c.png</a>', (got, repro(t))


def test_a_heading_is_one_level_below_its_hashes_and_at_most_h4():
    """The page's own title is <h1>, so '#' is <h2>, '##' <h3>, '###' <h4>; deeper ('#####',
    five hashes: 5 + 1 = 6) is capped at <h4>."""
    from pq2verify.report import html
    t = "test_a_heading_is_one_level_below_its_hashes_and_at_most_h4"
    got = html.from_markdown("# a\n## b\n### c\n##### d")
    assert got == "<h2>a</h2>\n<h3>b</h3>\n<h4>c</h4>\n<h4>d</h4>", (got, repro(t))


# --- gsm8k.report: the A/B comparison ------------------------------------------------------------
def _rec(tokens, topk, answer="1", correct=False):
    return {"tokens": tokens, "topk": topk, "answer": answer, "correct": correct, "invalid": answer is None,
            "strict_invalid": answer is None}


def test_an_answer_missing_on_one_side_is_a_difference():
    """A found no answer (None, wrong), B answered '5' (right): the answers differ (only two
    missing answers are 'the same'), wrong->right; with the runs swapped, right->wrong."""
    from pq2verify.gsm8k import report
    t = "test_an_answer_missing_on_one_side_is_a_difference"
    none, five = _rec([1], [[[1, -0.5]]], None, False), _rec([2], [[[2, -0.5]]], "5", True)
    assert report.answer_class(none, five) == "wrong->right", repro(t)
    assert report.answer_class(five, none) == "right->wrong", repro(t)


def test_the_numeric_delta_is_the_largest_over_the_shared_tokens():
    """Step 0 differs: A has token 1 at -0.5 and 2 at -1.0, B has 1 at -0.75 and 2 at -1.5. The
    shared tokens moved by 0.25 and 0.5: the largest, 0.5, is the delta (all exact in binary)."""
    from pq2verify.gsm8k import report
    t = "test_the_numeric_delta_is_the_largest_over_the_shared_tokens"
    got = report.numeric_divergence([[[1, -0.5], [2, -1.0]]], [[[1, -0.75], [2, -1.5]]], 0)
    assert got == {"numeric_step": 0, "numeric_delta": 0.5}, (got, repro(t))


def test_no_exact_first_margin_gives_n_0_and_two_give_the_larger_as_p90():
    """No differing question at all: no margins, n 0, median and p90 None. Two exact margins
    0.25 and 0.5: the median is index 2 // 2 = 1 (0.5) and the p90 index min(2 - 1,
    int(0.9 * 2) = 1) = 1, also 0.5."""
    from pq2verify.gsm8k import report
    t = "test_no_exact_first_margin_gives_n_0_and_two_give_the_larger_as_p90"
    got = report.first_margins({"diffs": [], "text_only": []})
    assert got == {"n": 0, "median": None, "p90": None}, (got, repro(t))
    rows = [{"margin_a": 0.5, "margin_a_bound": False}, {"margin_a": 0.25, "margin_a_bound": False}]
    got = report.first_margins({"diffs": rows[:1], "text_only": rows[1:]})
    assert got == {"n": 2, "median": 0.5, "p90": 0.5}, (got, repro(t))


def test_the_stopped_side_of_a_length_divergence_reads_stopped():
    """A generated [1, 2] and stopped, B went on to [1, 2, 3]: at step 2 A has no token, so its
    text is '(stopped)', B's is decode([3]) = '<3>'; the shared prefix decode([1, 2]) = '<1><2>'.
    Swapped, B's side reads '(stopped)'."""
    from pq2verify.gsm8k import report
    t = "test_the_stopped_side_of_a_length_divergence_reads_stopped"
    short, long_ = _rec([1, 2], [[[1, -0.5]], [[2, -0.5]]], "3"), _rec([1, 2, 3], [[[1, -0.5]], [[2, -0.5]], [[3, -0.5]]], "3")

    def decode(toks):
        return "".join(f"<{x}>" for x in toks)
    d = report.compare({0: short}, {0: long_}, decode=decode)["text_only"][0]
    assert (d["text_a"], d["text_b"], d["prefix"]) == ("(stopped)", "<3>", "<1><2>"), (d, repro(t))
    d = report.compare({0: long_}, {0: short}, decode=decode)["text_only"][0]
    assert (d["text_a"], d["text_b"]) == ("<3>", "(stopped)"), (d, repro(t))


def test_a_bound_margin_is_the_own_logprob_over_the_last_recorded_one():
    """A chose 5 (at -0.25); B's token 6 is not in A's top-k [5: -0.25, 9: -1.0], so A's margin
    is at least -0.25 - (-1.0) = 0.75, a bound (True). B chose 6 at -0.5 over 5 at -0.75: 0.25
    exact. With A's own token 5 missing from A's top-k [9: -0.1, 6: -0.2] A's margin is unknown:
    None, and not a bound (False)."""
    from pq2verify.gsm8k import report
    t = "test_a_bound_margin_is_the_own_logprob_over_the_last_recorded_one"
    b = _rec([6], [[[6, -0.5], [5, -0.75]]])
    d = report.divergence(_rec([5], [[[5, -0.25], [9, -1.0]]]), b)
    assert (d["margin_a"], d["margin_a_bound"], d["margin_b"], d["margin_b_bound"]) == (0.75, True, 0.25, False), (
        d, repro(t))
    d = report.divergence(_rec([5], [[[9, -0.1], [6, -0.2]]]), b)
    assert (d["margin_a"], d["margin_a_bound"]) == (None, False), (d, repro(t))


# --- gsm8k.report: the Markdown -----------------------------------------------------------------
def _cmp():
    """Four questions, one answer diff (near-tie) whose A margin 0.0625 is exact: first margins
    n 1, median = p90 = 0.0625."""
    return {"n": 4, "identical_answers": 3, "identical_generations": 2, "answer_diffs": 1,
            "by_kind": {"near-tie": 1, "real": 0, "length": 0},
            "diffs": [{"margin_a": 0.0625, "margin_a_bound": False}], "text_only": []}


TEACHER = {"mean_kl": 0.5, "top1": 0.75, "worst": {"dlp": 1.5, "id": 3, "step": 2}}


def test_the_floor_table_has_a_row_only_for_what_was_measured():
    """No floor run. With teacher-forced metrics for B only: the A vs B row (3/4, 2/4, 1 answer
    diff of which 1 near-tie / 0 real, margins 0.0625 (0.0625); KL 0.5, top-1 75.00%, worst 1.5 at
    question 3 step 2) and no A vs F row (nothing of F measured). With teacher metrics for F
    only: A vs B keeps its four comparison cells and three 'n/a' teacher cells; A vs F has four
    'n/a' comparison cells (no floor compare) and F's teacher cells."""
    from pq2verify.gsm8k import report
    t = "test_the_floor_table_has_a_row_only_for_what_was_measured"
    lines = report._floor_section({"compare": _cmp(), "teacher": {"b": TEACHER}})
    rows = [x for x in lines if x.startswith("| A vs")]
    assert rows == ["| A vs B | 3/4 | 2/4 | 1 (1 / 0) | 0.0625 (0.0625) | 0.5 | 75.00% | 1.5 (3, 2) |"], (lines, repro(t))
    lines = report._floor_section({"compare": _cmp(), "teacher": {"f": TEACHER}})
    rows = [x for x in lines if x.startswith("| A vs")]
    assert rows == ["| A vs B | 3/4 | 2/4 | 1 (1 / 0) | 0.0625 (0.0625) | n/a | n/a | n/a |",
                    "| A vs F (floor) | n/a | n/a | n/a | n/a | 0.5 | 75.00% | 1.5 (3, 2) |"], (lines, repro(t))


def test_the_teacher_forced_calls_are_named_per_follower_in_order():
    """The first run with a teacher trace (the second here) names its calls, followers sorted
    (b before f), each follower's paths in their recorded order: 'b: gemv 3; f: gemv 2, mmq 1'."""
    from pq2verify.gsm8k import report
    t = "test_the_teacher_forced_calls_are_named_per_follower_in_order"
    rep = {"compare": _cmp(), "teacher": {"b": TEACHER},
           "runs": [{"label": "A"}, {"teacher_trace": {"f": {"gemv": 2, "mmq": 1}, "b": {"gemv": 3}}}]}
    want = ("- teacher-forced calls (the paths scored): b: gemv 3; f: gemv 2, mmq 1 (a prefill whose path and "
            "fold order are A's is copied from A, not recomputed)")
    assert want in report._floor_section(rep), (report._floor_section(rep), repro(t))


def test_the_other_tail_at_exactly_alpha_is_not_named_and_the_control_needs_bs_drift():
    """p_below = alpha = 0.01: not below alpha, so no 'other tail' line; with no alpha recorded
    it is 0.01, so p_below 0.5 names no other tail either. A floor compare whose
    flips were counted against F's own drift (drift_of 'f', not B's) gives no swapped-roles
    control line, although it holds counts."""
    from pq2verify.gsm8k import report
    t = "test_the_other_tail_at_exactly_alpha_is_not_named_and_the_control_needs_bs_drift"
    vd = {"verdict": "within noise", "test": "sign test", "above": 1, "below": 9, "ties": 0, "p": 0.99,
          "kl_ratio": 0.5, "p_below": 0.01, "alpha": 0.01}
    counts = {"within floor drift": 1, "beyond floor drift": 0, "n/a": 0}
    rep = {"compare": _cmp(), "teacher": {"b": TEACHER}, "verdict": vd,
           "floor": {"fold_reversed_m": "1-16", "compare": {**_cmp(), "answer_diffs_vs_floor": counts,
                                                            "drift_of": "f"}}}
    lines = report._floor_section(rep)
    assert not any(x.startswith("- the other tail:") for x in lines), (lines, repro(t))
    assert not any(x.startswith("- control, roles swapped") for x in lines), (lines, repro(t))
    del vd["alpha"]
    vd["p_below"] = 0.5
    lines = report._floor_section(rep)
    assert not any(x.startswith("- the other tail:") for x in lines), (lines, repro(t))


def _md_rep():
    run = {"label": "A", "spec": "legacy", "fold_reversed_m": "1-16", "trace": {"gemv": 3}, "m_seen": {"gemv": [1]},
           "summary": {"correct": 1, "n": 2, "accuracy": 0.5, "invalid": 1, "invalid_rate": 0.5, "strict_invalid": 0,
                       "tokens": 7},
           "tok_per_s": 2.0, "phases": {"prefill": 0.5, "decode": 1.5}, "copied_calls": 2}
    d1 = {"id": 0, "class": "right->wrong", "answer_a": "5", "answer_b": "6", "step": 3, "token_a": 7, "token_b": 8,
          "text_a": "v" + "x" * 20, "text_b": "y" * 21, "margin_a": 0.25, "margin_a_bound": False, "margin_b": 1.5,
          "margin_b_bound": True, "kind": "real", "m_differs_step": None, "numeric_step": 2, "numeric_delta": 0.125,
          "prefix": "p" * 81}
    d2 = {"id": 1, "class": None, "answer_a": "4", "answer_b": "4", "step": 2, "token_a": None, "token_b": 9,
          "margin_a": None, "margin_a_bound": False, "margin_b": None, "margin_b_bound": False, "kind": "length",
          "m_differs_step": 1, "numeric_step": None, "numeric_delta": None, "prefix": "q" * 80}
    cmp = {"n": 2, "identical_answers": 1, "identical_generations": 0, "answer_diffs": 1,
           "by_class": {"right->wrong": 1, "wrong->right": 0, "both wrong": 0},
           "by_kind": {"near-tie": 0, "real": 1, "length": 0}, "text_only_diffs": 1,
           "text_only_by_kind": {"near-tie": 0, "real": 0, "length": 1}, "batchmate_m_differs": 0,
           "near_tie_nats": 0.1, "diffs": [d1], "text_only": [d2]}
    return {"a": {"label": "A"}, "b": {"label": "B"},
            "model": {"id": "m", "digits": 1, "ternary": True, "rel_rms": 0.0, "max_rel_rms": 0.0,
                      "convert_seconds": 3.0},
            "data": {"source": "s", "n": 2, "format": "chat", "shots": 0, "max_new_tokens": 8, "batch_size": 2},
            "backend": "emulate", "cpu_threads": 2, "emulation_gemm": "numpy", "runs": [run], "compare": cmp,
            "errors": ["worker 1 died"]}


def test_the_markdown_rows_print_every_cell_of_a_run_and_of_each_difference():
    """Backend 'emulate' on 2 CPU threads with the numpy GEMM, near-tie threshold 0.1 nats.
    Run A: spec 'legacy' with its fold range appended, 1/2 right (50.0%), 1 invalid (50.0%),
    0 strict invalid, 7 tokens, 2.0 tok/s, paths 'gemv 3', Ms 'gemv: [1]'. No wall time but run
    A timed its phases: 'prefill 0.5, decode 1.5' and its 2 copied prefill calls.
    The answer diff (question 0): A's and B's 21-character token texts are each cut to '…' and
    their last 20 characters; margin A 0.25 exact ('0.2500'), margin B 1.5 a
    bound ('>=1.5000'); no floor drift, no vs-floor, M never differed ('-'); the logprobs first
    differ at step 2 by 0.125 ('2, 0.125'); the 81-character prefix is cut to '…' and its last 80.
    The text-only diff (question 1): class 'same', no token texts so str(token) ('None', '9'),
    no margins ('n/a'), M differs from step 1, no numeric step ('n/a'), a prefix of exactly 80
    characters kept whole (80 <= 80).
    Both sections are printed, and the errors at the end."""
    from pq2verify.gsm8k import report
    t = "test_the_markdown_rows_print_every_cell_of_a_run_and_of_each_difference"
    lines = report.markdown(_md_rep()).splitlines()
    want = ["- backend: emulate (2 CPU thread(s), GEMM numpy); near-tie threshold 0.1 nats",
            "| A | `legacy, groups folded in reverse at M 1-16` | 1/2 (50.0%) | 1 (50.0%) | 0 | 7 | 2.0 | gemv 3 | "
            "gemv: [1] |",
            "- run A seconds per phase: prefill 0.5, decode 1.5; 2 prefill calls copied from a run with the same "
            "arithmetic",
            "### Answers that differ",
            "| 0 | right->wrong | 5 | 6 | 3 | `…" + "x" * 20 + "` | `…" + "y" * 20 + "` | 0.2500 | >=1.5000 | real | "
            "n/a | n/a | - | 2, 0.125 | …" + "p" * 80 + " |",
            "### Same answer, different text",
            "| 1 | same | 4 | 4 | 2 | `None` | `9` | n/a | n/a | length | n/a | n/a | 1 | n/a | " + "q" * 80 + " |",
            "## Errors", "- worker 1 died"]
    for w in want:
        assert w in lines, (w, lines, repro(t))
    assert not any(x.startswith("- wall time") for x in lines), (lines, repro(t))


def test_the_wall_time_is_printed_without_timed_phases():
    """wall_seconds 12.5 and model conversion 3.0 s, the run timed no phases: the timing block
    is just '- wall time 12.5 s (model load and conversion 3.0 s)', no per-phase line. A model
    without a conversion time prints 0.0 s. The run recorded no tok/s: '0.0'. No GEMM named: the
    backend reads '(2 CPU thread(s))'. A compare without a batch-mate count prints 0."""
    from pq2verify.gsm8k import report
    t = "test_the_wall_time_is_printed_without_timed_phases"
    rep = _md_rep()
    rep["runs"] = [{k: v for k, v in rep["runs"][0].items() if k not in ("phases", "tok_per_s")}]
    lines = report.markdown({**rep, "wall_seconds": 12.5}).splitlines()
    assert "- wall time 12.5 s (model load and conversion 3.0 s)" in lines, (lines, repro(t))
    assert not any(x.startswith("- run A seconds per phase") for x in lines), (lines, repro(t))
    assert any(x.startswith("| A | ") and "| 7 | 0.0 | gemv 3 |" in x for x in lines), (lines, repro(t))
    del rep["model"]["convert_seconds"], rep["emulation_gemm"], rep["compare"]["batchmate_m_differs"]
    lines = report.markdown({**rep, "wall_seconds": 12.5}).splitlines()
    assert "- wall time 12.5 s (model load and conversion 0.0 s)" in lines, (lines, repro(t))
    assert "- backend: emulate (2 CPU thread(s)); near-tie threshold 0.1 nats" in lines, (lines, repro(t))
    assert ("- questions whose decode M differed between A and B before their first differing token "
            "(a batch-mate stopped at another step): 0") in lines, (lines, repro(t))


def test_the_html_verdict_is_green_for_a_within_recorded_before_decided_existed():
    """A verdict 'within arithmetic noise' with no 'decided' key (a report from before it
    existed) counts as decided: the page shows it green (verdict-pass)."""
    from pq2verify.gsm8k import report
    t = "test_the_html_verdict_is_green_for_a_within_recorded_before_decided_existed"
    rep = {"compare": {"diffs": [], "text_only": [], "identical_answers": 5, "n": 5, "answer_diffs": 0},
           "verdict": {"verdict": "within arithmetic noise"}, "model": {"id": "m"}, "a": {"label": "A"},
           "b": {"label": "B"}, "backend": "emulate", "data": {"n": 5}, "switch_ok": True}
    page = report.html(rep, "", {}, {})
    assert '<p class="verdict-pass">verdict: within arithmetic noise</p>' in page, (page, repro(t))


def test_the_html_cuts_a_shared_prefix_over_200_characters():
    """A prefix of exactly 200 characters is shown whole; one of 201 ('a' then 200 'b') is cut
    to '...' and its last 200 characters (the 200 'b')."""
    from pq2verify.gsm8k import report
    t = "test_the_html_cuts_a_shared_prefix_over_200_characters"

    def page(prefix):
        d = {"id": 7, "class": "both wrong", "kind": "real", "step": 3, "prefix": prefix}
        rep = {"compare": {"diffs": [d], "text_only": [], "identical_answers": 0, "n": 1, "answer_diffs": 1},
               "model": {"id": "m"}, "a": {"label": "A"}, "b": {"label": "B"}, "backend": "emulate",
               "data": {"n": 1}, "switch_ok": False}
        return report.html(rep, "", {}, {})
    assert "<td>" + "c" * 200 + "</td>" in page("c" * 200), repro(t)
    got = page("a" + "b" * 200)
    assert "<td>..." + "b" * 200 + "</td>" in got and "a" + "b" * 200 not in got, (got, repro(t))


def test_the_html_class_of_a_text_only_divergence_reads_same():
    """compare() stores class None for a divergence whose answers agree (text only); the
    Markdown prints it 'same', and the side-by-side HTML table must too: its cell read blank
    (a .get default never applies to a key that is present)."""
    from pq2verify.gsm8k import report
    t = "test_the_html_class_of_a_text_only_divergence_reads_same"
    d = {"id": 7, "class": None, "kind": "near-tie", "step": 3, "prefix": "p"}
    rep = {"compare": {"diffs": [], "text_only": [d], "identical_answers": 1, "n": 1, "answer_diffs": 0},
           "model": {"id": "m"}, "a": {"label": "A"}, "b": {"label": "B"}, "backend": "emulate",
           "data": {"n": 1}, "switch_ok": True}
    page = report.html(rep, "", {}, {})
    assert "<td>7</td><td>same</td><td>near-tie</td>" in page.replace("\n", ""), (page, repro(t))
