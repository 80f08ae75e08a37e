"""The sources keep their shape. One build for every Python holds in the
sources and in what is installed (docs/architecture.md, "One build, every
Python"): C code sees CPython only through runtime/base/dk_pyabi.h, which
fixes the stable ABI of 3.10, and no installed program or library links a
libpython. And functions, files and imports stay within the bounds
scripts/check_structure.py checks. Reads files only: no kernel.
"""
import re
import subprocess
import sys

import pytest

import support

ROOT = support.REPO_ROOT
C_FOLDERS = ("app", "kernel", "distributed", "runtime", "magics", "protocol")
INCLUDE_PYTHON = re.compile(r'^\s*#\s*include\s*[<"]Python\.h[">]', re.M)


def test_c_code_includes_python_only_through_the_stable_abi_header():
    offenders = [str(p.relative_to(ROOT))
                 for folder in C_FOLDERS
                 for p in sorted((ROOT / folder).rglob("*.[ch]"))
                 if INCLUDE_PYTHON.search(p.read_text(errors="replace"))
                 and p.name != "dk_pyabi.h"]
    assert offenders == [], f"include dk_pyabi.h instead of Python.h in {offenders}"
    assert "#define Py_LIMITED_API 0x030A0000" in (ROOT / "runtime/base/dk_pyabi.h").read_text()


def installed_elves():
    prefix = support.PREFIX
    files = [prefix / "bin" / name for name in
             ("distkernel", "distkernel-rank", "distkernel-agent", "distkernel-check")]
    files += sorted(prefix.glob("lib/*/distkernel/*.so")) + sorted(prefix.glob("lib/distkernel/*.so"))
    return files


def test_no_installed_program_or_library_links_a_libpython():
    files = installed_elves()
    if not files[0].exists():
        pytest.skip(f"distkernel is not installed in {support.PREFIX}")
    libs = [f for f in files if f.suffix == ".so"]
    assert sorted(f.name for f in libs) == ["libdistkernel-kernel.so", "libdistkernel-rank.so"]
    for f in files:
        needed = subprocess.run(["readelf", "-d", str(f)], capture_output=True, text=True,
                                check=True).stdout
        assert "libpython" not in needed, f"{f} links a libpython:\n{needed}"


def test_functions_files_and_imports_stay_within_bounds():
    """scripts/check_structure.py: no function over 100 lines, no source file
    over 800 lines outside tests/, no import cycle in python/distkernel."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_structure.py")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("source, cycle", [
    ("from . import b\n", True),
    ("def f():\n    from .b import g\n", True),
    ("import json\n", False),
])
def test_the_checker_finds_a_cycle_even_through_a_lazy_import(tmp_path, monkeypatch, source,
                                                               cycle):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_structure
    finally:
        sys.path.pop(0)
    pkg = tmp_path / "python" / "distkernel"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(source)
    (pkg / "b.py").write_text("from .a import x\n")
    monkeypatch.setattr(check_structure, "PACKAGE", pkg)
    found = check_structure.import_cycles()
    assert bool(found) == cycle, found
