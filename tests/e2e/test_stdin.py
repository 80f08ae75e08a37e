"""input() and getpass() in a cell become input_request on the stdin channel when the
frontend allows it, and StdinNotImplementedError when it does not."""
import pytest


@pytest.mark.timeout(30)
def test_input_sends_input_request_and_returns_the_answer(kernel):
    msg_id = kernel.start_execute("answer = input('your name? ')\nprint('got', answer)",
                                  allow_stdin=True)
    req = kernel.stdin_request()
    assert req["msg_type"] == "input_request"
    assert req["parent_header"]["msg_id"] == msg_id
    assert req["content"]["prompt"] == "your name? "
    assert req["content"]["password"] is False
    kernel.kc.input("Ada")
    r = kernel.finish(msg_id)
    assert r.status == "ok", r.describe()
    assert "got Ada\n" in r.stdout


@pytest.mark.timeout(30)
def test_getpass_sends_a_password_input_request(kernel):
    msg_id = kernel.start_execute("import getpass\nsecret = getpass.getpass('pw: ')\nlen(secret)",
                                  allow_stdin=True)
    req = kernel.stdin_request()
    assert req["content"]["prompt"] == "pw: "
    assert req["content"]["password"] is True
    kernel.kc.input("hunter2")
    r = kernel.finish(msg_id)
    assert r.status == "ok", r.describe()
    assert r.result == "7"
    assert "hunter2" not in r.stdout


@pytest.mark.timeout(30)
def test_output_before_input_is_flushed_while_waiting_for_the_answer(kernel):
    msg_id = kernel.start_execute("print('shown before the prompt')\nx_in = input('> ')",
                                  allow_stdin=True)
    kernel.stdin_request()
    try:
        stream = kernel.wait_iopub_type(msg_id, "stream", timeout=1.0)
        assert stream["content"]["text"] == "shown before the prompt\n"
    finally:
        kernel.kc.input("done")
        kernel.finish(msg_id)


@pytest.mark.timeout(30)
def test_input_without_allow_stdin_raises_stdin_not_implemented(kernel):
    r = kernel.execute("input('never asked: ')", allow_stdin=False)
    assert r.status == "error"
    assert r.content["ename"] == "StdinNotImplementedError"
    assert len(r.of_type("error")) == 1


@pytest.mark.timeout(30)
def test_two_inputs_in_one_cell_each_get_their_answer(kernel):
    msg_id = kernel.start_execute("a_in = input('a? ')\nb_in = input('b? ')\na_in + '+' + b_in",
                                  allow_stdin=True)
    assert kernel.stdin_request()["content"]["prompt"] == "a? "
    kernel.kc.input("one")
    assert kernel.stdin_request()["content"]["prompt"] == "b? "
    kernel.kc.input("two")
    assert kernel.finish(msg_id).result == "'one+two'"
