#!/usr/bin/env python3
"""
The closing table of scripts/test.sh: each stage's wall time and result, the
whole run's, and the slowest tests of every stage together, so that whoever
reads a CI log sees where the time went without adding anything up.

    test_report.py STAGES_TSV REPORT_DIR [N]

STAGES_TSV has one line per stage, "id<TAB>name<TAB>seconds<TAB>result", in
the order they ran. REPORT_DIR holds what the stages left for it, named by the
stage's id: pytest's JUnit XML files (ID.xml, or ID.N.xml for a stage of
several pytest runs, written with --junitxml) and meson's test logs
(ID.meson.json, a copy of meson-logs/testlog.json, one JSON object a line).
A test's time is what pytest measured for it: setup, call and teardown, so a
module's shared kernel is counted once, in the test that started it. N is how
many slow tests to list (default 15).

Standard library only: it runs at the end of a failed run too, whatever broke.
"""
import json
import pathlib
import sys
import xml.etree.ElementTree as ET


def clock(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 60:d}:{seconds % 60:02d}"


def read_stages(path):
    stages = []
    for line in pathlib.Path(path).read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 4:
            stages.append((parts[0], parts[1], float(parts[2]), parts[3]))
    return stages


def pytest_times(xml_path, stage):
    """(seconds, stage, test id, outcome) for every test case of a JUnit file."""
    try:
        root = ET.parse(xml_path).getroot()
    except (ET.ParseError, OSError):
        return []      # a stage killed while pytest wrote it: its table line says so
    out = []
    for case in root.iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = case.get("name", "?")
        if name.rfind("@") > name.rfind("]"):
            name = name[:name.rfind("@")]   # pytest-xdist's "@group" suffix
        test_id = f"{module}.py::{name}" if module else name
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "FAILED"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        out.append((float(case.get("time") or 0), stage, test_id, outcome))
    return out


def meson_times(json_path, stage):
    """(seconds, stage, test name, outcome) for each C unit suite meson ran."""
    out = []
    try:
        lines = pathlib.Path(json_path).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            t = json.loads(line)
        except ValueError:
            continue
        result = t.get("result", "?")
        out.append((float(t.get("duration") or 0), stage, f"unit {t.get('name', '?')}",
                    "passed" if result == "OK" else result))
    return out


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    stages = read_stages(argv[1])
    report_dir = pathlib.Path(argv[2])
    top = int(argv[3]) if len(argv) > 3 else 15

    width = max([len("stage")] + [len(s[1]) for s in stages])
    print("== where the time went ==")
    print(f"{'stage':<{width}}  {'time':>6}  result")
    for _, name, seconds, result in stages:
        print(f"{name:<{width}}  {clock(seconds):>6}  {result}")
    total = sum(s[2] for s in stages)
    print(f"{'total':<{width}}  {clock(total):>6}")

    tests = []
    for stage_id, name, _, _ in stages:
        for xml in sorted(report_dir.glob(f"{stage_id}.xml")) + sorted(report_dir.glob(f"{stage_id}.*.xml")):
            tests += pytest_times(xml, name)
        tests += meson_times(report_dir / f"{stage_id}.meson.json", name)
    if tests:
        tests.sort(key=lambda t: -t[0])
        print(f"\n{min(top, len(tests))} slowest tests (of {len(tests)}; setup and teardown included):")
        for seconds, stage, test_id, outcome in tests[:top]:
            mark = "" if outcome == "passed" else f"  [{outcome}]"
            print(f"  {clock(seconds):>6}  {stage:<{width}}  {test_id}{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
