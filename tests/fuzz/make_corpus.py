#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

The seeds are small, real inputs of each kind (Jupyter messages signed the way
jupyter_client signs them, connection files as jupyter_client writes them, cells
using %%distributed, tqdm output), so the fuzzer starts from inputs that reach
deep into each parser instead of having to discover the formats. Each is in the
input format its target's header comment describes. Run again after changing
this file; it rewrites the folders.
"""
import hashlib
import hmac
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = b"fuzz-key"
SEP = b"\x1e"
DELIM = b"<IDS|MSG>"


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def reset(target):
    shutil.rmtree(os.path.join(HERE, "corpus", target), ignore_errors=True)


def compact(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def header(msg_type, msg_id="5e9f0a84-2c1b-4f3e-9a6d-1b2c3d4e5f60"):
    return {"msg_id": msg_id, "msg_type": msg_type, "session": "b8a1f4d2-77c3-4e0a",
            "username": "user", "date": "2024-05-01T12:00:00.000000Z", "version": "5.3"}


def wire(flags, parts, idents=(), buffers=(), sig=None, key=KEY):
    parts = [p if isinstance(p, bytes) else compact(p) for p in parts]
    if sig is None:
        sig = hmac.new(key, b"".join(parts), hashlib.sha256).hexdigest().encode() if key else b""
    frames = list(idents) + [DELIM, sig] + parts + list(buffers)
    return bytes([flags]) + SEP.join(frames)


def wire_seeds():
    t = "fuzz_wire"
    reset(t)
    ident = b"\x00\x6b\x8b\x45\x67"   # a ROUTER socket's routing id
    parent = header("execute_request", "0c7f3b21-aa10-4b6e-8d2c-000000000001")
    write(t, "kernel_info_request", wire(0x00, [header("kernel_info_request"), {}, {}, {}],
                                         idents=[ident]))
    write(t, "execute_request", wire(0x70, [
        header("execute_request"), {}, {},
        {"code": "%%distributed num_processes=2\nprint('rank', 1)", "silent": False,
         "store_history": True, "user_expressions": {}, "allow_stdin": True,
         "stop_on_error": True}], idents=[ident, b"client-1"]))
    write(t, "stream_reply_with_parent", wire(0x00, [
        header("stream"), parent, {"rank": 0},
        {"name": "stdout", "text": "[rank 0] loss 0.25 \u2588\u2588\u258c\n"}]))
    write(t, "comm_msg_with_buffers", wire(0x20, [
        header("comm_msg"), {}, {},
        {"comm_id": "c1", "data": {"method": "update", "buffer_paths": [["value"]]}}],
        buffers=[b"\x00\x01\x02\xff" * 4, b""]))
    write(t, "complete_request_numbers", wire(0x00, [
        header("complete_request"), {}, {"deep": {"a": [1, 2.5, -3e10, None, True]}},
        {"code": "import tor", "cursor_pos": 10}]))
    # Signature wrong (another key): refused; with bit 0 re-signed and accepted.
    bad = wire(0x00, [header("shutdown_request"), {}, {}, {"restart": False}],
               sig=hmac.new(b"other", b"x", hashlib.sha256).hexdigest().encode())
    write(t, "wrong_signature", bad)
    write(t, "wrong_signature_resigned", bytes([0x01]) + bad[1:])
    # Unsigned (empty signature), as with "key": "".
    write(t, "unsigned_interrupt", wire(0x00, [header("interrupt_request"), {}, {}, {}],
                                        key=b""))
    # Parseable only once re-signed: header missing msg_type, content an array.
    write(t, "no_msg_type", wire(0x01, [{"msg_id": "x"}, {}, {}, {}], sig=b"0" * 64))
    write(t, "content_not_object", wire(0x01, [header("execute_request"), {}, {}, b"[1,2]"],
                                        sig=b"0" * 64))
    write(t, "too_few_frames", b"\x00" + SEP.join([DELIM, b"0" * 64, b"{}", b"{}"]))
    # Repeated frames: the replay model sees replays and evictions.
    sig = hmac.new(KEY, b"{}{}{}{}", hashlib.sha256).hexdigest().encode()
    write(t, "replays", b"\x10" + SEP.join([b"a", b"b", b"a", b"c", b"b", b"a", sig, sig,
                                           b"x" * 80, b"x" * 80, DELIM, sig, b"{}", b"{}",
                                           b"{}", b"{}"]))


def conn_seeds():
    t = "fuzz_conn"
    reset(t)
    base = {"shell_port": 53794, "iopub_port": 53795, "stdin_port": 53796,
            "control_port": 53797, "hb_port": 53798, "ip": "127.0.0.1",
            "key": "a0436f6c-1916-498b-8eb9-e81ab9368e84", "transport": "tcp",
            "signature_scheme": "hmac-sha256", "kernel_name": "distkernel"}
    write(t, "jupyter_client_tcp", json.dumps(base, indent=1))
    ipc = dict(base, transport="ipc", ip="/tmp/kernel-2c8d4f1e")
    write(t, "ipc", json.dumps(ipc))
    unsigned = dict(base, key="")
    del unsigned["signature_scheme"]
    write(t, "empty_key", json.dumps(unsigned))
    write(t, "string_ports", json.dumps(dict(base, shell_port="5555", hb_port="65535")))
    write(t, "ipv6", json.dumps(dict(base, ip="::1", kernel_name="")))
    no_key = dict(base)
    del no_key["key"]
    write(t, "missing_key", json.dumps(no_key))
    write(t, "wrong_scheme", json.dumps(dict(base, signature_scheme="hmac-md5")))
    write(t, "port_zero", json.dumps(dict(base, iopub_port=0)))
    write(t, "unicode_key", '{"shell_port":1,"iopub_port":2,"stdin_port":3,"control_port":4,'
          '"hb_port":5,"ip":"0.0.0.0","key":"k\\u00e9y\\ud83d\\ude00","signature_scheme":'
          '"hmac-sha256"}')
    write(t, "not_an_object", "[53794, \"127.0.0.1\"]")


def opts_seeds():
    t = "fuzz_opts"
    reset(t)
    seeds = {
        "accelerators": "num_accelerators=8 accelerator_type=GPU_8xH100 timeout=3600",
        "cpu_ranks": "num_processes=2 output=rank0 result=losses",
        "deprecated": "gpus=4 gpu_type=h100",
        "quoted": "timeout=None tracking=False experiment='my exp' run_name=\"run \\\"1\\\"\"",
        "check": "check=True num_accelerators=2 timeout=1e3",
        "output_all": "output=all tracking=true check=false",
        "output_list": "num_processes=32 output='0, 8,16-31,8' result=r",
        "output_local0": "output=local0 nodes=4 num_processes=8",
        "output_bad_list": "output=3-1,x,,4096",
        "cell": "%%distributed num_processes=2\nimport torch.distributed as dist\n"
                "dist.init_process_group()\nprint(dist.get_rank())\n",
        "cell_blank_lines": "\n  \t\n%%distributed\taccelerator_type=GPU_1xA10 \r\nx = 1\n",
        "cell_help": "%%distributed?\n",
        "line_magic": "%dk_status  \n\n",
        "line_magic_then_code": "%distributed num_processes=1\nprint(1)\n",
        "not_a_magic": "x = 10 % 3\n%%distributed\n",
        "bad_option": "%%distributed num_processes=0 output=some\nbody",
        "contradiction": "num_accelerators=2 accelerator_type=GPU_8xB300",
        "unterminated": "experiment='never closed",
    }
    for name, text in seeds.items():
        write(t, name, text)


def lines_seeds():
    t = "fuzz_lines"
    reset(t)

    def lines(max_line, sizes, payload):
        return bytes([max_line, len(sizes)]) + bytes(sizes) + payload

    bar = "".join("\rEpoch 1: %3d%%|%s%s| %d/10 [00:0%d<00:09]" %
                  (i * 10, "\u2588" * i, " " * (10 - i), i, i) for i in range(11))
    tqdm = (bar + "\n").encode()
    write(t, "tqdm_whole", lines(0, [], tqdm))
    # Chunks of 7 and 5 bytes cut the 3-byte block characters apart.
    write(t, "tqdm_split_utf8", lines(0, [7, 5], tqdm))
    write(t, "crlf_lines", lines(0, [3], b"step 1 loss=0.5\r\nstep 2 loss=0.4\r\n\r\ndone"))
    write(t, "pending_cr_at_chunk_end", lines(0, [4, 1, 0], b"abc\r\ndef\rxyz\r"))
    write(t, "long_line_cut", lines(16, [9], b"0123456789" * 5 + b"\n" + "é".encode() * 20))
    write(t, "invalid_bytes", lines(8, [2], b"ok\xff\xfe\xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80"
                                            b"\x00nul\n\xe2\x82"))
    write(t, "emoji_split", lines(5, [1, 2, 3], "ranks 🚀🚀 done\n".encode()))
    write(t, "progress_then_clear", lines(0, [6], b"loading\r\r       \rdone\n"))


def launchout_seeds():
    t = "fuzz_launchout"
    reset(t)

    def pipe(sizes, payload):
        return bytes([len(sizes)]) + bytes(sizes) + payload

    srun = (b"srun: error: node2: task 0: Exited with exit code 1\n"
            b"Traceback (most recent call last):\n"
            b"slurmstepd: error: *** STEP 12.3 ON node1 CANCELLED AT 2026-12-02T01:00:00 ***\n"
            b"slurmstepd-node1: error: couldn't chdir to `/home/u/nb': No such file or "
            b"directory: going to /tmp instead\n"
            b"srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
            b"srun: error: node2: task 0: Killed")
    write(t, "srun_whole", pipe([], srun))
    # Chunks of 3 and 1 bytes cut the prefixes apart.
    write(t, "srun_split", pipe([3, 1], srun))
    write(t, "near_prefixes", pipe([2], b"sru\nslurmstepd\nslurmstepd-\nslurmstepd-a b: x\n"
                                        b"srun:x\ns\n\nslurmstepd-n:\nslurmstepd-" +
                                        b"h" * 64 + b": ok\nslurmstepd-" + b"h" * 65 + b": no\n"))
    write(t, "long_launcher_line", pipe([200, 0, 7], b"srun: " + b"x" * 9000 + b"\nafter\n"))


def stacks_seeds():
    t = "fuzz_stacks"
    reset(t)
    fixtures = os.path.join(HERE, "..", "unit", "stacks")

    def fixture(name):
        with open(os.path.join(fixtures, name), "rb") as f:
            return f.read()

    def ranks(max_lines, dumps):
        return bytes([len(dumps) - 1, max_lines]) + b"\n%%\n".join(dumps)

    # The example: three ranks in all_reduce, rank 2 asleep.
    r0, r2 = fixture("rank0.txt"), fixture("rank2.txt")
    write(t, "issue_example", ranks(0, [r0, r0, r2, r0]))
    write(t, "deep_recursion", ranks(0, [fixture("deep.txt")]))
    write(t, "budget_of_two", ranks(2, [r0, r2, r0[:200], b"", r2[:-30]]))
    write(t, "odd_frames", ranks(0, [
        b"Traceback (most recent call first):\n"
        b'  File "???", line ??? in ???\n'
        b'  File "/tmp/distkernel-cells-1-fixture/1.py", line 3 in f\n'
        b'  File "/tmp/distkernel-cells-1-fixture/1.py", line 3 in f\n'
        b'  File "/tmp/distkernel-cells-1-fixture/1.py", line 9 in <module>\n'
        b"  <no Python frame>\n...\n",
        b'Thread 0x1 [pt_main_thread] (most recent call first):\n'
        b'  File "a", line 5", line 7 in in in\n  ...\n']))


if __name__ == "__main__":
    wire_seeds()
    conn_seeds()
    opts_seeds()
    lines_seeds()
    launchout_seeds()
    stacks_seeds()
