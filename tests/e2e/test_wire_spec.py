"""The back channel's wire is specified once, in runtime/channel/dk_frame.h,
and the rank's side of it (python/distkernel/_backchannel.py) names the same
constants: each of Python's is the header's of the same name less DK_FRAME_
(the directions, DK_FRAME_DIR_TO_*, are TO_*), with the same value. A change
made to one side and not to the other fails here, before a rank and a kernel
stop understanding each other. Reads files only: no kernel.
"""
import ast
import importlib.util
import operator
import re

import pytest

import support

ROOT = support.REPO_ROOT
HEADER = ROOT / "runtime" / "channel" / "dk_frame.h"
MODULE = ROOT / "python" / "distkernel" / "_backchannel.py"

# What a rank sends, reads or checks: both sides must name each of these.
RANK_SPEAKS = {"HELLO", "PAYLOAD", "RESULT", "ERROR", "TASK", "OUTPUT", "PORT", "NONCE_LEN",
               "MAC_LEN", "BODY_HEAD", "TO_RUNTIME", "TO_RANK", "PAYLOAD_MAX", "LEN_MAX",
               "OUTPUT_LOG"}

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.LShift: operator.lshift, ast.BitOr: operator.or_}


def _evaluate(text, known):
    """The value of a C constant expression of the header's kind: integers
    (with u suffixes), character literals, (size_t) casts, + - * << |, and
    names defined before it."""
    text = re.sub(r"\(\s*(size_t|uint32_t|int|unsigned)\s*\)", "", text)
    text = re.sub(r"'(.)'", lambda m: str(ord(m.group(1))), text)
    text = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b", r"\1", text)

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in known:
            return known[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"not a constant the test can read: {ast.dump(node)}")

    return value(ast.parse(text.strip(), mode="eval").body)


def header_constants():
    """Every DK_FRAME_ constant of the header, #define or enum member: its
    name less DK_FRAME_ -> its value."""
    source = re.sub(r"/\*.*?\*/|//[^\n]*", " ", HEADER.read_text(), flags=re.S)
    known = {}
    for name, text in re.findall(r"^\s*#\s*define\s+(DK_FRAME_\w+)[ \t]+([^\n]+)$", source,
                                 re.M):
        known[name] = _evaluate(text, known)
    for body in re.findall(r"\benum\s*\w*\s*\{(.*?)\}", source, re.S):
        for name, text in re.findall(r"(DK_FRAME_\w+)\s*=\s*([^,]+)", body):
            known[name] = _evaluate(text, known)
    return {name[len("DK_FRAME_"):]: v for name, v in known.items()}


def header_types():
    """The frame types (the enum's members), name -> number."""
    source = re.sub(r"/\*.*?\*/|//[^\n]*", " ", HEADER.read_text(), flags=re.S)
    (body,) = re.findall(r"\benum\s*\w*\s*\{(.*?)\}", source, re.S)
    return {name: int(n) for name, n in re.findall(r"DK_FRAME_(\w+)\s*=\s*(\d+)", body)}


def python_constants():
    """The rank module's public constants (upper-case names bound to an int
    or to bytes), as the header would name them: TO_X is DIR_TO_X there, and
    a one-byte bytes value is that byte's number, as a C character is."""
    spec = importlib.util.spec_from_file_location("_backchannel_under_test", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)     # the standard library only: no torch, no kernel
    found = {}
    for name, value in vars(module).items():
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name) or not isinstance(value, (int, bytes)):
            continue
        if isinstance(value, bytes):
            assert len(value) == 1, f"{name} = {value!r}: the wire's bytes constants are one byte"
            value = value[0]
        found["DIR_" + name if name.startswith("TO_") else name] = value
    return found


def test_the_header_is_read_whole():
    c = header_constants()
    assert {"KEY_LEN", "NONCE_LEN", "MAC_LEN", "BODY_HEAD", "HEAD", "DIR_TO_RUNTIME",
            "DIR_TO_RANK", "PAYLOAD_MAX", "LEN_MAX", "TASK_MAX", "OUTPUT_LOG"} <= c.keys()
    assert c["DIR_TO_RUNTIME"] == ord("R") and c["DIR_TO_RANK"] == ord("K")
    assert c["LEN_MAX"] == c["MAC_LEN"] + c["BODY_HEAD"] + c["PAYLOAD_MAX"]
    assert header_types()["HELLO"] == 1


def test_every_constant_of_the_rank_is_the_headers_with_its_value():
    c, py = header_constants(), python_constants()
    missing = sorted(name for name in py if name not in c)
    assert missing == [], (f"_backchannel.py has {missing}, which dk_frame.h does not define "
                           f"(as DK_FRAME_<name>): rename or add it on both sides")
    differ = {name: (py[name], c[name]) for name in py if py[name] != c[name]}
    assert differ == {}, f"Python's value, then C's: {differ}"


@pytest.mark.parametrize("name", sorted(RANK_SPEAKS))
def test_both_sides_name_what_the_rank_speaks(name):
    key = "DIR_" + name if name.startswith("TO_") else name
    assert key in header_constants(), f"dk_frame.h has no DK_FRAME_{key}"
    assert key in python_constants(), f"_backchannel.py has no {name}"


def test_each_frame_type_has_a_number_of_its_own():
    types = header_types()
    numbers = sorted(types.values())
    assert len(numbers) == len(set(numbers)), types
    assert all(1 <= n <= 255 for n in numbers), "a type is a u8"
