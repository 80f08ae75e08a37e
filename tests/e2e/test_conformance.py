"""jupyter_kernel_test's conformance suite for distkernel, with every sample set so
that no test is skipped. The class validates each message against the v5 schema and
waits only 0.1 s between iopub messages before status idle."""
import pytest
import jupyter_kernel_test as jkt

import support

PNG = support.tiny_png()


@pytest.mark.timeout(120)
class TestDistkernelConformance(jkt.KernelTests):
    kernel_name = support.KERNEL_NAME
    language_name = "python"
    file_extension = ".py"

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"

    completion_samples = [
        {"text": "zi", "matches": {"zip"}},
        {"text": "import o"},  # only the reply's shape is checked
    ]

    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "for i in range(3):", "def f(x):"]
    invalid_code_samples = ["import = 7q", "x = )"]

    code_page_something = "print?"

    code_generate_error = "raise"

    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
        {"code": "from IPython.display import HTML; HTML('<b>html result</b>')",
         "mime": "text/html", "result": "<b>html result</b>"},
    ]

    code_display_data = [
        {"code": "from IPython.display import display; display('plain text')",
         "mime": "text/plain"},
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))",
         "mime": "text/html"},
        {"code": f"from IPython.display import Image, display; display(Image(data={PNG!r}))",
         "mime": "image/png"},
    ]

    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "range", "search")

    code_inspect_sample = "zip"

    code_clear_output = "from IPython.display import clear_output; clear_output()"
