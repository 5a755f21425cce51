"""Measure how well the source tree keeps its house rules (issue 33): run from the repository root.

    python scripts/house_metrics.py [--verbose]

Prints one line per figure, each the count a target is set on:

- ``option-functions``: functions (methods and nested functions included)
  outside the public signatures (the functions and public methods that the
  public modules' ``__all__`` name), ``Variant`` and the entry's builder that
  name four or more of the options. A function names an option when the
  option's name appears in it as an identifier (a variable, an attribute, a
  parameter, a keyword argument) or as a string constant.
- ``sinks-files``: the source files whose text mentions ``sinks``.
- ``mha-files`` / ``mha-lines``: the files that define or help
  ``MultiHeadAttention``, the torch conversion apart (``_torch_convert``,
  since torch is optional).
- ``long-functions``: functions over 60 code lines (lines holding code, not
  blank, comment or docstring lines).
- ``stale-references``: dotted ``portattn._...`` names in docstrings,
  comments and ``ARCHITECTURE.md`` that do not resolve to a module or an
  attribute of one.
- ``duplicate-pairs``: the count ``duplicates --repo src`` reports, where
  that tool is installed.

``--verbose`` lists what each count is made of.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = SRC / "portattn"
OPTIONS = frozenset(
    {
        "mask",
        "bias",
        "causal",
        "window",
        "key_lengths",
        "query_lengths",
        "softcap",
        "score_mod",
        "block_mask",
        "sinks",
    }
)
# Where the option set may be spelled out besides the public signatures: Variant, the builder.
OWNERS = {("_core/_variant.py", "Variant"), ("_core/_variant.py", "build_variant")}
# The modules whose ``__all__`` is the public API; their functions and the
# public methods of their classes are the public signatures.
PUBLIC_MODULES = (
    "portattn",
    "portattn.mods",
    "portattn.chapter",
    "portattn.testing",
    "portattn.integrations.transformers",
    "portattn.parallel",
)
MHA_MODULES = ("_multihead", "_heads", "_mha_inputs", "_mha_weights", "_mha_build")
LONG = 60
STALE = re.compile(r"\bportattn(?:\.[A-Za-z_][A-Za-z0-9_]*)*\._[A-Za-z0-9_]+(?:\.[A-Za-z_]\w*)*")


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def public_signatures() -> set[tuple[str, str]]:
    """``(file, qualified name)`` of every public function and public method."""
    import inspect

    sys.path.insert(0, str(SRC))
    out = set()
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", []):
            obj = inspect.unwrap(getattr(module, attr))
            try:
                where = Path(inspect.getsourcefile(obj) or "")
            except TypeError:
                continue  # a constant or a module
            if PACKAGE not in where.parents:
                continue
            if inspect.isfunction(obj):
                out.add((rel(where), obj.__qualname__))
            elif inspect.isclass(obj):
                for member, fn in vars(obj).items():
                    public = not member.startswith("_") or member in {"__call__", "__init__"}
                    fn = getattr(fn, "__func__", fn)  # classmethod, staticmethod
                    if public and inspect.isfunction(fn):
                        out.add((rel(where), fn.__qualname__))
    return out


def _names(node: ast.AST) -> set[str]:
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.arg | ast.keyword) and sub.arg is not None:
            found.add(sub.arg)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found.add(sub.value)
    return found & OPTIONS


def _functions(tree: ast.AST) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """Every function with its qualified name and the top-level name it sits under."""
    out = []

    def visit(node: ast.AST, prefix: str, top: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                owner = top or child.name
                if not isinstance(child, ast.ClassDef):
                    out.append((name, child, owner))
                visit(child, name + ".", owner)
            else:
                visit(child, prefix, top)

    visit(tree, "", "")
    return out


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return body[1:]
    return body


def option_functions() -> list[str]:
    hits = []
    public = public_signatures()
    for path in sources():
        tree = ast.parse(path.read_text())
        for name, fn, top in _functions(tree):
            where = rel(path)
            if (where, top) in OWNERS or (where, name) in OWNERS or (where, name) in public:
                continue
            body = ast.Module(body=_strip_docstring(fn.body), type_ignores=[])
            named = _names(body) | _names(fn.args)
            if len(named) >= 4:
                hits.append(
                    f"{rel(path)}:{fn.lineno} {name} ({len(named)}: {', '.join(sorted(named))})"
                )
    return hits


def sinks_files() -> list[str]:
    return [rel(p) for p in sources() if "sinks" in p.read_text()]


def mha_files() -> list[tuple[str, int]]:
    files = [PACKAGE / "_layers" / f"{m}.py" for m in MHA_MODULES]
    return [(rel(p), len(p.read_text().splitlines())) for p in files if p.exists()]


def _code_lines(path: Path) -> dict[int, bool]:
    """Lines that hold a token other than a comment, a newline or a docstring."""
    text = path.read_text()
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module):
            body = node.body
            if body and body is not _strip_docstring(body):
                doc = body[0]
                docstrings.update(range(doc.lineno, (doc.end_lineno or doc.lineno) + 1))
    code: dict[int, bool] = {}
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in skip or tok.type == tokenize.ENDMARKER:
            continue
        for line in range(tok.start[0], tok.end[0] + 1):
            if line not in docstrings:
                code[line] = True
    return code


def long_functions() -> list[str]:
    hits = []
    for path in sources():
        code = _code_lines(path)
        for name, fn, _ in _functions(ast.parse(path.read_text())):
            start = fn.decorator_list[0].lineno if fn.decorator_list else fn.lineno
            n = sum(1 for line in range(start, (fn.end_lineno or start) + 1) if line in code)
            if n > LONG:
                hits.append(f"{rel(path)}:{fn.lineno} {name} ({n} code lines)")
    return hits


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute (of an attribute...) of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _prose(path: Path) -> list[tuple[int, str]]:
    """Docstrings and comments of a Python file, with their first line numbers."""
    text = path.read_text()
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0].lineno
                out.extend((first + n, line) for n, line in enumerate(doc.splitlines()))
    return out


def dotted_places() -> list[tuple[str, str]]:
    """``(where, dotted name)`` of every ``portattn._...`` name in the prose and ARCHITECTURE.md.

    Shared with ``tests/test_house.py``, which asserts that each resolves.
    """
    places: list[tuple[str, str]] = []
    for path in sources():
        for line, text in _prose(path):
            where = f"src/portattn/{rel(path)}:{line}"
            places.extend((where, m.group(0)) for m in STALE.finditer(text))
    arch = ROOT / "ARCHITECTURE.md"
    if arch.exists():
        for line, text in enumerate(arch.read_text().splitlines(), start=1):
            places.extend((f"ARCHITECTURE.md:{line}", m.group(0)) for m in STALE.finditer(text))
    return places


def stale_references() -> list[str]:
    sys.path.insert(0, str(SRC))
    return [f"{where} {dotted}" for where, dotted in dotted_places() if not resolves(dotted)]


def duplicate_pairs() -> str:
    tool = shutil.which("duplicates")
    if tool is None:
        return "n/a (the duplicates tool is not installed)"
    run = subprocess.run(
        [tool, "--repo", str(SRC)], capture_output=True, text=True, check=False, cwd=ROOT
    )
    first = run.stdout.splitlines()[0] if run.stdout else ""
    match = re.match(r"(\d+) pairs", first)
    return match.group(1) if match else ("0" if first.startswith("no duplicates") else first)


def main() -> None:
    verbose = "--verbose" in sys.argv[1:]
    figures: list[tuple[str, str, list[str]]] = []
    fns = option_functions()
    figures.append(("option-functions", str(len(fns)), fns))
    sinks = sinks_files()
    figures.append(("sinks-files", str(len(sinks)), sinks))
    mha = mha_files()
    figures.append(("mha-files", str(len(mha)), [f"{f} ({n})" for f, n in mha]))
    figures.append(("mha-lines", str(sum(n for _, n in mha)), []))
    convert = PACKAGE / "_layers" / "_torch_convert.py"
    if convert.exists():
        figures.append(("mha-torch-convert-lines", str(len(convert.read_text().splitlines())), []))
    long = long_functions()
    figures.append(("long-functions", str(len(long)), long))
    stale = stale_references()
    figures.append(("stale-references", str(len(stale)), stale))
    figures.append(("duplicate-pairs", duplicate_pairs(), []))
    for name, value, detail in figures:
        print(f"{name}: {value}")
        if verbose:
            for row in detail:
                print(f"    {row}")


if __name__ == "__main__":
    main()
