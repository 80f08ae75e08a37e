"""execute_request end to end: what a cell publishes, what its reply says, and how
silent, store_history, user_expressions and stop_on_error change that; plus the
IPython conveniences a notebook user expects (magics, `obj?`, completion)."""
import pytest


def statuses(msgs):
    return [m["content"]["execution_state"] for m in msgs if m["msg_type"] == "status"]


@pytest.mark.timeout(30)
def test_execute_is_wrapped_in_busy_then_idle(kernel):
    r = kernel.execute("pass")
    assert r.messages[0]["msg_type"] == "status"
    assert statuses(r.messages) == ["busy", "idle"]
    assert r.messages[-1]["content"]["execution_state"] == "idle"


@pytest.mark.timeout(30)
def test_execute_input_echoes_the_code_and_its_execution_count(kernel):
    code = "execute_input_probe = 1"
    r = kernel.execute(code)
    (inp,) = r.of_type("execute_input")
    assert inp["content"]["code"] == code
    assert inp["content"]["execution_count"] == r.content["execution_count"]
    assert r.messages.index(inp) == 1, "execute_input should come right after status busy"


@pytest.mark.timeout(30)
def test_execution_count_increases_by_one_per_cell(kernel):
    first = kernel.execute("1").content["execution_count"]
    second = kernel.execute("2").content["execution_count"]
    assert second == first + 1


@pytest.mark.timeout(30)
def test_print_produces_a_stdout_stream(kernel):
    r = kernel.execute("print('hello, world')")
    assert r.status == "ok"
    assert r.stdout == "hello, world\n"


@pytest.mark.timeout(30)
def test_write_to_sys_stderr_produces_a_stderr_stream(kernel):
    r = kernel.execute("import sys; sys.stderr.write('oops\\n')")
    assert r.stderr == "oops\n"


@pytest.mark.timeout(30)
def test_last_expression_produces_execute_result_with_the_execution_count(kernel):
    r = kernel.execute("1 + 2")
    (res,) = r.of_type("execute_result")
    assert res["content"]["data"]["text/plain"] == "3"
    assert res["content"]["execution_count"] == r.content["execution_count"]


@pytest.mark.timeout(30)
def test_statement_without_value_produces_no_execute_result(kernel):
    r = kernel.execute("x_no_result = 3")
    assert r.of_type("execute_result") == []
    assert r.outputs == []


@pytest.mark.timeout(30)
def test_display_produces_display_data(kernel):
    r = kernel.execute("from IPython.display import display, HTML\ndisplay(HTML('<b>bold</b>'))")
    (d,) = r.of_type("display_data")
    assert d["content"]["data"]["text/html"] == "<b>bold</b>"
    assert "text/plain" in d["content"]["data"]


@pytest.mark.timeout(30)
def test_display_handle_update_produces_update_display_data(kernel):
    r = kernel.execute(
        "from IPython.display import display\n"
        "h = display('first version', display_id=True)\n"
        "h.update('second version')\n")
    (d,) = r.of_type("display_data")
    (u,) = r.of_type("update_display_data")
    display_id = d["content"]["transient"]["display_id"]
    assert display_id
    assert u["content"]["transient"]["display_id"] == display_id
    assert d["content"]["data"]["text/plain"] == "'first version'"
    assert u["content"]["data"]["text/plain"] == "'second version'"


@pytest.mark.timeout(30)
def test_update_display_from_a_later_cell_targets_the_same_display_id(kernel):
    first = kernel.execute(
        "from IPython.display import display\nlater_handle = display('v1', display_id=True)")
    display_id = first.of_type("display_data")[0]["content"]["transient"]["display_id"]
    second = kernel.execute("later_handle.update('v2')")
    (u,) = second.of_type("update_display_data")
    assert u["content"]["transient"]["display_id"] == display_id


@pytest.mark.timeout(30)
def test_clear_output_produces_clear_output_with_wait_flag(kernel):
    r = kernel.execute(
        "from IPython.display import clear_output\nprint('a')\nclear_output(wait=True)\nprint('b')")
    (c,) = r.of_type("clear_output")
    assert c["content"]["wait"] is True
    kinds = [m["msg_type"] for m in r.outputs]
    assert kinds.index("clear_output") > 0, "the print before clear_output must be flushed first"


@pytest.mark.timeout(30)
def test_error_produces_exactly_one_error_message(kernel):
    r = kernel.execute("1 / 0")
    errors = r.of_type("error")
    assert len(errors) == 1, r.describe()
    e = errors[0]["content"]
    assert e["ename"] == "ZeroDivisionError"
    assert e["evalue"] == "division by zero"
    assert isinstance(e["traceback"], list) and e["traceback"]
    assert all(isinstance(line, str) for line in e["traceback"])


@pytest.mark.timeout(30)
def test_error_reply_carries_ename_evalue_and_traceback(kernel):
    r = kernel.execute("def failing():\n    raise ValueError('bad value 7')\nfailing()")
    c = r.content
    assert c["status"] == "error"
    assert c["ename"] == "ValueError"
    assert c["evalue"] == "bad value 7"
    assert isinstance(c["traceback"], list) and c["traceback"]
    (err,) = r.of_type("error")
    assert (err["content"]["ename"], err["content"]["evalue"]) == (c["ename"], c["evalue"])
    assert any("failing" in line for line in c["traceback"])


@pytest.mark.timeout(30)
def test_syntax_error_is_reported_as_one_error(kernel):
    r = kernel.execute("def broken(:\n    pass")
    assert r.status == "error"
    assert r.content["ename"] == "SyntaxError"
    assert len(r.of_type("error")) == 1


@pytest.mark.timeout(30)
def test_error_after_output_keeps_the_output(kernel):
    r = kernel.execute("print('before the error')\nraise RuntimeError('late')")
    assert r.stdout == "before the error\n"
    kinds = [m["msg_type"] for m in r.outputs]
    assert kinds.index("stream") < kinds.index("error")


@pytest.mark.timeout(30)
def test_user_expressions_are_evaluated_after_the_cell(kernel):
    r = kernel.execute("ue_base = 20", user_expressions={"double": "ue_base * 2"})
    assert r.status == "ok"
    ue = r.content["user_expressions"]["double"]
    assert ue["status"] == "ok"
    assert ue["data"]["text/plain"] == "40"
    assert "metadata" in ue


@pytest.mark.timeout(30)
def test_failing_user_expression_reports_its_error_without_failing_the_cell(kernel):
    r = kernel.execute("ue_ok = 1", user_expressions={"bad": "1 / 0", "good": "ue_ok"})
    assert r.status == "ok"
    bad = r.content["user_expressions"]["bad"]
    assert bad["status"] == "error"
    assert bad["ename"] == "ZeroDivisionError"
    assert "traceback" in bad
    assert r.content["user_expressions"]["good"]["data"]["text/plain"] == "1"
    assert r.of_type("error") == []


@pytest.mark.timeout(30)
def test_silent_execute_publishes_no_execute_input_nor_execute_result(kernel):
    r = kernel.execute("40 + 2", silent=True)
    assert r.status == "ok"
    assert r.of_type("execute_input") == []
    assert r.of_type("execute_result") == []


@pytest.mark.timeout(30)
def test_silent_execute_does_not_increment_the_execution_count(kernel):
    before = kernel.execute("1").content["execution_count"]
    kernel.execute("silent_ran = True", silent=True)
    after = kernel.execute("2").content["execution_count"]
    assert after == before + 1
    assert kernel.execute("silent_ran").result == "True"


@pytest.mark.timeout(30)
def test_store_history_false_does_not_increment_the_execution_count(kernel):
    before = kernel.execute("1").content["execution_count"]
    r = kernel.execute("unstored = 5", store_history=False)
    assert r.status == "ok"
    after = kernel.execute("2").content["execution_count"]
    assert after == before + 1


@pytest.mark.timeout(30)
def test_store_history_false_keeps_the_cell_out_of_history(kernel):
    kernel.execute("kept_out_of_history_marker = 1", store_history=False)
    msg_id = kernel.kc.history(hist_access_type="tail", n=20, output=False, raw=True)
    inputs = [e[2] for e in kernel.reply(msg_id)["content"]["history"]]
    assert "kept_out_of_history_marker = 1" not in inputs


@pytest.mark.timeout(30)
def test_stop_on_error_aborts_an_execute_already_queued(kernel):
    failing = kernel.start_execute("import time; time.sleep(0.3); raise ValueError('stop here')")
    queued = kernel.start_execute("ran_after_error = True")
    first = kernel.finish(failing)
    second = kernel.finish(queued)
    assert first.status == "error"
    assert second.status == "aborted", second.describe()
    assert second.of_type("execute_input", "execute_result", "stream") == []
    r = kernel.execute("'ran_after_error' in dir()")
    assert r.status == "ok", "a request sent after the error must run again"
    assert r.result == "False"


@pytest.mark.timeout(30)
def test_stop_on_error_false_lets_the_queued_execute_run(kernel):
    failing = kernel.start_execute("import time; time.sleep(0.3); raise ValueError('go on')",
                                   stop_on_error=False)
    queued = kernel.start_execute("ran_after_tolerated_error = True")
    assert kernel.finish(failing).status == "error"
    assert kernel.finish(queued).status == "ok"
    assert kernel.execute("ran_after_tolerated_error").result == "True"


@pytest.mark.timeout(30)
def test_percent_time_magic_reports_wall_time_and_the_value(kernel):
    r = kernel.execute("%time sum(range(10))")
    assert r.status == "ok", r.describe()
    assert "Wall time" in r.stdout
    assert r.result == "45"


@pytest.mark.timeout(30)
def test_cell_magic_capture_runs(kernel):
    r = kernel.execute("%%capture captured\nprint('hidden')")
    assert r.status == "ok"
    assert r.stdout == ""
    assert kernel.execute("captured.stdout").result == "'hidden\\n'"


@pytest.mark.timeout(30)
def test_question_mark_puts_help_in_a_page_payload(kernel):
    kernel.execute("paged_object = [1, 2, 3]")
    r = kernel.execute("paged_object?")
    assert r.status == "ok"
    (payload,) = r.content["payload"]
    assert payload["source"] == "page"
    assert "list" in payload["data"]["text/plain"]
    assert r.of_type("execute_result") == []


@pytest.mark.timeout(30)
def test_tab_completion_offers_a_variable_from_an_earlier_cell(kernel):
    kernel.execute("defined_earlier_variable = 1")
    msg_id = kernel.kc.complete("defined_earl", len("defined_earl"))
    c = kernel.reply(msg_id)["content"]
    assert "defined_earlier_variable" in c["matches"]


@pytest.mark.timeout(30)
def test_get_ipython_kernel_is_available_to_cells(kernel):
    r = kernel.execute("hasattr(get_ipython(), 'kernel') and get_ipython().kernel is not None")
    assert r.result == "True"
