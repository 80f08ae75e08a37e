"""How a %%distributed cell shows its ranks' values (distkernel._results):
one line per rank up to 8 ranks; above, ranks that share a value share a
line, within 40 lines at any world size, and the rest is counted and named.
The end-to-end cases are in test_pool.py (10 started ranks) and
test_slurm_scale.py (256 ranks)."""

import sys

import pytest

import support

sys.path.insert(0, str(support.REPO_ROOT / "python"))

from distkernel._results import RESULT_LINES_MAX, rank_ranges, results_text  # noqa: E402


def test_up_to_eight_ranks_each_has_its_line():
    assert results_text(["0", "0"]) == "rank 0: 0\nrank 1: 0"
    assert results_text([str(i) for i in range(8)]).splitlines()[-1] == "rank 7: 7"


def test_above_eight_ranks_equal_values_share_a_line_in_order_of_their_lowest_rank():
    texts = ["'x'"] * 10 + ["'y'"] + ["'x'"] * 5
    assert results_text(texts) == "ranks 0\u20139, 11\u201315 (15): 'x'\nrank 10: 'y'"


@pytest.mark.parametrize("world", [9, 64, 1024, 4096])
def test_one_value_everywhere_is_one_line(world):
    assert results_text(["None"] * world) == f"ranks 0\u2013{world - 1} ({world}): None"


def test_interleaved_ranks_name_a_few_runs_and_count_them_all():
    lines = results_text([str(i % 4) for i in range(1024)]).splitlines()
    assert lines[0] == "ranks 0, 4, 8, 12, 16, 20, 24, 28, \u2026 (256): 0", lines
    assert len(lines) == 4


@pytest.mark.parametrize("world", [41, 256, 1024, 4096])
def test_distinct_values_stay_within_40_lines_and_say_where_the_rest_is(world):
    lines = results_text([str(3 * i) for i in range(world)], "tripled").splitlines()
    assert len(lines) == RESULT_LINES_MAX == 40
    assert lines[0] == "rank 0: 0" and lines[38] == "rank 38: 114", lines
    assert lines[-1] == (f"\u2026 ranks 39\u2013{world - 1} ({world - 39}) not shown: "
                         "every rank's value is in tripled, in rank order"), lines[-1]
    # without result=, the user is told how to keep them
    last = results_text([str(i) for i in range(world)]).splitlines()[-1]
    assert last.endswith("not shown: result=NAME keeps every rank's value in NAME, in rank order")


def test_multi_line_values_count_every_line():
    texts = ["[0,\n 1]"] * 3 + [f"[{i},\n {i}]" for i in range(3, 100)]
    lines = results_text(texts).splitlines()
    assert len(lines) <= RESULT_LINES_MAX
    assert lines[:2] == ["ranks 0\u20132 (3): [0,", " 1]"], lines
    assert lines[-1].startswith("\u2026 ranks "), lines


def test_rank_ranges():
    assert rank_ranges([0, 1, 2, 3, 8, 10, 11, 12]) == "0\u20133, 8, 10\u201312"
    assert rank_ranges([5]) == "5"
    assert rank_ranges(list(range(0, 40, 2))) == "0, 2, 4, 6, 8, 10, 12, 14, \u2026"
