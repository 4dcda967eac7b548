"""mkdocs hook: the sources' docstrings cite names with Sphinx roles (``:func:`select```), which
Markdown renders as ``:func:`` followed by the code; keep the code, drop the role."""

import re

ROLE = re.compile(r":(?:func|class|data|mod|meth|attr|obj):(<code>)")


def on_page_content(html, **kwargs):
    return ROLE.sub(r"\1", html)
