"""How a %%distributed cell shows its ranks' values: readable at any world
size. Pure functions of the values' texts, so that they can be tested without
the kernel."""

# Up to this many ranks, every rank's value has a line of its own, as a
# reader of a small run expects; above, ranks with the same value share one.
PER_RANK_UP_TO = 8
# The most lines the values take at any world size, as the cell's error.
RESULT_LINES_MAX = 40


# At most this many runs of ranks are named on one line; the count says the rest.
RUNS_MAX = 8


def rank_ranges(ranks, runs_max=RUNS_MAX):
    """"0\u20133, 8, 10\u201312" for sorted RANKS; past RUNS_MAX runs, "\u2026"."""
    runs = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    parts = [f"{a}" if a == b else f"{a}\u2013{b}" for a, b in runs[:runs_max]]
    if len(runs) > runs_max:
        parts.append("\u2026")
    return ", ".join(parts)


def _who(ranks):
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {rank_ranges(ranks)} ({len(ranks)})"


def results_text(texts, result_name=None):
    """The cell's result text from each rank's value as text, in rank order.
    Up to PER_RANK_UP_TO ranks: "rank N: VALUE" each. Above, ranks with the
    same value share a line ("ranks 0\u20133, 8 (5): 0.25"), in the order of
    their lowest rank, within RESULT_LINES_MAX lines; what does not fit is
    counted and named, and the user is told where every value is."""
    if len(texts) <= PER_RANK_UP_TO:
        return "\n".join(f"rank {rank}: {text}" for rank, text in enumerate(texts))
    groups = {}
    for rank, text in enumerate(texts):
        groups.setdefault(text, []).append(rank)
    lines = []
    used = 0
    left = []
    for text, ranks in groups.items():
        line = f"{_who(ranks)}: {text}"
        # one line is kept for the note on what was left out
        if left or used + line.count("\n") + 1 > RESULT_LINES_MAX - 1:
            left.extend(ranks)
            continue
        lines.append(line)
        used += line.count("\n") + 1
    if left:
        left.sort()
        where = (f"every rank's value is in {result_name}, in rank order" if result_name else
                 "result=NAME keeps every rank's value in NAME, in rank order")
        lines.append(f"\u2026 {_who(left)} not shown: {where}")
    return "\n".join(lines)
