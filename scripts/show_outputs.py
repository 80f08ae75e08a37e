"""Print what an executed notebook's cells printed, cell by cell."""
import sys

import nbformat

nb = nbformat.read(sys.argv[1], as_version=4)
for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
    print(f"--- cell {i + 1} ---")
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            sys.stdout.write(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            print(out.data.get("text/plain", ""))
        elif out.output_type == "error":
            print(f"{out.ename}: {out.evalue}")
