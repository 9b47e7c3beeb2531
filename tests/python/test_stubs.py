"""python/ulorl/_ulorl.pyi against the compiled module: every name the module defines has a stub and
every stub names something the module defines, and so for each class's members; every function
stub's parameters are the binding's (pybind11 signatures are read from the docstrings' first line)."""

import ast
import pathlib

import ulorl
from ulorl import _ulorl

STUBS = pathlib.Path(ulorl.__file__).with_name("_ulorl.pyi")


def _stub_names():
    tree = ast.parse(STUBS.read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return names


def _module_names():
    return {n for n in dir(_ulorl) if not (n.startswith("__") and n.endswith("__"))}


def test_every_module_name_has_a_stub_and_every_stub_a_name():
    stubs = set(_stub_names())
    module = _module_names()
    assert sorted(module - stubs) == [], "names of ulorl._ulorl without a stub in _ulorl.pyi"
    assert sorted(stubs - module) == [], "stubs in _ulorl.pyi of names ulorl._ulorl does not define"


def test_every_class_stub_names_the_class_members():
    for name, node in _stub_names().items():
        if not isinstance(node, ast.ClassDef) or name == "Error":
            continue
        stub = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
        stub |= {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        stub = {n for n in stub if not (n.startswith("__") and n.endswith("__"))}
        members = {n for n in dir(getattr(_ulorl, name)) if not n.startswith("_")}
        assert sorted(members - stub) == [], f"{name}: members without a stub"
        assert sorted(stub - members) == [], f"{name}: stubs of no member"


def _split(params):
    """Splits a signature's parameter list at the commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in params:
        depth += ch in "[(" and 1 or (ch in "])" and -1 or 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def test_function_stubs_name_the_bindings_parameters():
    for name, node in _stub_names().items():
        if not isinstance(node, ast.FunctionDef) or any(a.arg == "args" for a in [node.args.vararg] if a):
            continue
        doc = (getattr(_ulorl, name).__doc__ or "").lstrip()
        if not doc.startswith(name + "(") or "Overloaded function." in doc:
            continue  # overloaded bindings list several signatures
        stub = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        head = doc[len(name) + 1:doc.index(") ->")] if ") ->" in doc else ""
        bound = [p.split(":")[0].strip().lstrip("*") for p in _split(head) if p.strip() and p.strip() != "*"]
        assert stub == bound, f"{name}: stub parameters {stub}, binding {bound}"
