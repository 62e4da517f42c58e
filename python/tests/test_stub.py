"""The type stub shipped with the package (sluice/_sluice.pyi) names what the
extension has: every public name and every public member of its classes."""
import ast
import os

import sluice
from sluice import _sluice

STUB = os.path.join(os.path.dirname(sluice.__file__), "_sluice.pyi")


def stub_names():
    tree = ast.parse(open(STUB).read())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            members[node.name] = {n.name if isinstance(n, ast.FunctionDef) else n.target.id
                                  for n in node.body if isinstance(n, (ast.FunctionDef, ast.AnnAssign))}
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
    return {n for n in top if not n.startswith("_")}, members


def test_the_stub_and_py_typed_ship_with_the_package():
    assert os.path.isfile(STUB)
    assert os.path.isfile(os.path.join(os.path.dirname(sluice.__file__), "py.typed"))


def test_the_stub_names_every_public_name_of_the_extension_and_no_other():
    top, members = stub_names()
    have = {n for n in dir(_sluice) if not n.startswith("_")}
    optional = {"load_into_cuda"}  # only where the cuda component is built
    assert have - top == set(), "in the module, not in the stub"
    assert top - have - optional == set(), "in the stub, not in the module"
    for cls, names in members.items():
        t = getattr(_sluice, cls)
        if issubclass(t, BaseException):
            continue  # attributes set per instance when raised
        public = {n for n in vars(t) if not n.startswith("_")}
        assert public == {n for n in names if not n.startswith("_")}, cls
