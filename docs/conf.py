"""Sphinx configuration of the redreentrant documentation (Markdown pages via MyST).

Build, warnings as errors (as CI does)::

    python -m sphinx -W --keep-going -b html docs /tmp/site
"""

from __future__ import annotations

import os
import re
import sys

from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment

# Document the source tree next to this directory, not whatever version is installed.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

import redreentrant

project = "redreentrant"
release = redreentrant.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
nitpicky = False

# MyST: anchors for headings down to level 3, so pages can link to sections.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# autodoc: members in source order, signatures with their type hints.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
# Optional dependencies of documented modules: redreentrant.otel (the otel extra) and
# the pytest plugin. Mocked, so that the docs extra alone builds the whole reference.
autodoc_mock_imports = ["opentelemetry", "pytest"]

html_theme = "alabaster"
html_title = f"redreentrant {release}"
html_theme_options = {
    "description": "Reentrant distributed locks on a Redlock quorum of Redis masters",
    "fixed_sidebar": True,
}
html_static_path: list[str] = []

# Every name a public module exports must be documented: the API reference lists the
# modules with automodule, and this check turns a name that autodoc could not place
# (data without a doc comment, say) into a warning, which fails the strict build.
PUBLIC_MODULES = (
    "redreentrant",
    "redreentrant.asyncio",
    "redreentrant.errors",
    "redreentrant.otel",
    "redreentrant.celery",
    "redreentrant.testing",
    "redreentrant.testing.faults",
    "redreentrant.testing.plugin",
    "redreentrant.testing.proxy",
    "redreentrant.compat.redis_py",
    "redreentrant.compat.pottery",
    "redreentrant.compat.redis_lock",
    "redreentrant.compat.aioredlock",
    "redreentrant.compat.redlock",
)


def _resolve(dotted: str) -> object:
    """The object a documented dotted name stands for (a sentinel if none)."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:]:
                obj = getattr(obj, part)
        except AttributeError:
            return _resolve
        return obj
    return _resolve


def _check_public_names(app: Sphinx, env: BuildEnvironment) -> None:
    import importlib

    from sphinx.ext.autodoc.mock import mock  # type: ignore[attr-defined]
    from sphinx.util import logging

    documented = env.get_domain("py").objects  # type: ignore[attr-defined]
    with mock(autodoc_mock_imports):
        ids = {id(_resolve(name)) for name in documented}
        for modname in PUBLIC_MODULES:
            module = importlib.import_module(modname)
            for name in module.__all__:
                obj = getattr(module, name)
                if f"{modname}.{name}" not in documented and id(obj) not in ids:
                    logging.getLogger(__name__).warning(
                        "%s.%s is public but not in the API reference", modname, name
                    )


# A name exported by several modules is documented once: in the first of these modules
# that exports it. The API reference says "|documented under A or B|" where a module's
# :exclude-members: are the names it shares with A or B; they are filled in here, so a
# new shared name needs no entry by hand.
_PLACEHOLDER = re.compile(r"\|documented under ([\w.]+(?: or [\w.]+)*)\|")


def _shared(match: re.Match[str], module: str) -> str:
    import importlib

    mine = importlib.import_module(module)
    others = [importlib.import_module(m) for m in match[1].split(" or ")]
    names = [
        name
        for name in mine.__all__
        if any(getattr(other, name, None) is getattr(mine, name) for other in others)
    ]
    return ", ".join(names) or "__none__"


def _fill_excludes(app: Sphinx, docname: str, source: list[str]) -> None:
    if docname != "api":
        return
    out = []
    module = ""
    for line in source[0].splitlines(keepends=True):
        found = re.match(r"\.\. automodule:: ([\w.]+)", line.strip())
        if found:
            module = found[1]
        found = _PLACEHOLDER.search(line)
        if found:
            line = line.replace(found[0], _shared(found, module))
        out.append(line)
    source[0] = "".join(out)


def setup(app: Sphinx) -> None:
    app.connect("source-read", _fill_excludes)
    app.connect("env-check-consistency", _check_public_names)
