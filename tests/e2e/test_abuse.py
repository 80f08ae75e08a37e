"""Messages a kernel must refuse: bad or replayed signatures, missing frames, invalid
JSON, non-UTF-8 bytes, unknown types. Each is dropped without an answer and without
running anything, and the kernel answers the good request that follows."""
import json
import uuid

import pytest

import support
from support import DELIM, NoReply, jbytes, new_header, sign

QUIET = 0.5  # seconds to wait for an answer that must not come


def assert_no_answer(raw, what):
    frames = raw.recv(QUIET)
    assert frames is None, f"the kernel answered {what}: {frames[:6]}"


def assert_still_answers(raw):
    msg_id = raw.request("kernel_info_request")
    reply = raw.reply_to(msg_id, timeout=10)
    assert reply["msg_type"] == "kernel_info_reply"
    assert reply["content"]["status"] == "ok"


def make_file_code(path):
    return f"open({str(path)!r}, 'w').close()"


def signed(raw, header, content, parent=b"{}", metadata=b"{}"):
    parts = [header, parent, metadata, content]
    return [DELIM, sign(raw.key, parts)] + parts


@pytest.mark.timeout(30)
def test_execute_request_with_a_bad_signature_is_dropped_unexecuted(kernel, raw_shell, tmp_path):
    marker = tmp_path / "bad_signature_ran"
    _, frames = raw_shell.frames("execute_request", {
        "code": make_file_code(marker), "silent": False, "store_history": True,
        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
    frames[1] = b"0" * 64
    raw_shell.send_frames(frames)
    assert_no_answer(raw_shell, "an execute_request with a bad signature")
    assert_still_answers(raw_shell)
    kernel.execute("pass")  # anything queued before this has run by now
    assert not marker.exists(), "the code of a badly signed message ran"


@pytest.mark.timeout(30)
def test_message_with_an_empty_signature_is_dropped(kernel, raw_shell):
    _, frames = raw_shell.frames("kernel_info_request")
    frames[1] = b""
    raw_shell.send_frames(frames)
    assert_no_answer(raw_shell, "a message with an empty signature")
    assert_still_answers(raw_shell)


@pytest.mark.timeout(30)
def test_message_with_a_truncated_signature_is_dropped(kernel, raw_shell):
    _, frames = raw_shell.frames("kernel_info_request")
    frames[1] = frames[1][:32]
    raw_shell.send_frames(frames)
    assert_no_answer(raw_shell, "a message with a truncated signature")
    assert_still_answers(raw_shell)


@pytest.mark.timeout(30)
def test_message_signed_with_another_key_is_dropped(kernel, raw_shell):
    _, frames = raw_shell.frames("kernel_info_request")
    frames[1] = sign(b"not-the-kernel-key", frames[2:6])
    raw_shell.send_frames(frames)
    assert_no_answer(raw_shell, "a message signed with another key")
    assert_still_answers(raw_shell)


@pytest.mark.timeout(30)
def test_message_whose_content_was_altered_after_signing_is_dropped(kernel, raw_shell, tmp_path):
    marker = tmp_path / "tampered_ran"
    _, frames = raw_shell.frames("execute_request", {
        "code": "pass", "silent": False, "store_history": True, "user_expressions": {},
        "allow_stdin": False, "stop_on_error": True})
    content = json.loads(frames[5])
    content["code"] = make_file_code(marker)
    frames[5] = jbytes(content)
    raw_shell.send_frames(frames)
    assert_no_answer(raw_shell, "a tampered execute_request")
    assert_still_answers(raw_shell)
    kernel.execute("pass")
    assert not marker.exists()


@pytest.mark.timeout(30)
def test_replayed_message_is_refused(kernel, raw_shell, tmp_path):
    counter = tmp_path / "replay_count"
    msg_id, frames = raw_shell.frames("execute_request", {
        "code": f"open({str(counter)!r}, 'a').write('ran\\n')", "silent": False,
        "store_history": True, "user_expressions": {}, "allow_stdin": False,
        "stop_on_error": True})
    raw_shell.send_frames(frames)
    reply = raw_shell.reply_to(msg_id, timeout=10)
    assert reply["content"]["status"] == "ok"
    raw_shell.send_frames(frames)  # the very same frames, signature included
    assert_no_answer(raw_shell, "a replayed execute_request")
    assert_still_answers(raw_shell)
    kernel.execute("pass")
    assert counter.read_text() == "ran\n", "the replayed message ran a second time"


@pytest.mark.timeout(30)
def test_replay_on_control_of_a_shell_message_is_refused(kernel, raw_shell, raw_control):
    msg_id, frames = raw_shell.frames("kernel_info_request")
    raw_shell.send_frames(frames)
    raw_shell.reply_to(msg_id, timeout=10)
    raw_control.send_frames(frames)
    assert_no_answer(raw_control, "a kernel_info_request replayed on control")
    assert_still_answers(raw_control)


GARBAGE = {
    "no_delimiter": lambda raw: signed(raw, jbytes(new_header("kernel_info_request", raw.session)), b"{}")[1:],
    "only_the_delimiter": lambda raw: [DELIM],
    "too_few_frames": lambda raw: signed(raw, jbytes(new_header("kernel_info_request", raw.session)), b"{}")[:3],
    "single_random_frame": lambda raw: [b"\x00\xffgarbage\x01"],
    "invalid_json_header": lambda raw: signed(raw, b"{not json", b"{}"),
    "invalid_json_content": lambda raw: signed(
        raw, jbytes(new_header("kernel_info_request", raw.session)), b"{\"unterminated\": "),
    "header_is_a_json_array": lambda raw: signed(raw, b"[1, 2, 3]", b"{}"),
    "header_without_msg_type": lambda raw: signed(
        raw, jbytes({k: v for k, v in new_header("kernel_info_request", raw.session).items()
                     if k != "msg_type"}), b"{}"),
    "non_utf8_header": lambda raw: signed(
        raw, b'{"msg_id": "\xff\xfe", "msg_type": "kernel_info_request", "session": "s",'
             b' "username": "u", "date": "", "version": "5.3"}', b"{}"),
    "empty_frames": lambda raw: [DELIM, b"", b"", b"", b"", b""],
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_garbage_frames_get_no_answer_and_the_kernel_keeps_answering(kernel, raw_shell, kind):
    raw_shell.send_frames(GARBAGE[kind](raw_shell))
    assert_no_answer(raw_shell, f"garbage ({kind})")
    assert_still_answers(raw_shell)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["no_delimiter", "invalid_json_header", "empty_frames"])
def test_garbage_on_control_gets_no_answer_and_control_keeps_answering(kernel, raw_control, kind):
    raw_control.send_frames(GARBAGE[kind](raw_control))
    assert_no_answer(raw_control, f"garbage on control ({kind})")
    assert_still_answers(raw_control)


@pytest.mark.timeout(30)
def test_non_utf8_bytes_in_execute_code_are_dropped_unexecuted(kernel, raw_shell, tmp_path):
    marker = tmp_path / "non_utf8_ran"
    header = jbytes(new_header("execute_request", raw_shell.session))
    content = (b'{"code": "' + make_file_code(marker).replace("'", "\\u0027").encode()
               + b'  # \xff\xfe", "silent": false, "store_history": true, '
                 b'"user_expressions": {}, "allow_stdin": false, "stop_on_error": true}')
    raw_shell.send_frames(signed(raw_shell, header, content))
    assert_no_answer(raw_shell, "an execute_request with non-UTF-8 bytes")
    assert_still_answers(raw_shell)
    kernel.execute("pass")
    assert not marker.exists(), "code from a non-UTF-8 message ran"


@pytest.mark.timeout(30)
def test_unknown_message_type_is_ignored_or_answered_with_an_error(kernel, raw_shell):
    raw_shell.request("no_such_request_type", {})
    frames = raw_shell.recv(QUIET)
    if frames is not None:
        msg = raw_shell.parse(frames)
        assert msg["content"].get("status") == "error", f"unexpected answer: {msg}"
    assert_still_answers(raw_shell)


@pytest.mark.timeout(30)
def test_shutdown_request_with_a_bad_signature_does_not_shut_down(kernel, raw_control):
    _, frames = raw_control.frames("shutdown_request", {"restart": False})
    frames[1] = b"f" * 64
    raw_control.send_frames(frames)
    assert_no_answer(raw_control, "a badly signed shutdown_request")
    assert_still_answers(raw_control)
    assert kernel.process.poll() is None, "the kernel exited"


@pytest.mark.timeout(60)
def test_a_burst_of_garbage_does_not_stall_the_kernel(kernel, raw_shell):
    for i in range(500):
        kind = sorted(GARBAGE)[i % len(GARBAGE)]
        raw_shell.send_frames(GARBAGE[kind](raw_shell))
    assert_still_answers(raw_shell)
    r = kernel.execute("'ok after the burst'", timeout=10)
    assert r.result == "'ok after the burst'"


@pytest.mark.timeout(30)
def test_kernel_signs_its_replies_with_the_connection_key(kernel, raw_shell):
    msg_id = raw_shell.request("kernel_info_request")
    frames = raw_shell.recv(10)
    assert frames is not None
    raw_shell.parse(frames)  # raises if the signature does not verify
    i = frames.index(DELIM)
    assert len(frames[i + 1]) == 64
    assert json.loads(frames[i + 3])["msg_id"] == msg_id


@pytest.mark.timeout(30)
def test_identities_before_the_delimiter_are_routed_back(kernel, raw_shell):
    identity = uuid.uuid4().hex.encode()
    msg_id, frames = raw_shell.frames("kernel_info_request")
    raw_shell.send_frames([identity] + frames)
    reply = raw_shell.recv(10)
    assert reply is not None, "no reply to a request with an extra routing identity"
    assert reply[0] == identity
    assert raw_shell.parse(reply)["parent_header"]["msg_id"] == msg_id


@pytest.mark.timeout(60)
def test_dropped_messages_are_logged_to_stderr(tmp_path):
    log = tmp_path / "kernel-stderr.log"
    with open(log, "w") as err:
        k = support.Kernel.start(stderr=err)
    raw = support.RawChannel(k.connection_info(), "shell")
    try:
        _, frames = raw.frames("kernel_info_request")
        frames[1] = b"0" * 64
        raw.send_frames(frames)
        raw.send_frames([DELIM, b"", b"{not json"])
        assert_no_answer(raw, "badly signed and truncated messages")
        assert_still_answers(raw)
    finally:
        raw.close()
        k.stop()
    text = log.read_text(errors="replace")
    assert "signature" in text.lower(), f"nothing about the bad signature in stderr:\n{text[-2000:]}"
    assert "frame" in text.lower(), f"nothing about the missing frames in stderr:\n{text[-2000:]}"


@pytest.mark.timeout(60)
def test_a_frame_over_the_size_limit_is_never_read_or_run(tmp_path):
    """DISTKERNEL_MAX_MESSAGE_MB caps what one frame may be: a correctly signed
    execute_request over it is not read (its sender is disconnected), so its code
    never runs and the kernel's memory does not take it in; the same request
    under the cap runs, so the cap is what refused it."""
    import psutil
    k = support.Kernel.start(env=support.kernel_env(DISTKERNEL_MAX_MESSAGE_MB=4))
    try:
        proc = psutil.Process(k.pid)
        over, under = tmp_path / "over", tmp_path / "under"
        padding = "#" + "x" * (6 << 20) + "\n"
        raw = support.RawChannel(k.connection_info(), "shell")
        try:
            raw.request("execute_request", {"code": padding + make_file_code(over),
                                            "silent": False})
            assert_no_answer(raw, "a request over the size limit")
        finally:
            raw.close()
        rss_after = proc.memory_info().rss
        raw = support.RawChannel(k.connection_info(), "shell")
        try:
            assert_still_answers(raw)
            msg_id = raw.request("execute_request", {
                "code": "#" + "x" * (1 << 20) + "\n" + make_file_code(under), "silent": False})
            reply = raw.reply_to(msg_id, timeout=20)
            assert reply["content"]["status"] == "ok", reply["content"]
        finally:
            raw.close()
        assert under.exists(), "a request under the size limit did not run"
        # The shell runs requests in order: had the first been read, it ran before.
        assert not over.exists(), "the code of a frame over the limit ran"
        assert rss_after < 200 << 20, f"kernel RSS {rss_after >> 20} MiB"
    finally:
        k.stop()
