"""distkernel-check against torch.distributed, size by size, from their JSON reports.

    python3 tests/device/compare_bench.py CHECK.json TORCH.json

Prints a table and a closing line for the largest size both timed (1 GiB when
memory allows): its bus bandwidth in both, and, since with one GPU bus bandwidth
is 0 by nccl-tests' formula, its algorithm bandwidth too; each with the
difference in percent of torch's figure (the target is within 5%).
"""
import json
import sys


def pct(ours, theirs):
    return float("nan") if not theirs else (ours - theirs) / theirs * 100


def main():
    check = json.load(open(sys.argv[1]))
    torch = json.load(open(sys.argv[2]))
    if not check.get("sizes"):
        print(f"distkernel-check timed nothing: {check.get('reason') or check.get('summary')}")
        return 1
    ours = {s["bytes"]: s for s in check["sizes"]}
    theirs = {s["bytes"]: s for s in torch["sizes"]}
    common = sorted(set(ours) & set(theirs))
    print(f"distkernel-check (NCCL {check.get('nccl_version')}, {check.get('nranks')} GPU, "
          f"in place {check.get('in_place')}) against torch {torch.get('torch_version')} "
          f"(NCCL {torch.get('nccl_version')}, world {torch.get('world')}, in place)")
    print(f"{'bytes':>12} {'ours us':>10} {'torch us':>10} {'ours algbw':>11} {'torch algbw':>12} "
          f"{'diff %':>8} {'ours busbw':>11} {'torch busbw':>12}")
    for b in common:
        o, t = ours[b], theirs[b]
        print(f"{b:>12} {o['time_us']:>10.2f} {t['time_us']:>10.2f} {o['algbw_gbs']:>11.2f} "
              f"{t['algbw_gbs']:>12.2f} {pct(o['algbw_gbs'], t['algbw_gbs']):>8.1f} "
              f"{o['busbw_gbs']:>11.2f} {t['busbw_gbs']:>12.2f}")
    if not common:
        print("no size timed by both")
        return 1
    b = common[-1]
    o, t = ours[b], theirs[b]
    within = abs(pct(o["algbw_gbs"], t["algbw_gbs"])) <= 5
    print(f"AT {b} BYTES: busbw ours {o['busbw_gbs']:.2f} torch {t['busbw_gbs']:.2f} GB/s; "
          f"algbw ours {o['algbw_gbs']:.2f} torch {t['algbw_gbs']:.2f} GB/s "
          f"({pct(o['algbw_gbs'], t['algbw_gbs']):+.1f}%, {'within' if within else 'NOT within'} 5%); "
          f"time ours {o['time_us']:.2f} us torch {t['time_us']:.2f} us")
    print(f"WHOLE RUN: distkernel-check {check.get('wall_seconds', float('nan')):.2f} s "
          f"(its own clock), torch script {torch.get('wall_seconds', float('nan')):.2f} s "
          f"(import and init included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
