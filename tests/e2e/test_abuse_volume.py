"""
Protocol abuse in volume, end to end: thousands of malformed messages on shell,
control and stdin, mixed with valid requests, against one kernel.

What is proved
--------------
A seeded generator (random.Random(SEED), SEED from DISTKERNEL_ABUSE_SEED) builds
some 3,000 malformed messages from the families below, each family in many
variants, and interleaves them with valid requests: `abuse_counter += 1`
execute_requests and other requests on shell, kernel_info_request on control,
and on stdin the answers to a cell that runs `exec(input())` in a loop. Then:

* nothing invalid ran. Every malformed message whose code could run carries
  code that leaves a trace (it writes a file named trace-N, in `code`, in a
  `user_expressions` entry, or as the `value` of an input_reply the cell would
  exec); no trace file exists at the end. That the traces would show is checked
  first: the same kind of code in a valid request does leave its file. Replays
  resend valid `abuse_counter += 1` cells and input replies, so a replay that
  ran shows as a counter off by one; malformed control messages include
  shutdown and interrupt requests, which would end the kernel or break a
  running cell;
* every valid message was answered once, with the right reply type, parent
  msg_id and status "ok"; `abuse_counter` equals the number of valid executes
  sent, and the stdin cell received exactly the valid input values, in order;
* every malformed message was seen and classified as intended: the kernel's
  log has exactly one "dropped a message on <channel>" line per message the
  decoder must refuse, one "ignored" line per message it must ignore and one
  "refused a <msg_type>" line per request it must answer with an error;
* the kernel's memory stays bounded: RSS after the flood is within 64 MiB of
  the baseline; after a 100 MB frame within 150 MiB, two more 100 MB frames add
  no more than 16 MiB (nothing kept per frame), and once they are handled RSS is
  back within 64 MiB of the baseline; its descriptors do not grow. (Under
  AddressSanitizer the kernel is started with a 16 MB quarantine, so that RSS
  counts what the kernel keeps rather than what ASan holds back from reuse.)
* afterwards kernel_info_request on control is answered in under 100 ms (the
  median of 20 round trips; the maximum is reported).

A one-line summary is printed (pytest -s shows it) and, when
DISTKERNEL_FIGURES_DIR is set, written there as abuse.json with the counts per
channel and family.

What is correct, family by family
---------------------------------
Refused by the decoder (no answer, nothing run, logged as dropped):
  bad_signature, empty_signature (also a missing signature frame),
  truncated_signature, other_key (another key, another hash, other frames
  signed), altered (a frame changed after signing), replay (an exact resend of
  a message the kernel already answered, also on another channel, with another
  identity or an extra buffer), bad_delimiter, missing_frames, extra_frames (a
  frame inserted before the content; one after it is a buffer, see below),
  invalid_json (each of the four JSON frames, and JSON that is not an object),
  invalid_utf8 (each of the six frames after the identities), header_types
  (msg_id, msg_type, session, username, date or version of another JSON type,
  or msg_id / msg_type missing), empty (empty frames, lone delimiters),
  many_idents (5,000 or 20,000 identity frames on a badly signed message), and
  three 100 MB frames on shell: the content of a badly signed execute_request,
  a buffer of one, and the header, not JSON, of a correctly signed message.
Answered with status "error" and ename "TypeError", nothing run:
  content_types: a correctly signed request whose content has a field of the
  wrong JSON type, or lacks a required one (execute, complete, inspect,
  is_complete, history and comm_info requests on shell; shutdown_request on
  control, after which the kernel must still be running). This includes the
  debatable execute_request with valid code and `silent: "yes"` (or
  `store_history: 0`): the kernel refuses it rather than guess, since Python's
  truthiness would make "no" mean silent, so it carries a trace too.
Ignored (no answer, nothing run, logged as ignored):
  unknown_type: msg_types the channel does not handle, carrying code (near
  misses of execute_request, replies, requests sent to the wrong channel); on
  stdin, anything but an input_reply, and input_replies whose value is not a
  string (the kernel keeps waiting for a real answer).
Valid, answered "ok" and counted as valid:
  unknown extra fields in header or content, a header with only msg_id and
  msg_type (as jupyter_client requires no more), non-UTF-8 bytes in identity
  frames and buffers (binary by definition), 300 or 2,000 identity frames,
  arbitrary metadata and parent_header objects.

The generator checks its own classification: every message it means to be
refused is refused by a model of the spec (`spec_refusal`), and every other one
passes it, so a generator bug cannot turn into a test that passes vacuously.
"""
import ast
import dataclasses
import hashlib
import hmac
import json
import os
import pathlib
import random
import statistics
import time
import uuid

import pytest
import zmq

import support
from support import DELIM, NoReply, sign

pytestmark = pytest.mark.skipif(
    support.KERNEL_NAME != "distkernel",
    reason="checks distkernel's own choices (error replies, log lines, memory)")

SEED = int(os.environ.get("DISTKERNEL_ABUSE_SEED", "20240611"))
FLOOD_STEPS = 2900          # shell and control, valid ones included
STDIN_ROUNDS = 40           # input() calls in the stdin cell
STDIN_PER_ROUND = 16        # malformed stdin messages before each valid answer
HUGE = 100 * 1024 * 1024
MIB = 1024 * 1024

# Expectations.
DROP = "drop"       # refused by the decoder: no answer
IGNORE = "ignore"   # decoded but not handled on this channel: no answer
ERROR = "error"     # answered with status "error"
OK = "ok"           # valid: answered with status "ok"


# -- a model of what the spec accepts --------------------------------------------------


def _no_constants(name):
    raise ValueError(f"{name} is not JSON")


def spec_refusal(frames, key, seen):
    """Why the messaging spec makes FRAMES unacceptable to a kernel, or None when
    they are a valid message. SEEN holds the signatures already accepted."""
    try:
        i = frames.index(DELIM)
    except ValueError:
        return "no delimiter"
    if len(frames) - i - 1 < 5:
        return "too few frames"
    sig, parts = frames[i + 1], frames[i + 2 : i + 6]
    if not hmac.compare_digest(sig, sign(key, parts)):
        return "signature"
    if sig in seen:
        return "replay"
    objs = []
    for p in parts:
        try:
            obj = json.loads(p.decode("utf-8"), parse_constant=_no_constants)
        except (UnicodeDecodeError, ValueError, RecursionError):
            return "not UTF-8 JSON"
        if not isinstance(obj, dict):
            return "not an object"
        objs.append(obj)
    header = objs[0]
    if not all(isinstance(header.get(f), str) for f in ("msg_id", "msg_type")):
        return "header without msg_id or msg_type"
    if any(f in header and not isinstance(header[f], str)
           for f in ("session", "username", "date", "version")):
        return "header field of the wrong type"
    return None


# -- the generator -------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    family: str
    variant: str
    channel: str
    frames: list
    expect: str
    msg_id: str = None          # whose reply to look for (OK, ERROR) or to refuse
    msg_type: str = None
    check: str = None           # for ERROR: a word the error must name
    status: str = "ok"          # for OK: the reply's status
    replay_of: str = None       # for replays: the msg_id of the original, when it has a reply


def jb(obj):
    return obj if isinstance(obj, bytes) else json.dumps(obj).encode()


# JSON values of every type, to pick the wrong ones from.
def wrong_values(rng, trace):
    return {
        "string": rng.choice(["yes", "false", "", "0", trace]),
        "boolean": rng.choice([True, False]),
        "integer": rng.choice([0, 1, -7, 2 ** 31]),
        "float": rng.choice([0.5, 1.0, -3.25]),
        "null": None,
        "list": rng.choice([[], [trace], [1, 2]]),
        "object": rng.choice([{}, {"code": trace}, {"a": [1]}]),
    }


# The content fields the kernel checks: (kind, required, nullable). Kinds match
# the names wrong_values uses; "integer" also refuses floats.
CONTENT_FIELDS = {
    "execute_request": {"code": ("string", True, False), "silent": ("boolean", False, False),
                        "store_history": ("boolean", False, False),
                        "user_expressions": ("map", False, False),
                        "allow_stdin": ("boolean", False, False),
                        "stop_on_error": ("boolean", False, False)},
    "complete_request": {"code": ("string", True, False), "cursor_pos": ("integer", False, True)},
    "inspect_request": {"code": ("string", True, False), "cursor_pos": ("integer", False, True),
                        "detail_level": ("integer", False, False)},
    "is_complete_request": {"code": ("string", True, False)},
    "history_request": {"output": ("boolean", False, False), "raw": ("boolean", False, False),
                        "hist_access_type": ("string", False, False),
                        "session": ("integer", False, True), "start": ("integer", False, True),
                        "stop": ("integer", False, True), "n": ("integer", False, True),
                        "pattern": ("string", False, True), "unique": ("boolean", False, False)},
    "comm_info_request": {"target_name": ("string", False, True)},
    "shutdown_request": {"restart": ("boolean", False, False)},
    "input_reply": {"value": ("string", True, False)},
}

INVALID_UTF8 = [b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80",
                b"\xe2\x82", b"\x80", b"\xf4\x90\x80\x80", b"\xc3\x28", b"\xe0\x80\xaf"]

BAD_DELIMITERS = [b"<IDS|MSG> ", b"<ids|msg>", b"<IDS|MSG", b"IDS|MSG>", b"", b"<IDS|MSG>\x00",
                  b"<IDS|MSG>\n", b"\xef\xbb\xbf<IDS|MSG>", "<IDS｜MSG>".encode(),
                  b"<IDS|MSG>\xff", b"<IDS|MSG><IDS|MSG>", b" <IDS|MSG>"]

UNKNOWN_TYPES = ["execute_requestx", "Execute_Request", "execute_request ", " execute_request",
                 "execute-request", "execute", "execute_reply", "exec_request", "",
                 "kernel_info_request\n", "execute_request\t", "EXECUTE_REQUEST",
                 "execute_request\u200b", "no_such_request", "debug_request", "input_reply",
                 "interrupt_request", "apply_request", "clear_request", "abort_request"]


class Forge:
    """Deterministic builder of valid and malformed messages for one kernel key."""

    def __init__(self, seed, key, trace_dir):
        self.rng = random.Random(seed)
        self.key = key
        self.trace_dir = trace_dir
        self.session = "%032x" % self.rng.getrandbits(128)
        self.traces = {}            # trace file name -> "family/variant" that carries it
        self.seen = set()           # signatures of the messages meant to be accepted
        # Valid messages to replay: (channel, msg_id whose reply must come first or
        # None, frames). The test adds them as it sends them, so what a replay
        # resends depends on the seed only; the ledger holds a replay back until the
        # original has been answered (otherwise, on another channel, the copy could
        # reach the kernel first and be the one accepted).
        self.replayable = []
        self.seq = 0
        self._family = "?"

    # -- building blocks --
    def header(self, msg_type, **changes):
        self.seq += 1
        h = {"msg_id": "%032x" % self.rng.getrandbits(128), "username": "abuse",
             "session": self.session, "date": "2024-06-11T12:00:00.%06dZ" % (self.seq % 10 ** 6),
             "msg_type": msg_type, "version": "5.3"}
        h.update(changes)
        return h

    def index(self, n):
        """A random index below N that draws the same random numbers whatever N is,
        so that the length of the trace paths (of tmp_path) cannot change what
        the generator makes next."""
        return min(int(self.rng.random() * n), n - 1)

    def trace(self):
        """Code (an expression) that writes a trace file if it ever runs."""
        name = f"trace-{len(self.traces)}"
        self.traces[name] = self._family
        return f"open({str(self.trace_dir / name)!r}, 'w').write('x')"

    def execute_content(self, code=None, **changes):
        c = {"code": self.trace() if code is None else code, "silent": False,
             "store_history": True, "user_expressions": {"t": self.trace()},
             "allow_stdin": False, "stop_on_error": True}
        c.update(changes)
        return c

    def signed(self, header, content, parent=None, metadata=None, key=None):
        parts = [jb(header), jb(parent if parent is not None else {}),
                 jb(metadata if metadata is not None else {}), jb(content)]
        return [DELIM, sign(self.key if key is None else key, parts)] + parts

    def payload(self, channel):
        """A (msg_type, content) that would do something if it got through."""
        r = self.rng.random()
        if channel == "shell":
            if r < 0.8:
                return "execute_request", self.execute_content()
            return self.rng.choice([("kernel_info_request", {}),
                                    ("complete_request", {"code": self.trace(), "cursor_pos": 4}),
                                    ("is_complete_request", {"code": self.trace()})])
        if channel == "control":
            return self.rng.choice([("shutdown_request", {"restart": False}),
                                    ("interrupt_request", {}), ("kernel_info_request", {}),
                                    ("execute_request", self.execute_content())])
        if r < 0.75:
            return "input_reply", {"value": self.trace()}
        return "execute_request", self.execute_content()

    def base(self, channel):
        msg_type, content = self.payload(channel)
        header = self.header(msg_type)
        return header, content, self.signed(header, content)

    def case(self, variant, channel, frames, expect, header=None, **kw):
        def text(field):
            v = header.get(field) if isinstance(header, dict) else None
            return v if isinstance(v, str) else None
        c = Case(self._family, variant, channel, frames, expect, msg_id=text("msg_id"),
                 msg_type=text("msg_type"), **kw)
        why = spec_refusal(frames, self.key, self.seen)
        if expect == DROP:
            assert why is not None, f"generator bug: {c.family}/{variant} would be accepted"
        else:
            assert why is None, f"generator bug: {c.family}/{variant} is refused ({why})"
            self.seen.add(frames[frames.index(DELIM) + 1])
        return c

    # -- families: refused by the decoder --
    def bad_signature(self, ch):
        header, content, fr = self.base(ch)
        sig = fr[1].decode()
        variants = {
            "random_hex": lambda: "%064x" % self.rng.getrandbits(256),
            "one_digit_changed": lambda: self._flip_hex(sig),
            "uppercase": lambda: sig.upper() if sig.upper() != sig else self._flip_hex(sig),
            "trailing_newline": lambda: sig + "\n",
            "non_hex_digit": lambda: sig[:10] + "g" + sig[11:],
            "zeros": lambda: "0" * 64,
            "leading_space": lambda: " " + sig[:63],
            "twice_as_long": lambda: sig + sig,
            "non_ascii": lambda: "é" * 32,
        }
        name = self.rng.choice(sorted(variants))
        fr[1] = variants[name]().encode()
        return self.case(name, ch, fr, DROP, header)

    def _flip_hex(self, sig):
        i = self.rng.randrange(64)
        digit = self.rng.choice([d for d in "0123456789abcdef" if d != sig[i]])
        return sig[:i] + digit + sig[i + 1:]

    def empty_signature(self, ch):
        header, content, fr = self.base(ch)
        name = self.rng.choice(["empty", "frame_missing", "spaces", "nul_bytes"])
        if name == "frame_missing":
            del fr[1]
        else:
            fr[1] = {"empty": b"", "spaces": b" " * 64, "nul_bytes": b"\x00" * 64}[name]
        return self.case(name, ch, fr, DROP, header)

    def truncated_signature(self, ch):
        header, content, fr = self.base(ch)
        n = self.rng.randrange(1, 64)
        fr[1] = fr[1][:n] if self.rng.random() < 0.5 else fr[1][64 - n:]
        return self.case(f"{n}_of_64", ch, fr, DROP, header)

    def other_key(self, ch):
        header, content, fr = self.base(ch)
        parts = fr[2:6]
        body = b"".join(parts)
        variants = {
            "random_key": lambda: sign(self.rng.randbytes(32), parts),
            # Not key + NUL: HMAC pads short keys with NULs, so that is the same key.
            "key_plus_one_byte": lambda: sign(self.key + b"\x01", parts),
            "key_shortened": lambda: sign(self.key[:-1], parts),
            "key_uppercased": lambda: sign(self.key.upper() + b"!", parts),
            "plain_sha256": lambda: hashlib.sha256(body).hexdigest().encode(),
            "sha256_of_key_and_body": lambda: hashlib.sha256(self.key + body).hexdigest().encode(),
            "hmac_sha512_cut": lambda: hmac.new(self.key, body, "sha512").hexdigest()[:64].encode(),
            "hmac_md5": lambda: hmac.new(self.key, body, "md5").hexdigest().encode(),
            "parts_reordered": lambda: sign(self.key, parts[::-1]),
            "header_only": lambda: sign(self.key, parts[:1]),
            "with_delimiter": lambda: sign(self.key, [DELIM] + parts),
        }
        name = self.rng.choice(sorted(variants))
        fr[1] = variants[name]()
        return self.case(name, ch, fr, DROP, header)

    def altered(self, ch):
        header, content, fr = self.base(ch)
        name = self.rng.choice(["content_replaced", "msg_type_changed", "parent_added",
                                "metadata_added", "space_appended", "header_and_content_swapped",
                                "byte_flipped"])
        if name == "content_replaced":
            fr[5] = jb(self.execute_content() if ch != "stdin" else {"value": self.trace()})
        elif name == "msg_type_changed":
            other = {"shell": "execute_request", "control": "shutdown_request",
                     "stdin": "input_reply"}[ch]
            fr[2] = jb(dict(header, msg_type=other if header["msg_type"] != other
                            else "kernel_info_request"))
        elif name == "parent_added":
            fr[3] = jb(self.header("execute_request"))
        elif name == "metadata_added":
            fr[4] = jb({"deletedCells": [], "recordTiming": True})
        elif name == "space_appended":
            i = self.rng.randrange(2, 6)
            fr[i] = fr[i] + b" "
        elif name == "header_and_content_swapped":
            fr[2], fr[5] = fr[5], fr[2]
        else:
            i = self.rng.randrange(2, 6)
            b = bytearray(fr[i])
            b[self.index(len(b))] ^= 1 << self.rng.randrange(7)
            fr[i] = bytes(b)
        return self.case(name, ch, fr, DROP, header)

    def replay(self, ch):
        """Resend a valid message (None until there is one)."""
        if not self.replayable:
            return None
        src, original, frames = self.rng.choice(self.replayable[-60:])
        frames = list(frames)
        name = self.rng.choice(["exact", "extra_identity", "extra_buffer"])
        if name == "extra_identity":
            frames = [self.rng.randbytes(8)] + frames
        elif name == "extra_buffer":
            frames = frames + [self.rng.randbytes(16)]
        header = json.loads(frames[frames.index(DELIM) + 2])
        # The reply already came: a second one would be unexpected, so this case is
        # recorded under no msg_id and any further reply shows as a duplicate.
        c = self.case(f"{name}_{src}_on_{ch}", ch, frames, DROP, None, replay_of=original)
        c.msg_type = header["msg_type"]
        return c

    def bad_delimiter(self, ch):
        header, content, fr = self.base(ch)
        name = self.rng.choice(["replaced", "missing", "after_signature", "at_the_end"])
        if name == "replaced":
            d = self.rng.choice(BAD_DELIMITERS)
            fr[0] = d
            name = f"replaced_by_{d!r}"
        elif name == "missing":
            del fr[0]
        elif name == "after_signature":
            fr[0], fr[1] = fr[1], fr[0]
        else:
            fr = fr[1:] + [DELIM]
        return self.case(name, ch, fr, DROP, header)

    def missing_frames(self, ch):
        header, content, fr = self.base(ch)
        name = self.rng.choice(["one_removed", "two_removed", "only_the_first"])
        if name == "one_removed":
            i = self.rng.randrange(6)
            del fr[i]
            name = f"frame_{i}_removed"
        elif name == "two_removed":
            for i in sorted(self.rng.sample(range(6), 2), reverse=True):
                del fr[i]
        else:
            fr = fr[: self.rng.randrange(1, 6)]
            name = f"only_the_first_{len(fr)}"
        return self.case(name, ch, fr, DROP, header)

    def extra_frames(self, ch):
        header, content, fr = self.base(ch)
        i = self.rng.randrange(1, 6)       # before sig, header, parent, metadata, content
        extras = {"empty_object": b"{}", "delimiter": DELIM, "duplicate": fr[i],
                  "random": self.rng.randbytes(12), "empty": b""}
        # Inserting a copy of the frame that follows (or "{}" before a "{}") only
        # shifts equal bytes: that is a valid message with a buffer, not this family.
        extras = {n: e for n, e in extras.items()
                  if spec_refusal(fr[:i] + [e] + fr[i:], self.key, self.seen)}
        name = self.rng.choice(sorted(extras))
        fr.insert(i, extras[name])
        return self.case(f"{name}_inserted_at_{i}", ch, fr, DROP, header)

    def invalid_json(self, ch):
        header, content, fr = self.base(ch)
        i = self.rng.randrange(2, 6)
        text = fr[i]
        variants = {
            "truncated": lambda: text[: 1 + self.index(len(text) - 1)],
            "trailing_garbage": lambda: text + b" x",
            "single_quotes": lambda: b"{'msg_id': 'x'}",
            "trailing_comma": lambda: b'{"a": 1,}',
            "unquoted_key": lambda: b"{a: 1}",
            "nan": lambda: b'{"a": NaN}',
            "leading_zero": lambda: b'{"a": 01}',
            "comment": lambda: b'{/* c */ "a": 1}',
            "empty": lambda: b"",
            "whitespace": lambda: b" \n ",
            "two_objects": lambda: b"{}{}",
            "control_char_in_string": lambda: b'{"a": "x\x01y"}',
            "raw_nul": lambda: b'{"a": "x\x00y"}',
            "bad_escape": lambda: b'{"a": "\\q"}',
            "array": lambda: b"[1, 2, 3]",
            "string": lambda: b'"{}"',
            "number": lambda: b"42",
            "null": lambda: b"null",
            "true": lambda: b"true",
        }
        name = self.rng.choice(sorted(variants))
        fr[i] = variants[name]()
        fr[1] = sign(self.key, fr[2:6])     # signed as sent: only the parser can refuse it
        return self.case(f"{name}_in_{('header', 'parent', 'metadata', 'content')[i - 2]}",
                         ch, fr, DROP, header)

    def invalid_utf8(self, ch):
        header, content, fr = self.base(ch)
        bad = self.rng.choice(INVALID_UTF8)
        i = self.rng.randrange(0, 6)
        if i == 0:
            fr[0] = DELIM[:3] + bad + DELIM[3:]
        elif i == 1:
            fr[1] = fr[1][:60] + (bad * 4)[:4]
        else:
            obj = json.loads(fr[i])
            # A string value with the bad bytes inside, written as JSON by hand.
            field = {2: "username", 3: "note", 4: "note",
                     5: "code" if "code" in obj else "value"}[i]
            obj[field] = "@@"
            fr[i] = jb(obj).replace(b"@@", b"a" + bad + b"b")
            fr[1] = sign(self.key, fr[2:6])
        return self.case(f"{bad.hex()}_in_frame_{i}", ch, fr, DROP, header)

    def header_types(self, ch):
        msg_type, content = self.payload(ch)
        field = self.rng.choice(["msg_id", "msg_type", "session", "username", "date", "version"])
        header = self.header(msg_type)
        if self.rng.random() < 0.15 and field in ("msg_id", "msg_type"):
            del header[field]
            name = f"{field}_missing"
        else:
            kind, value = self.rng.choice(sorted(
                (k, v) for k, v in wrong_values(self.rng, "x").items() if k != "string"))
            header[field] = value
            name = f"{field}_{kind}"
        return self.case(name, ch, self.signed(header, content), DROP, header)

    def empty(self, ch):
        name = self.rng.choice(["one_empty_frame", "many_empty_frames", "lone_delimiter",
                                "delimiters_only", "delimiter_and_empty_frames"])
        fr = {"one_empty_frame": [b""], "many_empty_frames": [b""] * self.rng.randrange(2, 40),
              "lone_delimiter": [DELIM], "delimiters_only": [DELIM] * self.rng.randrange(2, 8),
              "delimiter_and_empty_frames": [DELIM] + [b""] * 5}[name]
        return self.case(name, ch, fr, DROP)

    def many_idents(self, ch):
        header, content, fr = self.base(ch)
        n = self.rng.choice([5000, 20000])
        fr[1] = "%064x".encode() % self.rng.getrandbits(256)
        idents = [self.rng.randbytes(self.rng.randrange(1, 9)) for _ in range(n)]
        return self.case(f"{n}_identities_bad_signature", ch, idents + fr, DROP, header)

    # -- decoded but not for this channel, or not an answer --
    def unknown_type(self, ch):
        if ch == "stdin":
            msg_type = self.rng.choice(["execute_request", "input_request", "Input_Reply",
                                        "input_reply ", "kernel_info_request", "comm_msg"])
        elif ch == "control":
            # interrupt_request and debug_request are control requests; on
            # shell they are unknown.
            msg_type = self.rng.choice([t for t in UNKNOWN_TYPES
                                        if t not in ("interrupt_request", "debug_request")]
                                       + ["execute_request", "complete_request",
                                          "is_complete_request", "comm_open"])
        else:
            msg_type = self.rng.choice(UNKNOWN_TYPES)
        content = (self.execute_content() if self.rng.random() < 0.7
                   else {"value": self.trace(), "code": self.trace()})
        header = self.header(msg_type)
        return self.case(repr(msg_type), ch, self.signed(header, content), IGNORE, header)

    # -- answered with an error (stdin: ignored) --
    def content_types(self, ch):
        if ch == "control":
            msg_type = "shutdown_request"
        elif ch == "stdin":
            msg_type = "input_reply"
        else:
            msg_type = self.rng.choices(
                ["execute_request", "complete_request", "inspect_request", "is_complete_request",
                 "history_request", "comm_info_request"], weights=[8, 2, 2, 1, 2, 1])[0]
        fields = CONTENT_FIELDS[msg_type]
        field = self.rng.choice(sorted(fields))
        kind, required, nullable = fields[field]
        content = {
            "execute_request": lambda: self.execute_content(),
            "complete_request": lambda: {"code": self.trace(), "cursor_pos": 3},
            "inspect_request": lambda: {"code": self.trace(), "cursor_pos": 3, "detail_level": 0},
            "is_complete_request": lambda: {"code": self.trace()},
            "history_request": lambda: {"output": False, "raw": True, "hist_access_type": "tail",
                                        "n": 3},
            "comm_info_request": lambda: {"target_name": "abuse"},
            "shutdown_request": lambda: {"restart": False},
            "input_reply": lambda: {"value": self.trace()},
        }[msg_type]()
        values = wrong_values(self.rng, self.trace())
        wrong = {k: v for k, v in values.items() if k != kind and not (nullable and k == "null")}
        if kind == "map":
            # An object is right for user_expressions only if its values are strings.
            wrong["object_of_numbers"] = {"t": self.rng.choice([1, 2.5, None, [self.trace()]])}
            wrong.pop("object", None)
        if required and self.rng.random() < 0.2:
            content.pop(field, None)
            name = f"{msg_type}_{field}_missing"
        else:
            w = self.rng.choice(sorted(wrong))
            content[field] = wrong[w]
            name = f"{msg_type}_{field}_{w}"
        header = self.header(msg_type)
        expect = IGNORE if ch == "stdin" else ERROR
        return self.case(name, ch, self.signed(header, content), expect, header, check=field)

    # -- valid, if unusual --
    def valid(self, ch, code="abuse_counter += 1"):
        """A valid request: execute CODE on shell, kernel_info on control."""
        msg_type = "execute_request" if ch == "shell" else "kernel_info_request"
        content = (self.execute_content(code, user_expressions={}) if ch == "shell" else {})
        header = self.header(msg_type)
        parent, metadata, idents, buffers = None, None, [], []
        variant = self.rng.choice(["plain"] * 6 + [
            "extra_header_field", "extra_content_fields", "minimal_header", "binary_buffers",
            "binary_identities", "hundreds_of_identities", "odd_metadata", "odd_parent"])
        if variant == "extra_header_field":
            header["x_abuse"] = {"nested": [1, None, "é"]}
            header["subshell_id"] = None
        elif variant == "extra_content_fields":
            content.update({"x_abuse": [1, 2], "cell_id": "c-1", "unused": None})
        elif variant == "minimal_header":
            header = {"msg_id": header["msg_id"], "msg_type": msg_type}
        elif variant == "binary_buffers":
            buffers = [self.rng.choice(INVALID_UTF8) + self.rng.randbytes(20) for _ in range(3)]
        elif variant == "binary_identities":
            idents = [self.rng.choice(INVALID_UTF8) + self.rng.randbytes(4) for _ in range(3)]
        elif variant == "hundreds_of_identities":
            idents = [self.rng.randbytes(6) for _ in range(self.rng.choice([300, 2000]))]
        elif variant == "odd_metadata":
            metadata = {"deletedCells": [], "x": [{"y": None}], "n": 1.5}
        elif variant == "odd_parent":
            parent = {"msg_id": "not-really", "x": [1]}
        fr = idents + self.signed(header, content, parent=parent, metadata=metadata) + buffers
        return self.case(variant, ch, fr, OK, header)

    def valid_request(self):
        """A valid shell request other than execute: complete, inspect, and so on."""
        self._family = "valid"
        msg_type, content = self.rng.choice([
            ("complete_request", {"code": "abuse_cou", "cursor_pos": 9}),
            ("inspect_request", {"code": "abuse_counter", "cursor_pos": 5, "detail_level": 0}),
            ("is_complete_request", {"code": "for i in x:"}),
            ("history_request", {"output": False, "raw": True, "hist_access_type": "tail", "n": 2}),
            ("comm_info_request", {"target_name": None}),
            ("kernel_info_request", {}),
        ])
        header = self.header(msg_type)
        # is_complete_reply's status says whether the code is complete.
        status = "incomplete" if msg_type == "is_complete_request" else "ok"
        return self.case(msg_type, "shell", self.signed(header, content), OK, header,
                         status=status)

    WEIGHTS = {"bad_signature": 10, "empty_signature": 5, "truncated_signature": 5,
               "other_key": 8, "altered": 8, "replay": 8, "bad_delimiter": 6,
               "missing_frames": 6, "extra_frames": 6, "invalid_json": 10, "invalid_utf8": 8,
               "header_types": 8, "empty": 4, "many_idents": 0.3, "unknown_type": 6,
               "content_types": 14}

    def malformed(self, ch):
        families = sorted(self.WEIGHTS)
        while True:
            family = self.rng.choices(families, weights=[self.WEIGHTS[f] for f in families])[0]
            self._family = family
            c = getattr(self, family)(ch)
            if c is not None:
                return c

    def make(self, family, ch, *args):
        self._family = family
        return getattr(self, family)(ch, *args)


# -- the kernel's side ----------------------------------------------------------------


class Peer:
    """DEALER sockets on shell, control and stdin, under one identity (the kernel
    sends input_request on stdin to the identity the execute_request came from)."""

    def __init__(self, conn):
        key = conn["key"]
        self.key = key.encode() if isinstance(key, str) else key
        self.ctx = zmq.Context()
        identity = b"abuse-" + uuid.uuid4().hex.encode()
        self.socks = {}
        for ch in ("shell", "control", "stdin"):
            s = self.ctx.socket(zmq.DEALER)
            s.linger = 0
            s.sndhwm = 0        # never block, never drop: the kernel reads at its pace
            s.rcvhwm = 0        # and the kernel's replies are never dropped on our side
            s.identity = identity
            s.connect(support.endpoint(conn, ch))
            self.socks[ch] = s

    def close(self):
        for s in self.socks.values():
            s.close(0)
        self.ctx.term()

    def send(self, case):
        big = any(len(f) > MIB for f in case.frames)
        self.socks[case.channel].send_multipart(case.frames, copy=not big)

    def recv(self, ch, timeout):
        s = self.socks[ch]
        if s.poll(int(timeout * 1000), zmq.POLLIN):
            return support.parse_any(s.recv_multipart(), self.key)
        return None


class Ledger:
    """Every message sent, and every reply received, matched by parent msg_id."""

    def __init__(self, forge, process):
        self.forge = forge
        self.process = process      # the kernel's Popen: a dead kernel answers nothing
        self.cases = []
        self.by_id = {}             # msg_id -> Case expecting a reply (OK, ERROR)
        self.refused_ids = {}       # msg_id -> Case that must get no reply
        self.replies = {}           # msg_id -> [reply, ...]
        self.strays = []            # replies to nothing we expect an answer to
        self.deferred = []          # replays waiting for their original's reply

    def send(self, peer, case):
        if case.replay_of and case.replay_of not in self.replies:
            self.deferred.append(case)
            return
        self.sent(case)
        peer.send(case)

    def sent(self, case):
        self.cases.append(case)
        if case.expect in (OK, ERROR):
            assert case.msg_id not in self.by_id, "generator bug: msg_id reused"
            self.by_id[case.msg_id] = case
        elif case.msg_id:
            self.refused_ids[case.msg_id] = case

    def received(self, msg):
        parent = msg["parent_header"].get("msg_id")
        self.replies.setdefault(parent, []).append(msg)
        if parent not in self.by_id:
            self.strays.append(msg)

    def pending(self):
        return [c for c in self.by_id.values() if c.msg_id not in self.replies]

    def pump(self, peer, ch, timeout=0.0):
        got = 0
        while True:
            msg = peer.recv(ch, timeout if got == 0 else 0)
            if msg is None:
                break
            self.received(msg)
            got += 1
        if got and self.deferred:
            waiting, self.deferred = self.deferred, []
            for case in waiting:
                self.send(peer, case)
        return got

    def wait_all(self, peer, timeout):
        deadline = time.monotonic() + timeout
        while self.pending() or self.deferred:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the kernel exited (status {self.process.returncode}) with "
                    f"{len(self.pending())} requests unanswered; the last messages sent: "
                    + ", ".join(f"{c.family}/{c.variant} on {c.channel}"
                                for c in self.cases[-5:]))
            if time.monotonic() > deadline:
                missing = self.pending()
                raise NoReply(f"{len(missing)} requests got no reply within {timeout} s, e.g. "
                              + ", ".join(f"{c.family}/{c.variant} on {c.channel}"
                                          for c in missing[:5]))
            for ch in ("shell", "control"):
                self.pump(peer, ch, 0.02)


def kernel_env():
    """This environment, with AddressSanitizer's quarantine cut to 16 MB for an
    instrumented kernel (others ignore ASAN_OPTIONS). ASan holds up to 256 MB
    of freed memory back from reuse, which RSS would count as growth; with a
    small quarantine RSS shows what the kernel really keeps, and ASan still
    checks every access and writes its reports where ASAN_OPTIONS says."""
    env = dict(os.environ)
    opts = [o for o in env.get("ASAN_OPTIONS", "").split(":") if o]
    env["ASAN_OPTIONS"] = ":".join(opts + ["quarantine_size_mb=16"])
    return env


def rss_and_fds(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return int(fields["VmRSS"][0]) * 1024, int(fields["VmHWM"][0]) * 1024, fds


def settled_fds(pid, limit, timeout=3.0):
    """The kernel's open descriptors, given up to TIMEOUT s to fall to LIMIT: IPython
    writes its history (a SQLite journal file) a moment after the last cell."""
    deadline = time.monotonic() + timeout
    while True:
        fds = rss_and_fds(pid)[2]
        if fds <= limit or time.monotonic() > deadline:
            return fds
        time.sleep(0.05)


def value_of(peer, forge, ledger, expr):
    """The repr of EXPR in the kernel, through a user_expression."""
    header = forge.header("execute_request")
    content = forge.execute_content("pass", user_expressions={"v": expr})
    case = forge.case("probe", "shell", forge.signed(header, content), OK, header)
    ledger.send(peer, case)
    ledger.wait_all(peer, 60)
    reply = ledger.replies[case.msg_id][0]["content"]
    assert reply["status"] == "ok", reply
    v = reply["user_expressions"]["v"]
    assert v["status"] == "ok", f"{expr}: {v}"
    return v["data"]["text/plain"]


def execute_now(peer, forge, ledger, code, **content):
    header = forge.header("execute_request")
    c = forge.execute_content(code, user_expressions={})
    c.update(content)
    case = forge.case("setup", "shell", forge.signed(header, c), OK, header)
    ledger.send(peer, case)
    return case


def stdin_valid_reply(forge, request, value):
    header = forge.header("input_reply")
    return forge.case("valid_input_reply", "stdin",
                      forge.signed(header, {"value": value}, parent=request["header"]),
                      OK, header)


# -- the test -------------------------------------------------------------------------------


@pytest.mark.alone   # thousands of messages as fast as the kernel takes them; RSS figures
@pytest.mark.timeout(400)
def test_thousands_of_malformed_messages_run_nothing_and_leave_the_kernel_sound(tmp_path):
    started = time.monotonic()
    trace_dir = tmp_path / "traces"
    trace_dir.mkdir()
    log_path = tmp_path / "kernel-stderr.log"
    with open(log_path, "w") as err:
        k = support.Kernel.start(stderr=err, env=kernel_env())
    peer = None
    try:
        peer = Peer(k.connection_info())
        forge = Forge(SEED, peer.key, trace_dir)
        ledger = Ledger(forge, k.process)
        run_abuse(k, peer, forge, ledger, trace_dir, log_path, tmp_path, started)
    finally:
        if peer:
            peer.close()
        k.stop()


def run_abuse(k, peer, forge, ledger, trace_dir, log_path, tmp_path, started):
    pid = k.pid

    # 1. Warm up, and show that a trace would show.
    canary = tmp_path / "canary"
    canary_expr = tmp_path / "canary-expression"
    execute_now(peer, forge, ledger,
                "abuse_counter = 0\nabuse_stdin = 0\nabuse_stdin_got = []\n"
                f"open({str(canary)!r}, 'w').write('x')",
                user_expressions={"t": f"open({str(canary_expr)!r}, 'w').write('x')"})
    for _ in range(10):
        execute_now(peer, forge, ledger, "pass")
    for _ in range(12):
        c = forge.valid_request()
        ledger.send(peer, c)
    ledger.wait_all(peer, 60)
    assert canary.exists() and canary_expr.exists(), (
        "the trace code did not leave its file even in a valid request: the test could "
        "not see code that ran")
    setup_cases = len(ledger.cases)
    time.sleep(0.5)         # IPython's history is written 200 ms after the last cell
    rss0, _, fds0 = rss_and_fds(pid)

    # 2. The flood on shell and control.
    valid_executes = 0
    for step in range(FLOOD_STEPS):
        r = forge.rng.random()
        if r < 0.11:
            c = forge.make("valid", "shell")
            valid_executes += 1
        elif r < 0.15:
            c = forge.make("valid", "control")
        elif r < 0.16:
            c = forge.valid_request()
        else:
            c = forge.malformed(forge.rng.choices(["shell", "control"], weights=[72, 28])[0])
        if c.expect == OK:
            forge.replayable.append((c.channel, c.msg_id, c.frames))
        ledger.send(peer, c)
        if step % 16 == 0:
            ledger.pump(peer, "shell")
            ledger.pump(peer, "control")
    ledger.wait_all(peer, 180)

    # 3. stdin: a cell execs what input() returns; before each valid answer come
    #    malformed ones (and control traffic, which its own thread answers meanwhile).
    stdin_cell = (f"for _abuse_i in range({STDIN_ROUNDS}):\n"
                  "    _abuse_v = input()\n"
                  "    abuse_stdin_got.append(_abuse_v)\n"
                  "    exec(_abuse_v)\n")
    cell = execute_now(peer, forge, ledger, stdin_cell, allow_stdin=True)
    answers = []
    for i in range(STDIN_ROUNDS):
        request = peer.recv("stdin", 30)
        assert request is not None, f"no input_request {i} on stdin"
        assert request["msg_type"] == "input_request", request
        assert request["parent_header"]["msg_id"] == cell.msg_id, request
        if answers:
            # The previous answer was taken: a resend of it is now a replay.
            forge.replayable.append(("stdin", None, answers[-1][1].frames))
        for _ in range(STDIN_PER_ROUND):
            c = forge.malformed("stdin")
            ledger.send(peer, c)
        for _ in range(2):
            c = (forge.make("valid", "control") if forge.rng.random() < 0.5
                 else forge.malformed("control"))
            ledger.send(peer, c)
        assert not ledger.deferred, "a stdin replay waits for a reply: it would land late"
        value = f"abuse_stdin += 1  # answer {i}"
        answer = stdin_valid_reply(forge, request, value)
        ledger.cases.append(answer)
        peer.send(answer)
        answers.append((value, answer))
        ledger.pump(peer, "control")
    ledger.wait_all(peer, 60)
    assert peer.recv("stdin", 0.2) is None, "an input_request more than the cell asked for"
    rss1, _, _ = rss_and_fds(pid)
    fds1 = settled_fds(pid, fds0)

    # 4. 100 MB frames on shell: a badly signed execute_request whose content is
    #    100 MB, then the same with a 100 MB buffer, then a correctly signed
    #    message whose 100 MB header is not JSON. Each is followed by a request
    #    on shell, whose answer means the big one was handled.
    huge_rss = []
    for variant in ("content_bad_signature", "buffer_bad_signature", "header_not_json_signed"):
        forge._family = "huge_frame"
        header = forge.header("execute_request")
        if variant == "header_not_json_signed":
            big = b"{" + forge.trace().encode() + b"x" * HUGE
            fr = forge.signed(big, {"code": forge.trace()})
            header = None
        else:
            code = forge.trace() + "  # " + "x" * (HUGE if variant.startswith("content") else 8)
            fr = forge.signed(header, forge.execute_content(code))
            fr[1] = "%064x".encode() % forge.rng.getrandbits(256)
            if variant.startswith("buffer"):
                fr.append(b"\xff" * HUGE)
        c = forge.case(variant, "shell", fr, DROP, header)
        ledger.send(peer, c)
        c.frames = fr = big = None      # the test keeps no 100 MB copies
        after = forge.make("valid", "shell")
        valid_executes += 1
        ledger.send(peer, after)
        ledger.wait_all(peer, 120)
        huge_rss.append(rss_and_fds(pid))
    rss2, hwm, _ = rss_and_fds(pid)
    fds2 = settled_fds(pid, fds0)

    # 5. Nothing invalid ran; every valid message was answered, once, correctly.
    sync = execute_now(peer, forge, ledger, "pass")
    ledger.wait_all(peer, 60)
    assert sync.msg_id in ledger.replies
    time.sleep(0.3)          # anything still in flight on control has arrived by now
    ledger.pump(peer, "shell")
    ledger.pump(peer, "control")

    traces = sorted(p.name for p in trace_dir.iterdir())
    assert not traces, "code from malformed messages ran: " + ", ".join(
        f"{t} ({forge.traces.get(t)})" for t in traces[:20])

    problems = []
    for c in ledger.cases[setup_cases:]:
        replies = ledger.replies.get(c.msg_id, []) if c.msg_id else []
        what = f"{c.family}/{c.variant} on {c.channel} ({c.msg_type})"
        if c.expect in (DROP, IGNORE):
            if replies and c.msg_id not in ledger.by_id:
                problems.append(f"{what} was answered: {replies[0]['content']}")
            continue
        if c.channel == "stdin":
            continue            # checked through abuse_stdin_got below
        if len(replies) != 1:
            problems.append(f"{what} got {len(replies)} replies, expected one")
            continue
        reply = replies[0]
        want_type = c.msg_type.replace("_request", "_reply")
        if reply["msg_type"] != want_type:
            problems.append(f"{what} was answered with a {reply['msg_type']}")
        status = reply["content"].get("status")
        if c.expect == OK and status != c.status:
            problems.append(f"valid {what} was answered {reply['content']}")
        if c.expect == ERROR and (status != "error" or reply["content"].get("ename") != "TypeError"
                                  or c.check not in reply["content"].get("evalue", "")):
            problems.append(f"{what} was answered {reply['content']}, expected a TypeError "
                            f"naming {c.check!r}")
    problems += [f"a reply to something that expects none: {m['msg_type']} "
                 f"{str(m['content'])[:200]} (parent {m['parent_header'].get('msg_id')})"
                 for m in ledger.strays]
    assert not problems, f"{len(problems)} wrong answers:\n" + "\n".join(problems[:30])

    counter = value_of(peer, forge, ledger, "abuse_counter")
    assert counter == str(valid_executes), (
        f"abuse_counter is {counter} after {valid_executes} valid executes: a replay or a "
        "malformed message ran, or a valid one did not")
    got = value_of(peer, forge, ledger, "abuse_stdin_got")
    assert ast.literal_eval(got) == [v for v, _ in answers], (
        f"input() returned other values than the valid answers: {got[:500]}")
    assert value_of(peer, forge, ledger, "abuse_stdin") == str(STDIN_ROUNDS)
    assert k.process.poll() is None, "the kernel exited"

    # 6. The kernel saw each malformed message and classified it as intended.
    log = log_path.read_text(errors="replace")
    tried = [c for c in ledger.cases[setup_cases:] if c.expect != OK]
    for ch in ("shell", "control", "stdin"):
        want = sum(1 for c in tried if c.channel == ch and c.expect == DROP)
        seen = log.count(f"dropped a message on {ch}:")
        assert seen == want, (f"{seen} messages dropped on {ch}, expected {want}:\n"
                              + "\n".join(log.splitlines()[-20:]))
    ignored = {ch: sum(1 for c in tried if c.channel == ch and c.expect == IGNORE)
               for ch in ("shell", "control", "stdin")}
    seen_ignored = {"shell": log.count("ignored a shell message of unknown type"),
                    "control": log.count("ignored a control message of unknown type"),
                    "stdin": log.count("' on stdin") + log.count("ignored an input_reply on stdin")}
    assert seen_ignored == ignored, f"ignored per channel {seen_ignored}, expected {ignored}"
    refused = sum(1 for c in tried if c.expect == ERROR)
    assert log.count("refused a ") == refused, (
        f"{log.count('refused a ')} requests refused for their content, expected {refused}")

    # 7. Memory and descriptors.
    assert rss1 <= rss0 + 64 * MIB, (
        f"RSS grew from {rss0 / MIB:.1f} to {rss1 / MIB:.1f} MiB over the flood")
    first, last = huge_rss[0][0], huge_rss[-1][0]
    assert first <= rss0 + 150 * MIB, (
        f"RSS is {first / MIB:.1f} MiB after a 100 MB frame (baseline {rss0 / MIB:.1f} MiB)")
    assert last <= first + 16 * MIB, (
        "RSS grows with each 100 MB frame: " + ", ".join(f"{r / MIB:.1f}" for r, _, _ in huge_rss))
    assert rss2 <= rss0 + 64 * MIB, (
        f"RSS is {rss2 / MIB:.1f} MiB once the 100 MB frames are gone (baseline "
        f"{rss0 / MIB:.1f} MiB)")
    assert fds1 <= fds0 and fds2 <= fds0, (
        f"the kernel's descriptors grew from {fds0} to {fds1} over the flood, {fds2} at the end")

    # 8. kernel_info on control answers within 100 ms afterwards.
    times = []
    for _ in range(20):
        header = forge.header("kernel_info_request")
        c = forge.case("latency", "control", forge.signed(header, {}), OK, header)
        t0 = time.perf_counter()
        peer.send(c)
        msg = peer.recv("control", 10)
        times.append(time.perf_counter() - t0)
        assert msg is not None, "no kernel_info_reply on control within 10 s"
        assert msg["parent_header"]["msg_id"] == c.msg_id and msg["content"]["status"] == "ok"
    median = statistics.median(times)

    report(ledger, setup_cases, valid_executes, answers, rss0, rss1, rss2, hwm, huge_rss,
           fds0, fds2, times, time.monotonic() - started)
    assert median < 0.1, f"kernel_info median {median * 1000:.1f} ms after the abuse"


def report(ledger, setup_cases, valid_executes, answers, rss0, rss1, rss2, hwm, huge_rss,
           fds0, fds2, times, elapsed):
    cases = ledger.cases[setup_cases:]
    malformed = [c for c in cases if c.expect != OK]
    valid = [c for c in cases if c.expect == OK]
    per_channel = {ch: sum(1 for c in malformed if c.channel == ch)
                   for ch in ("shell", "control", "stdin")}
    per_family = {}
    for c in malformed:
        per_family[c.family] = per_family.get(c.family, 0) + 1
    per_expect = {e: sum(1 for c in malformed if c.expect == e) for e in (DROP, IGNORE, ERROR)}
    variants = len({(c.family, c.variant) for c in malformed})
    median, worst = statistics.median(times) * 1000, max(times) * 1000
    line = (f"abuse: {len(malformed)} malformed messages (shell {per_channel['shell']}, "
            f"control {per_channel['control']}, stdin {per_channel['stdin']}; "
            f"{len(per_family)} families, {variants} variants), {len(valid)} valid, 0 executed, "
            f"RSS {rss0 / MIB:.1f} -> {rss1 / MIB:.1f} MiB "
            f"(after 3x100 MB frames {rss2 / MIB:.1f} MiB, peak {hwm / MIB:.1f} MiB), "
            f"fds {fds0} -> {fds2}, kernel_info median {median:.1f} ms (max {worst:.1f} ms)")
    print("\n" + line)
    print("abuse: per family " + ", ".join(f"{f} {n}" for f, n in sorted(per_family.items())))
    figures = {
        "summary": line, "seed": SEED, "malformed": len(malformed), "valid": len(valid),
        "valid_executes": valid_executes, "valid_input_replies": len(answers), "executed": 0,
        "per_channel": per_channel, "per_family": per_family, "per_expectation": per_expect,
        "variants": variants,
        "rss_mib": {"baseline": round(rss0 / MIB, 1), "after_flood": round(rss1 / MIB, 1),
                    "after_huge_frames": [round(r / MIB, 1) for r, _, _ in huge_rss],
                    "peak": round(hwm / MIB, 1)},
        "fds": {"before": fds0, "after": fds2},
        "kernel_info_ms": {"median": round(median, 2), "max": round(worst, 2),
                           "trips": len(times)},
        "seconds": round(elapsed, 1),
    }
    out = os.environ.get("DISTKERNEL_FIGURES_DIR")
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(out) / "abuse.json").write_text(json.dumps(figures, indent=2) + "\n")


def test_the_generator_covers_every_family_in_many_variants(tmp_path):
    """The flood is only as good as its generator: each family makes many distinct
    variants, on every channel it applies to, and the same seed makes the same
    messages."""
    key = b"k" * 32

    def generate(seed, trace_dir=tmp_path):
        forge = Forge(seed, key, trace_dir)
        out = []
        for ch in ("shell", "control", "stdin"):
            v = forge.make("valid", "shell" if ch == "stdin" else ch)
            forge.replayable.append((v.channel, v.msg_id, v.frames))
            for family in sorted(Forge.WEIGHTS):
                for _ in range(60 if family != "many_idents" else 6):
                    c = forge.make(family, ch)
                    if c is not None:
                        out.append(c)
        return out

    cases = generate(SEED)
    variants = {}
    for c in cases:
        variants.setdefault((c.family, c.channel), set()).add(c.variant)
    for family in Forge.WEIGHTS:
        for ch in ("shell", "control", "stdin"):
            n = len(variants.get((family, ch), ()))
            assert n >= (2 if family == "many_idents" else 3), (
                f"{family} on {ch} makes only {n} variants: {variants.get((family, ch))}")
    # The same messages for the same seed, wherever the traces are written.
    again = generate(SEED, tmp_path / "a-longer-directory-for-the-traces")
    same = [(c.family, c.variant, len(c.frames)) for c in cases]
    assert same == [(c.family, c.variant, len(c.frames)) for c in again], (
        "the generator is not deterministic for a seed")
    assert any(c.expect == ERROR for c in cases) and any(c.expect == IGNORE for c in cases)
