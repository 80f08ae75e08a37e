"""One build for every Python holds in the sources and in what is installed
(docs/architecture.md, "One build, every Python"): C code sees CPython only
through runtime/base/dk_pyabi.h, which fixes the stable ABI of 3.10, and no
installed program or library links a libpython. Reads files only: no kernel.
"""
import re
import subprocess

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
