"""
The docs hold together: every relative link in README.md, docs/ and the other
READMEs a reader reaches from them points to a file that exists, and a
`#anchor` to a heading of its target, as GitHub makes anchors; the README
stays a first screen, not a manual; and the benchmarks that bench/README.md
tells how to run at least compile. Reads files only: no kernel.
"""
import re

import pytest

import support

ROOT = support.REPO_ROOT
README_MAX_LINES = 250

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) and ![alt](target); the text may span lines, the target not.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def documents():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    docs += [p for p in (ROOT / "bench" / "README.md", ROOT / "tests" / "fuzz" / "README.md")
             if p.exists()]
    return docs


def without_code(text):
    """TEXT with code blocks and code spans blanked: a link there is an example."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub("", text)


def anchor(heading):
    """The anchor GitHub gives a heading: its text as rendered (no code marks,
    link targets or emphasis), lowercased, punctuation but `-` and `_` dropped,
    spaces turned to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor of the document at PATH; a repeated heading gets -1, -2..."""
    seen = {}
    out = set()
    for m in HEADING.finditer(without_fences(path.read_text())):
        a = anchor(m.group(1))
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


def without_fences(text):
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def broken_links(doc, root=ROOT):
    """The relative links of DOC that do not resolve, each with why."""
    broken = []
    text = without_code(doc.read_text())
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):      # https:, mailto:
            continue
        line = text.count("\n", 0, m.start()) + 1
        where = f"{doc.relative_to(root)}:{line}: {target}"
        path, _, frag = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if path and not dest.exists():
            broken.append(f"{where}: no such file")
        elif path and not dest.resolve().is_relative_to(root.resolve()):
            broken.append(f"{where}: outside the repository")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            broken.append(f"{where}: no heading #{frag} in {dest.relative_to(root.resolve())}")
    return broken


def test_every_relative_link_resolves():
    broken = [b for doc in documents() for b in broken_links(doc)]
    assert broken == [], "\n".join(broken)


def test_the_docs_are_linked_from_the_readme():
    readme = without_code((ROOT / "README.md").read_text())
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall(readme)
              if t.startswith("docs/")}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), f"pages the README does not link: {sorted(pages - linked)}"


def test_the_license_file_says_what_the_debian_package_says():
    """LICENSE at the top and debian/copyright's License paragraph: one text."""
    def words(text):
        return " ".join(text.split())
    top = (ROOT / "LICENSE").read_text()
    deb = (ROOT / "debian" / "copyright").read_text().split("\nLicense: BSD-3-Clause\n", 2)[-1]
    deb = "\n".join(line[1:] for line in deb.splitlines() if line.strip() != ".")
    assert "Copyright (c) 2026, The distkernel maintainers" in top
    assert words(re.sub(r"^\s*\d\.\s", "", top[top.index("Redistribution"):], flags=re.M)) == \
        words(re.sub(r"^\s*\d\.\s", "", deb[deb.index("Redistribution"):], flags=re.M))


def test_the_readme_is_a_first_screen():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, over {README_MAX_LINES}: move detail to a page under docs/")


def test_the_readme_shows_its_screenshot():
    readme = (ROOT / "README.md").read_text()
    shots = re.findall(r"!\[[^\]]*\]\((docs/[^)]+\.png)\)", readme)
    assert shots, "the README shows no screenshot from docs/"
    for shot in shots:
        size = (ROOT / shot).stat().st_size
        assert size < 200 * 1024, f"{shot} is {size} bytes; keep it under 200 KB"


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# A page\n\n## `%%distributed` options: what, and why?\n\n## Again\n\n## Again\n")
    return tmp_path


def test_the_benchmarks_compile():
    """bench/*.py are run by hand, never by the tests (timing is theirs): a
    syntax error in one is found here, not at the next measurement."""
    scripts = sorted((ROOT / "bench").glob("*.py"))
    assert scripts
    for path in scripts:
        compile(path.read_text(), str(path), "exec")


@pytest.mark.parametrize("target, ok", [
    ("docs/page.md", True),
    ("docs/page.md#a-page", True),
    ("docs/page.md#distributed-options-what-and-why", True),
    ("docs/page.md#again-1", True),
    ("docs/page.md#again-2", False),
    ("docs/page.md#A-Page", False),
    ("docs/missing.md", False),
    ("docs/page.md#missing", False),
    ("#here", True),
    ("#nowhere", False),
    ("https://example.org/x#y", True),
])
def test_the_checker_tells_a_broken_link(tree, target, ok):
    """The check itself: a missing file or heading is reported, a good one not,
    and a link inside code is an example, not a link."""
    doc = tree / "README.md"
    doc.write_text(f"# Here\n\nSee [the\npage]({target}) and `[code](docs/gone.md)`.\n\n"
                   "```\n[block](docs/gone.md)\n```\n")
    assert (broken_links(doc, root=tree) == []) == ok, broken_links(doc, root=tree)
