"""Read the executed tests/device/ddp_nccl.ipynb and say, check by check, what the GPU path did.

    python3 tests/device/verify_notebook.py EXECUTED.ipynb

One line per check, PASS or FAIL with the evidence; exit status 1 if any failed.
Reads the notebook as plain JSON, so it runs on any Python.
"""
import json
import sys


def text_of(cell):
    """Everything a cell showed: streams, results, errors (with tracebacks)."""
    parts = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            parts.append("".join(out.get("text", "")))
        elif kind in ("execute_result", "display_data", "update_display_data"):
            parts.append("".join(out.get("data", {}).get("text/plain", "")))
        elif kind == "error":
            parts.append(f"ERROR {out.get('ename')}: {out.get('evalue')}\n" +
                         "\n".join(out.get("traceback", [])))
    return "\n".join(parts)


def has_error(cell):
    return any(o.get("output_type") == "error" for o in cell.get("outputs", []))


def tagged(text, tag):
    for line in text.splitlines():
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1:])
    return None


def main():
    nb = json.load(open(sys.argv[1]))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    setup, mismatch, too_many, after_disc, check, ddp, result, after_ddp = code[:8]
    results = []

    def report(ok, what, evidence):
        results.append(ok)
        evidence = " ".join(evidence.split())[:600]
        print(f"{'PASS' if ok else 'FAIL'}: {what}: {evidence}")

    t = text_of(mismatch)
    report(has_error(mismatch) and "H200" in t and "must not run" not in t,
           "accelerator_type=GPU_8xH100 on a 1xH200 node fails naming H200", t)
    t = text_of(too_many)
    report(has_error(too_many) and "must not run" not in t and ("more GPU" in t or "H200" in t),
           "num_accelerators=2 on a 1-GPU node fails before launch", t)
    for cell, tag in ((setup, "KERNEL_CUDA_BEFORE"), (after_disc, "KERNEL_CUDA_AFTER_DISCOVERY"),
                      (after_ddp, "KERNEL_CUDA_AFTER_DDP")):
        t = text_of(cell)
        state = tagged(t, tag)
        report(state is not None and not state["libcuda_mapped"] and not state["in_nvidia_smi"],
               f"{tag}: no CUDA in the kernel process", t)
    t = text_of(check)
    report(not has_error(check) and "NCCL" in t and "H200" in t,
           "%distributed_check reports on the H200", t)
    t = text_of(ddp)
    rank = tagged(t, "DDP_RANK")
    report(rank is not None and rank["backend"] == "nccl" and rank["current_device"] == 0 ==
           rank["local_rank"] and rank["all_reduce"] == 1.0 and not has_error(ddp),
           "one-rank NCCL DDP step and all_reduce on the GPU of LOCAL_RANK", t)
    if rank:
        print(f"INFO: DDP losses {rank['losses']}, GPU memory {rank['gpu_mem_bytes']} bytes, "
              f"{rank['device_name']}")
    t = text_of(result)
    report(not has_error(result) and "DDP_RESULT" in t and "nccl" in t,
           "the rank's result reaches the notebook", t)
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
