"""Reading a module's imports statically, for the tests that pin which package may import which."""
from __future__ import annotations

import ast
from pathlib import Path


def absolute_imports(path: Path, package: str) -> set[str]:
    """Every module ``path`` (in ``package``) imports, relative imports resolved, lazy ones included."""
    parts = package.split(".")
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(parts[:len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            out |= {module} | {f"{module}.{a.name}" for a in node.names}
    return out
