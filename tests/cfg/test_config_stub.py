"""sf/cfg/config.pyi, what type checkers read for Config, is what `python -m sf.cfg.stub` writes from the parameter
table today, and declares the runtime Config's fields, in its order, with config.py's types."""
import ast
import dataclasses
import typing

from sf.cfg import Config
from sf.cfg.stub import STUB_PATH, main, stub_text


def _stub_fields() -> list[tuple[str, str]]:
    tree = ast.parse(STUB_PATH.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    return [(n.target.id, ast.unparse(n.annotation)) for n in cls.body if isinstance(n, ast.AnnAssign)]


def test_the_checked_in_stub_is_current():
    assert STUB_PATH.read_text() == stub_text(), "sf/cfg/config.pyi is stale: run python -m sf.cfg.stub"


def test_the_stub_declares_every_field_of_config_with_its_type():
    fields = dataclasses.fields(Config)
    stub = _stub_fields()
    assert [name for name, _ in stub] == [f.name for f in fields]
    for (name, ann), f in zip(stub, fields):
        runtime = f.type if not isinstance(f.type, str) else eval(f.type, vars(typing))
        origin = typing.get_origin(runtime)
        if runtime is list or (origin is typing.Union and list in typing.get_args(runtime)):
            assert ann.startswith(("list[", "Optional[list[")), (name, ann, runtime)  # lists name their entries
        elif runtime is typing.Any:
            assert ann == "Any", (name, ann)
        else:  # (frozenset[str] for frozenset: the stub may say more than make_dataclass's plain types)
            declared = eval(ann, vars(typing))
            assert declared == runtime or typing.get_origin(declared) is runtime, (name, ann, runtime)


def test_the_generator_refuses_arguments(capsys):
    assert main(["extra"]) == 2
    assert "takes no arguments" in capsys.readouterr().err
