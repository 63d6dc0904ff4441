"""Sphinx configuration of the redreentrant documentation (Markdown pages via MyST).

Build, warnings as errors (as CI does)::

    python -m sphinx -W --keep-going -b html docs /tmp/site
"""

from __future__ import annotations

import os
import sys

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

html_theme = "alabaster"
html_title = f"redreentrant {release}"
html_theme_options = {
    "description": "Reentrant distributed locks on a Redlock quorum of Redis masters",
    "fixed_sidebar": True,
}
html_static_path: list[str] = []
