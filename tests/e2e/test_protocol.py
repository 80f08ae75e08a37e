"""The request/reply side of protocol 5.3: kernel_info, complete, inspect, is_complete,
history and comms, each checked the way a frontend uses it."""
import uuid

import pytest

from support import NoReply

PYTHON_LANGUAGE_INFO = {
    "name": "python",
    "mimetype": "text/x-python",
    "file_extension": ".py",
    "pygments_lexer": "ipython3",
    "codemirror_mode": {"name": "ipython", "version": 3},
    "nbconvert_exporter": "python",
}


def statuses(msgs):
    return [m["content"]["execution_state"] for m in msgs if m["msg_type"] == "status"]


# -- kernel_info ---------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("channel", ["shell", "control"])
def test_kernel_info_is_answered_with_protocol_5_3(kernel, channel):
    msg_id = kernel.send("kernel_info_request", channel=channel)
    reply = kernel.reply(msg_id, channel=channel)
    assert reply["msg_type"] == "kernel_info_reply"
    c = reply["content"]
    assert c["status"] == "ok"
    assert c["protocol_version"] == "5.3"
    assert isinstance(c["implementation"], str) and c["implementation"]
    assert isinstance(c["implementation_version"], str) and c["implementation_version"]
    assert isinstance(c["banner"], str)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("channel", ["shell", "control"])
def test_kernel_info_gives_full_python_language_info(kernel, channel):
    version = kernel.execute("import platform; platform.python_version()").result.strip("'")
    msg_id = kernel.send("kernel_info_request", channel=channel)
    info = kernel.reply(msg_id, channel=channel)["content"]["language_info"]
    for field, expected in PYTHON_LANGUAGE_INFO.items():
        assert info.get(field) == expected, f"language_info[{field!r}]: {info.get(field)!r}"
    assert info.get("version") == version


@pytest.mark.timeout(30)
@pytest.mark.parametrize("channel", ["shell", "control"])
def test_kernel_info_is_wrapped_in_busy_then_idle(kernel, channel):
    msg_id = kernel.send("kernel_info_request", channel=channel)
    kernel.reply(msg_id, channel=channel)
    msgs = kernel.iopub_until_idle(msg_id, timeout=10)
    assert statuses(msgs) == ["busy", "idle"]


# -- complete ------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_complete_offers_a_builtin(kernel):
    msg_id = kernel.kc.complete("impo", 4)
    c = kernel.reply(msg_id)["content"]
    assert c["status"] == "ok"
    assert "import" in c["matches"]
    assert (c["cursor_start"], c["cursor_end"]) == (0, 4)


@pytest.mark.timeout(30)
def test_complete_replaces_only_the_token_under_the_cursor(kernel):
    kernel.execute("completion_subject_xyz = 5")
    code = "y = completion_subj + 1"
    msg_id = kernel.kc.complete(code, len("y = completion_subj"))
    c = kernel.reply(msg_id)["content"]
    assert "completion_subject_xyz" in c["matches"]
    assert (c["cursor_start"], c["cursor_end"]) == (4, len("y = completion_subj"))


@pytest.mark.timeout(30)
def test_complete_is_wrapped_in_busy_then_idle(kernel):
    msg_id = kernel.kc.complete("pri", 3)
    kernel.reply(msg_id)
    assert statuses(kernel.iopub_until_idle(msg_id, timeout=10)) == ["busy", "idle"]


# -- inspect -------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_inspect_finds_a_builtin_docstring(kernel):
    msg_id = kernel.kc.inspect("len", 3, detail_level=0)
    c = kernel.reply(msg_id)["content"]
    assert c["status"] == "ok"
    assert c["found"] is True
    assert "Return the number of items" in c["data"]["text/plain"]


@pytest.mark.timeout(30)
def test_inspect_of_an_unknown_name_is_not_found(kernel):
    msg_id = kernel.kc.inspect("no_such_name_anywhere_42", 10)
    c = kernel.reply(msg_id)["content"]
    assert c["status"] == "ok"
    assert c["found"] is False


@pytest.mark.timeout(30)
def test_inspect_detail_level_1_shows_source_of_a_user_function(kernel):
    kernel.execute("def inspected_fn(a):\n    return a * 31337\n")
    msg_id = kernel.kc.inspect("inspected_fn", len("inspected_fn"), detail_level=1)
    c = kernel.reply(msg_id)["content"]
    assert c["found"] is True
    assert "31337" in c["data"]["text/plain"]


# -- is_complete ---------------------------------------------------------------


@pytest.mark.timeout(30)
def test_is_complete_says_complete_for_a_whole_statement(kernel):
    c = kernel.reply(kernel.kc.is_complete("x = 1"))["content"]
    assert c["status"] == "complete"


@pytest.mark.timeout(30)
def test_is_complete_says_incomplete_with_indent_after_a_block_opener(kernel):
    c = kernel.reply(kernel.kc.is_complete("for i in range(3):"))["content"]
    assert c["status"] == "incomplete"
    assert c["indent"] == "    "


@pytest.mark.timeout(30)
def test_is_complete_says_invalid_for_a_syntax_error(kernel):
    c = kernel.reply(kernel.kc.is_complete("x = )"))["content"]
    assert c["status"] == "invalid"


# -- history -------------------------------------------------------------------


@pytest.fixture(scope="module")
def history_cells(kernel):
    """Two marked cells run once for the history tests; returns their line numbers."""
    a = kernel.execute("hist_marker_alpha = 1")
    b = kernel.execute("hist_marker_beta = 2")
    return a.content["execution_count"], b.content["execution_count"]


@pytest.mark.timeout(30)
def test_history_tail_returns_the_last_inputs_in_order(kernel):
    kernel.execute("hist_marker_gamma = 3")
    kernel.execute("hist_marker_delta = 4")
    msg_id = kernel.kc.history(hist_access_type="tail", n=2, output=False, raw=True)
    c = kernel.reply(msg_id)["content"]
    assert c["status"] == "ok"
    assert all(len(entry) == 3 for entry in c["history"])
    assert [entry[2] for entry in c["history"]] == ["hist_marker_gamma = 3", "hist_marker_delta = 4"]


@pytest.mark.timeout(30)
def test_history_range_returns_the_requested_lines(kernel, history_cells):
    first, second = history_cells
    msg_id = kernel.kc.history(hist_access_type="range", session=0, start=first,
                               stop=second + 1, output=False, raw=True)
    c = kernel.reply(msg_id)["content"]
    assert [(e[1], e[2]) for e in c["history"]] == [
        (first, "hist_marker_alpha = 1"), (second, "hist_marker_beta = 2")]


@pytest.mark.timeout(30)
def test_history_range_with_output_pairs_input_and_output(kernel):
    n = kernel.execute("6 * 7").content["execution_count"]
    msg_id = kernel.kc.history(hist_access_type="range", session=0, start=n, stop=n + 1,
                               output=True, raw=True)
    (entry,) = kernel.reply(msg_id)["content"]["history"]
    assert entry[1] == n
    assert entry[2][0] == "6 * 7"
    assert entry[2][1] == "42"


@pytest.mark.timeout(30)
def test_history_search_matches_a_glob_pattern(kernel, history_cells):
    msg_id = kernel.kc.history(hist_access_type="search", pattern="hist_marker_*", n=100,
                               unique=True, output=False, raw=True)
    inputs = [e[2] for e in kernel.reply(msg_id)["content"]["history"]]
    assert "hist_marker_alpha = 1" in inputs
    assert "hist_marker_beta = 2" in inputs


# -- comms ---------------------------------------------------------------------

REGISTER_TARGET = """
comm_events = []
def _dk_target(comm, open_msg):
    comm_events.append(("open", open_msg["content"]["data"]))
    @comm.on_msg
    def _on_msg(msg):
        comm_events.append(("msg", msg["content"]["data"]))
        comm.send({"echo": msg["content"]["data"]})
    @comm.on_close
    def _on_close(msg):
        comm_events.append(("close", msg["content"]["data"]))
get_ipython().kernel.comm_manager.register_target("dk_test_target", _dk_target)
"""


@pytest.fixture(scope="module")
def comm_target(kernel):
    r = kernel.execute(REGISTER_TARGET)
    assert r.status == "ok", r.describe()
    return "dk_test_target"


def comm_events(kernel):
    r = kernel.execute("comm_events")
    assert r.status == "ok", r.describe()
    return r.result


@pytest.mark.timeout(30)
def test_comm_info_lists_no_comms_for_an_unused_target(kernel):
    msg_id = kernel.kc.comm_info(target_name="no_comms_have_this_target")
    c = kernel.reply(msg_id)["content"]
    assert c["status"] == "ok"
    assert c["comms"] == {}


@pytest.mark.timeout(30)
def test_comm_open_to_an_unknown_target_is_answered_with_comm_close(kernel):
    comm_id = uuid.uuid4().hex
    kernel.send("comm_open", {"comm_id": comm_id, "target_name": "no_such_target", "data": {}})
    close = kernel.wait_iopub(
        lambda m: m["msg_type"] == "comm_close" and m["content"].get("comm_id") == comm_id)
    assert close["content"]["comm_id"] == comm_id


@pytest.mark.timeout(30)
def test_comm_open_to_a_registered_target_calls_its_handler_with_the_data(kernel, comm_target):
    comm_id = uuid.uuid4().hex
    kernel.send("comm_open", {"comm_id": comm_id, "target_name": comm_target,
                              "data": {"hello": "open-data-1"}})
    assert "('open', {'hello': 'open-data-1'})" in comm_events(kernel)
    msg_id = kernel.kc.comm_info(target_name=comm_target)
    comms = kernel.reply(msg_id)["content"]["comms"]
    assert comms.get(comm_id) == {"target_name": comm_target}


@pytest.mark.timeout(30)
def test_comm_msg_reaches_the_handler_and_its_answer_reaches_the_frontend(kernel, comm_target):
    comm_id = uuid.uuid4().hex
    kernel.send("comm_open", {"comm_id": comm_id, "target_name": comm_target, "data": {}})
    kernel.send("comm_msg", {"comm_id": comm_id, "data": {"n": 17}})
    echo = kernel.wait_iopub(
        lambda m: m["msg_type"] == "comm_msg" and m["content"].get("comm_id") == comm_id)
    assert echo["content"]["data"] == {"echo": {"n": 17}}
    assert "('msg', {'n': 17})" in comm_events(kernel)


@pytest.mark.timeout(30)
def test_comm_close_reaches_the_handler_and_forgets_the_comm(kernel, comm_target):
    comm_id = uuid.uuid4().hex
    kernel.send("comm_open", {"comm_id": comm_id, "target_name": comm_target, "data": {}})
    kernel.send("comm_close", {"comm_id": comm_id, "data": {"bye": True}})
    assert "('close', {'bye': True})" in comm_events(kernel)
    comms = kernel.reply(kernel.kc.comm_info())["content"]["comms"]
    assert comm_id not in comms


@pytest.mark.timeout(30)
def test_comm_open_is_wrapped_in_busy_then_idle(kernel, comm_target):
    msg_id = kernel.send("comm_open", {"comm_id": uuid.uuid4().hex, "target_name": comm_target,
                                       "data": {}})
    try:
        msgs = kernel.iopub_until_idle(msg_id, timeout=5)
    except NoReply as e:
        pytest.fail(f"comm_open was not wrapped in busy/idle: {e}")
    assert statuses(msgs) == ["busy", "idle"]
