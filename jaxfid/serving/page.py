"""The files of ``jaxfid serve``'s page (``GET /``): plain HTML, CSS and
JavaScript shipped as package data in ``static/`` (no build step, nothing
fetched from elsewhere: the page works offline)."""
from __future__ import annotations

import os

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "static")
# name -> content type; nothing else is served from STATIC_DIR
FILES = {"index.html": "text/html; charset=utf-8",
         "page.css": "text/css; charset=utf-8",
         "page.js": "text/javascript; charset=utf-8"}


def read(name: str) -> tuple[bytes, str]:
  """The bytes and content type of page file ``name`` (one of
  :data:`FILES`; KeyError for any other name)."""
  content_type = FILES[name]
  with open(os.path.join(STATIC_DIR, name), "rb") as f:
    return f.read(), content_type
