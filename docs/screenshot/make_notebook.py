"""Write the notebook the README's screenshot shows: an ordinary cell that
defines a helper, and a %%distributed cell of 4 ranks that uses it, prints per
rank and returns a value. Usage: make_notebook.py OUT.ipynb"""
import json
import sys

CELLS = [
    "def shard(rank, world):\n"
    "    return list(range(rank, 16, world))",
    "%%distributed num_processes=4\n"
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group(\"gloo\")\n"
    "rank, world = dist.get_rank(), dist.get_world_size()\n"
    "total = torch.tensor([float(sum(shard(rank, world)))])\n"
    "print(f\"my shard: {shard(rank, world)}\")\n"
    "dist.all_reduce(total)\n"
    "print(f\"sum over {world} ranks: {total.item():.0f}\")\n"
    "rank * 10",
]


def cell(source):
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": source.splitlines(keepends=True)}


notebook = {
    "cells": [cell(c) for c in CELLS],
    "metadata": {"kernelspec": {"name": "distkernel", "display_name": "distkernel",
                                "language": "python"},
                 "language_info": {"name": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
}
with open(sys.argv[1], "w") as f:
    json.dump(notebook, f, indent=1)
