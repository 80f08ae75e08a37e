#!/usr/bin/python3
"""The code's shape, checked: what a newcomer reads stays readable.

    scripts/check_structure.py        prints every offence; exit status 1 if any

- no C function over 100 lines (a function's body: from its opening brace in
  the first column to its closing one), and no Python function over 100 lines;
- no source file over 800 lines outside tests/ (C, its headers, python/);
- no import cycle between the modules of python/distkernel, counting imports
  anywhere in a module (a function's lazy import is a dependency too).

tests/e2e/test_sources.py runs it, so the test command keeps it true.
"""
import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
C_FOLDERS = ("app", "kernel", "distributed", "runtime", "magics", "protocol")
PACKAGE = ROOT / "python" / "distkernel"
MAX_FUNCTION = 100
MAX_FILE = 800


def c_sources():
    for folder in C_FOLDERS:
        yield from sorted((ROOT / folder).rglob("*.[ch]"))


def python_sources():
    yield from sorted((ROOT / "python").rglob("*.py"))


def long_c_functions(path):
    """(line, length, signature) of each function of PATH over MAX_FUNCTION lines."""
    lines = path.read_text(errors="replace").splitlines()
    out = []
    start = None
    for i, line in enumerate(lines):
        if line.startswith("{") and i > 0 and start is None:
            start = i
        elif line.startswith("}") and start is not None:
            length = i - start + 1
            if length > MAX_FUNCTION and "(" in "".join(lines[max(0, start - 3):start]):
                out.append((start, length, lines[start - 1].strip()))
            start = None
    return out


def long_python_functions(path):
    tree = ast.parse(path.read_text(), str(path))
    return [(node.lineno, node.end_lineno - node.lineno + 1, node.name)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION]


def module_name(path):
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path, modules):
    """The package's modules that PATH imports, anywhere in it."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
        for target in targets:
            # the deepest module of the package that the name is, or is in
            parts = target.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if parts and ".".join(parts) != name:
                found.add(".".join(parts))
    return found


def import_cycles():
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imports_of(p, modules) for p in paths}
    # A package's __init__ importing its own modules is how a package is made,
    # not a cycle: the edges from a module to the package it is in go.
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    cycles, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def offences():
    out = []
    for path in c_sources():
        rel = path.relative_to(ROOT)
        n = len(path.read_text(errors="replace").splitlines())
        if n > MAX_FILE:
            out.append(f"{rel}: {n} lines (at most {MAX_FILE})")
        if path.suffix == ".c":
            for line, length, sig in long_c_functions(path):
                out.append(f"{rel}:{line}: a function of {length} lines (at most "
                           f"{MAX_FUNCTION}): {sig}")
    for path in python_sources():
        rel = path.relative_to(ROOT)
        n = len(path.read_text().splitlines())
        if n > MAX_FILE:
            out.append(f"{rel}: {n} lines (at most {MAX_FILE})")
        for line, length, name in long_python_functions(path):
            out.append(f"{rel}:{line}: {name}() is {length} lines (at most {MAX_FUNCTION})")
    for cycle in import_cycles():
        out.append("an import cycle: " + " -> ".join(cycle))
    return out


def main():
    found = offences()
    for line in found:
        print(line)
    if found:
        print(f"check_structure: {len(found)} offence(s)", file=sys.stderr)
        return 1
    print("check_structure: functions, files and imports are within bounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
