"""Output: sys.stdout/stderr buffered and flushed on a short interval and before the
reply, file descriptors 1 and 2 captured (C code, `!cmd`, subprocesses) through a pipe
that never fills up, and rich display (HTML, PNG)."""
import base64
import time

import pytest

from support import tiny_png

MB = 1 << 20


@pytest.mark.timeout(30)
def test_print_is_flushed_while_the_cell_still_runs(kernel):
    sent = time.monotonic()
    r = kernel.execute("import time\nprint('early')\ntime.sleep(1.5)\nprint('late')")
    assert r.stdout == "early\nlate\n"
    first = r.streams("stdout")[0]
    assert first["content"]["text"].startswith("early")
    assert "late" not in first["content"]["text"]
    assert first["received_at"] - sent < 1.0, "the first print waited for the cell to end"
    assert first["received_at"] < r.reply["received_at"]


@pytest.mark.timeout(30)
def test_many_prints_are_coalesced_into_few_stream_messages(kernel):
    r = kernel.execute("for i in range(10000):\n    print(i)")
    assert r.stdout == "".join(f"{i}\n" for i in range(10000))
    n = len(r.streams("stdout"))
    assert n <= 100, f"{n} stream messages for 10000 prints"


@pytest.mark.timeout(30)
def test_output_without_newline_is_flushed_before_the_reply(kernel):
    r = kernel.execute("import sys\nsys.stdout.write('no newline')\nsys.stderr.write('err no newline')")
    assert r.stdout == "no newline"
    assert r.stderr == "err no newline"
    for m in r.of_type("stream"):
        assert m["received_at"] <= r.reply["received_at"] + 0.05


@pytest.mark.timeout(30)
def test_stdout_and_stderr_keep_their_own_order(kernel):
    r = kernel.execute(
        "import sys\nfor i in range(5):\n    print('o', i)\n    print('e', i, file=sys.stderr)")
    assert r.stdout == "".join(f"o {i}\n" for i in range(5))
    assert r.stderr == "".join(f"e {i}\n" for i in range(5))


@pytest.mark.timeout(30)
def test_os_write_to_fd_1_and_2_is_captured(kernel):
    r = kernel.execute("import os\nos.write(1, b'fd one\\n')\nos.write(2, b'fd two\\n')")
    assert r.status == "ok"
    assert "fd one\n" in r.stdout
    assert "fd two\n" in r.stderr


@pytest.mark.timeout(30)
def test_bang_shell_command_output_is_captured(kernel):
    r = kernel.execute("!echo hi from the shell")
    assert r.status == "ok", r.describe()
    assert "hi from the shell" in r.stdout


@pytest.mark.timeout(30)
def test_subprocess_output_is_captured_on_the_right_stream(kernel):
    r = kernel.execute(
        "import subprocess\n"
        "subprocess.run(['sh', '-c', 'echo sub-out; echo sub-err >&2'], check=True)\n"
        "None")
    assert r.status == "ok", r.describe()
    assert "sub-out" in r.stdout
    assert "sub-err" in r.stderr


@pytest.mark.timeout(60)
def test_one_megabyte_write_from_c_holding_the_gil_does_not_hang(kernel):
    # ctypes.PyDLL keeps the GIL during the call, like a C extension that never
    # releases it: the fd-capture pipe must be drained by something else.
    r = kernel.execute(
        "import ctypes\n"
        f"buf = b'x' * {MB}\n"
        "written = ctypes.PyDLL(None).write(1, buf, len(buf))\n"
        "written", timeout=30)
    assert r.status == "ok", r.describe()
    assert r.result == str(MB)
    assert r.stdout.count("x") == MB


@pytest.mark.timeout(60)
def test_one_megabyte_printf_from_c_holding_the_gil_does_not_hang(kernel):
    r = kernel.execute(
        "import ctypes\n"
        "libc = ctypes.PyDLL(None)\n"
        f"libc.printf(b'%s\\n', b'y' * {MB})\n"
        "libc.fflush(None)\n"
        "None", timeout=30)
    assert r.status == "ok", r.describe()
    assert r.stdout.count("y") == MB


@pytest.mark.timeout(30)
def test_fd_output_and_print_both_arrive_in_one_cell(kernel):
    r = kernel.execute("import os\nprint('from print')\nos.write(1, b'from fd\\n')\nprint('again')")
    for piece in ("from print\n", "from fd\n", "again\n"):
        assert piece in r.stdout


@pytest.mark.timeout(30)
def test_html_display_arrives_as_text_html(kernel):
    r = kernel.execute("from IPython.display import HTML, display\ndisplay(HTML('<i>rich</i>'))")
    (d,) = r.of_type("display_data")
    assert d["content"]["data"]["text/html"] == "<i>rich</i>"


@pytest.mark.timeout(30)
def test_png_image_display_arrives_as_base64_image_png(kernel):
    png = tiny_png()
    r = kernel.execute(f"from IPython.display import Image, display\ndisplay(Image(data={png!r}))")
    assert r.status == "ok", r.describe()
    (d,) = r.of_type("display_data")
    data = d["content"]["data"]["image/png"]
    assert base64.b64decode(data) == png


@pytest.mark.timeout(30)
def test_object_with_repr_html_is_shown_as_html_result(kernel):
    r = kernel.execute("class Rich:\n    def _repr_html_(self):\n        return '<p>rich</p>'\nRich()")
    (res,) = r.of_type("execute_result")
    assert res["content"]["data"]["text/html"] == "<p>rich</p>"
    assert "text/plain" in res["content"]["data"]
