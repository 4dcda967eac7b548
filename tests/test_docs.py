"""The documentation stays complete: every config field documented, every config class in the
generated reference, and the README's relative links pointing at files that exist.

The site itself is checked by ``mkdocs build --strict`` (``make test``); these checks need no
mkdocs and read the sources as mkdocstrings does: a field's docstring is the string statement
right after its annotated assignment.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import podsrl.config

ROOT = Path(__file__).resolve().parent.parent
CONFIG_SOURCE = Path(podsrl.config.__file__)


def config_classes() -> dict[str, ast.ClassDef]:
    """The dataclasses defined in podsrl/config.py, by name, as parsed from the source."""
    tree = ast.parse(CONFIG_SOURCE.read_text())
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.ClassDef) and dataclasses.is_dataclass(getattr(podsrl.config, node.name, None))
    }


def documented_fields(node: ast.ClassDef) -> dict[str, str | None]:
    """Each annotated field of a class body and the docstring that follows it (None: none)."""
    fields = {}
    body = node.body
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            nxt = body[i + 1] if i + 1 < len(body) else None
            doc = None
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                doc = nxt.value.value.strip() or None
            fields[stmt.target.id] = doc
    return fields


def test_the_config_module_has_the_four_sections():
    assert {"Config", "ModelConfig", "TaskConfig", "RolloutConfig"} <= set(config_classes())


def test_every_config_field_has_a_docstring():
    missing = []
    for name, node in config_classes().items():
        parsed = documented_fields(node)
        runtime = {f.name for f in dataclasses.fields(getattr(podsrl.config, name))}
        assert set(parsed) == runtime, f"{name}: fields parsed from the source differ from the dataclass's"
        missing += [f"{name}.{field}" for field, doc in parsed.items() if doc is None]
        if ast.get_docstring(node) is None:
            missing.append(f"{name} (the class)")
    assert not missing, "config fields without a docstring (the generated reference shows them blank): " + ", ".join(missing)


def test_a_field_without_a_docstring_is_found():
    node = ast.parse('class C:\n    a: int = 1\n    """Documented."""\n    b: int = 2\n    c: str = "x"\n    "Also."\n').body[0]
    assert documented_fields(node) == {"a": "Documented.", "b": None, "c": "Also."}


def test_every_config_class_is_in_the_generated_reference():
    page = (ROOT / "docs" / "configuration.md").read_text()
    rendered = set(re.findall(r"^::: podsrl\.config\.(\w+)", page, flags=re.M))
    assert set(config_classes()) <= rendered, f"not rendered in docs/configuration.md: {set(config_classes()) - rendered}"


def test_readme_is_short_and_its_relative_links_exist():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 150
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    relative = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert relative, "the README links into the docs"
    broken = [t for t in relative if t and not (ROOT / t).exists()]
    assert not broken, f"README links to missing files: {broken}"


def test_griffe_sees_a_docstring_on_every_config_field():
    """The same check through griffe, which mkdocstrings renders the reference with (installed
    with the ``docs`` extra)."""
    griffe = pytest.importorskip("griffe")
    module = griffe.load("podsrl.config", search_paths=[str(CONFIG_SOURCE.parent.parent)])
    missing = []
    for name in config_classes():
        cls = module[name]
        fields = {f.name for f in dataclasses.fields(getattr(podsrl.config, name))}
        attributes = {a: cls.members[a] for a in fields if a in cls.members}
        assert set(attributes) == fields, f"griffe misses fields of {name}: {fields - set(attributes)}"
        missing += [f"{name}.{a}" for a, member in attributes.items() if not (member.docstring and member.docstring.value.strip())]
    assert not missing, "config fields without a docstring as griffe sees them: " + ", ".join(missing)
