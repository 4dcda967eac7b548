"""mkdocs hooks.

- The sources' docstrings cite names with Sphinx roles (``:func:`select```), which Markdown
  renders as ``:func:`` followed by the code; keep the code, drop the role.
- The configuration reference: each ``::: podsrl.config.<Class>`` block of configuration.md
  becomes one table of that class's keys (key, type, default, meaning), read from the dataclass
  and its field docstrings (griffe), so a new field appears by itself.
"""

import dataclasses
import html
import re

ROLE = re.compile(r":(?:func|class|data|mod|meth|attr|obj):(<code>)")
CONFIG_BLOCK = re.compile(r"^::: podsrl\.config\.(\w+)\n(?:[ \t]+.*\n)*", re.M)
PREFIX = {"Config": "", "ModelConfig": "model.", "TaskConfig": "task.", "RolloutConfig": "rollout."}


def _code(text: str, breaks: bool = False) -> str:
    """Inline code as HTML: a table cell's ``|`` would end the cell, and Markdown's escape ``\\|``
    shows literally inside backticks. ``breaks`` lets a key break after its dots and underscores
    (and nowhere else: the stylesheet keeps code in tables from breaking mid-word)."""
    code = html.escape(text, quote=False).replace("|", "&#124;")
    if breaks:
        code = re.sub(r"([._])", r"\1<wbr>", code)
    return f"<code>{code}</code>"


def _cell(text: str) -> str:
    text = re.sub(r"\s+", " ", text or "").strip()
    text = re.sub(r":(?:func|class|data|mod|meth|attr|obj):`", "`", text).replace("``", "`")
    parts = re.split(r"`([^`]*)`", text)  # prose, code, prose, code, ...
    return "".join(_code(p) if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def _default(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        if dataclasses.is_dataclass(value):
            return "see below"
    else:
        value = field.default
    return _code(repr(value))


def config_table(name: str) -> str:
    import griffe

    import podsrl.config

    module = griffe.load("podsrl.config", search_paths=["src"])
    cls, documented = getattr(podsrl.config, name), module[name]
    rows = [f'<a id="podsrl.config.{name}"></a>', "", "| key | type | default | meaning |", "|---|---|---|---|"]
    for field in dataclasses.fields(cls):
        attribute = documented.members.get(field.name)
        docstring = attribute.docstring.value if attribute is not None and attribute.docstring else ""
        annotation = _code(re.sub(r"\s+", " ", str(attribute.annotation))) if attribute is not None else ""
        key = _code(f"{PREFIX.get(name, '')}{field.name}", breaks=True)
        rows.append(f"| {key} | {annotation} | {_default(field)} | {_cell(docstring)} |")
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown, page, **kwargs):
    if page.file.src_uri != "configuration.md":
        return markdown
    return CONFIG_BLOCK.sub(lambda m: config_table(m.group(1)), markdown)


def on_page_content(html, **kwargs):
    return ROLE.sub(r"\1", html)
