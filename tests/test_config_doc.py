"""docs/configuration.md is what the generator writes from the gin files and
the config dataclasses now: it cannot drift from the code."""
from __future__ import annotations

import os

from jaxfid.commands import config_doc
from jaxfid.core.gin_files import SOURCE_ROOT


def test_configuration_reference_is_current():
  with open(os.path.join(SOURCE_ROOT, "docs", "configuration.md"),
            encoding="utf-8") as f:
    committed = f.read()
  assert committed == config_doc.reference(), (
      "regenerate: python -m jaxfid.commands.config_doc > "
      "docs/configuration.md")


def test_every_macro_of_a_config_field_is_described():
  text = config_doc.reference()
  for macro in ("MODEL_DIR", "TRAIN_STEPS", "MESH", "ON_NAN", "OPTIMIZER",
                "N_CONTEXT", "TARGET_MAXLENGTH", "DROPOUT_RATE", "POOLING",
                "TEMPERATURE"):
    rows = [r for r in text.splitlines() if r.startswith(f"| `{macro}` |")]
    assert rows, macro
    assert all(r.count("|") >= 5 and r.split("|")[3].strip() for r in rows)
  assert "| `ON_NAN` | `'stop'` | one of 'stop', 'skip' |" in text
