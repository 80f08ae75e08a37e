"""A rank's last collective, from torch's NCCL flight recorder, as the one line
its stacks answer ends in (runtime/stacks/dk_stacks.h, DK_STACKS_FLIGHT):

    distkernel flight: op=all_reduce seq=12 state=started bytes=4194304 pg=0

The kernel shows it on each group's line of "Where the ranks were", so that in
a hung NCCL run the rank one collective behind stands out.

Read only where the answer is made with the GIL (the sampler thread of
_rankstacks.py): faulthandler's handler, which runs without it, cannot call
Python. Nothing is imported here:
without torch imported, an initialised NCCL process group and the recorder
on (TORCH_NCCL_TRACE_BUFFER_SIZE > 0), line() is "" after a few dict
lookups; with them, it costs the recorder's dump and its pickle load. Any
failure gives "" too, so the answer is the stacks alone, as before.

The dump's schema (torch 2.2 to 2.5): a pickled dict whose "entries" are
dicts, oldest first, with "profiling_name" ("nccl:all_reduce"), the
sequence number as "collective_seq_id" (2.3+, "p2p_seq_id" for a send or
recv, "is_p2p") or "seq_id" (2.2), "state" ("scheduled", "started",
"completed"), "input_sizes" (a shape per tensor), "input_dtypes" (2.4+,
"Float", "BFloat16" ...), "pg_id" and "process_group" ((name, description),
2.4+), "record_id". Every key is optional here.
"""
import os
import sys

PREFIX = "distkernel flight: "

# Bytes per element of the dtype names the recorder writes (c10's ScalarType names).
_DTYPE_BYTES = {
    "Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16,
    "ComplexHalf": 4, "UInt16": 2, "UInt32": 4, "UInt64": 8,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
}


def line():
    """The flight line of this rank's last collective, ending in a newline, or
    "" when there is none to read (see the top); never raises."""
    try:
        return _line()
    except Exception:   # noqa: BLE001 - an answer without it beats none
        return ""


def _recorder_on():
    try:
        return int(os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0")) > 0
    except ValueError:
        return False


def _line():
    torch = sys.modules.get("torch")
    dist = sys.modules.get("torch.distributed")
    if torch is None or dist is None or not _recorder_on():
        return ""
    if not dist.is_available() or not dist.is_initialized():
        return ""
    if "nccl" not in str(dist.get_backend()).lower():
        return ""
    c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    dump = getattr(c10d, "_dump_nccl_trace", None)
    if dump is None:
        return ""       # a torch without the recorder (before 2.2)
    try:
        raw = dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    except TypeError:   # 2.2 and 2.3 take no arguments
        raw = dump()
    import pickle
    trace = pickle.loads(raw)
    entries = trace.get("entries") if isinstance(trace, dict) else None
    if not entries:
        return ""
    return format_entry(_last(entries))


def _last(entries):
    """The newest entry: the highest record_id, else the last listed."""
    ids = [e.get("record_id") for e in entries]
    if all(isinstance(i, int) for i in ids):
        return entries[max(range(len(entries)), key=ids.__getitem__)]
    return entries[-1]


def _word(value, limit=40):
    """VALUE as one field's word: no spaces or control characters, bounded."""
    text = "".join(c if c.isprintable() and not c.isspace() else "_" for c in str(value))
    return text[:limit]


def format_entry(entry):
    """One recorder entry (a dict) as the flight line; "" without an op or a
    sequence number."""
    name = str(entry.get("profiling_name", ""))
    words = name.split(":", 1)[-1].split()     # "nccl:send 0->1": "send"
    op = words[0] if words else ""
    if entry.get("is_p2p"):
        seq = entry.get("p2p_seq_id")
    else:
        seq = entry.get("collective_seq_id", entry.get("seq_id"))
    if not op or not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        return ""
    fields = ["op=" + _word(op, 31), "seq=%d" % seq]
    state = entry.get("state")
    if state:
        fields.append("state=" + _word(state, 15))
    sizes = entry.get("input_sizes") or []
    dtypes = entry.get("input_dtypes") or []
    nbytes = _bytes(sizes, dtypes)
    if nbytes is not None:
        fields.append("bytes=%d" % nbytes)
    elif sizes and isinstance(sizes[0], (list, tuple)):
        shape = "[" + ",".join(str(int(d)) for d in sizes[0]) + "]"
        more = "+%d" % (len(sizes) - 1) if len(sizes) > 1 else ""
        fields.append("shape=" + _word(shape + more, 39))
    pg = entry.get("process_group")
    pg = pg[0] if isinstance(pg, (list, tuple)) and pg else entry.get("pg_id")
    if pg is not None and pg != "":
        fields.append("pg=" + _word(pg, 23))
    return PREFIX + " ".join(fields) + "\n"


def _bytes(sizes, dtypes):
    """The inputs' bytes, when every tensor's shape and dtype are known."""
    if not sizes or len(dtypes) != len(sizes):
        return None
    total = 0
    for shape, dtype in zip(sizes, dtypes):
        size = _DTYPE_BYTES.get(str(dtype))
        if size is None or not isinstance(shape, (list, tuple)):
            return None
        n = 1
        for d in shape:
            n *= int(d)
        total += n * size
    return total
