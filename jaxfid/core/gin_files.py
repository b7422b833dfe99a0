"""Parsing gin files and bindings, with one-line errors.

Files and ``include``s are found relative to the working directory, extra
search paths, then the jaxfid source tree (``gin/fid/tiny.gin`` works from
anywhere). Files are parsed first, then each binding alone, so
:func:`parse_gin` can name the wrong binding; :mod:`jaxfid.core.gin_checks`
validates the resulting :class:`ParsedGin`.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import logging
import os
import tokenize

import gin
from gin import config_parser

from jaxfid.core.errors import InputError

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Binding:
  """One ``NAME=VALUE`` binding (``--gin.NAME=VALUE`` on the command line).

  Attributes:
    text: the binding as given.
    scope: its gin scope ('' for none).
    selector: the macro's name, or the configurable's selector.
    param: the configurable's parameter; '' for a macro.
  """
  text: str
  scope: str
  selector: str
  param: str

  @property
  def is_macro(self) -> bool:
    return not self.param

  @property
  def name(self) -> str:
    """``MACRO`` or ``selector.param`` (with its scope, if any)."""
    name = f"{self.selector}.{self.param}" if self.param else self.selector
    return f"{self.scope}/{name}" if self.scope else name

  @property
  def flag(self) -> str:
    """The binding as a command-line flag, for messages."""
    return f"--gin.{' '.join(self.text.split())}"


@dataclasses.dataclass(frozen=True)
class ParsedGin:
  """What :func:`parse_gin` parsed (gin's global config holds the values).

  Attributes:
    files: the gin files, resolved.
    bindings: the bindings, in order.
    file_macros: the macros the files define or reference.
  """
  files: tuple[str, ...]
  bindings: tuple[Binding, ...]
  file_macros: frozenset[str]


def _resolve(path: str, search: list[str]) -> str:
  if os.path.exists(path):
    return path
  for root in search:
    candidate = os.path.join(root, path)
    if os.path.exists(candidate):
      return candidate
  raise InputError(path, "no such gin file")


def _one_line(error: Exception) -> str:
  """gin's message without the location it appends (the caller names it)."""
  text = " ".join(str(error).split())
  return text.split(" In bindings string line ")[0].split(" In file ")[0
                                                          ].rstrip(".")


class _KeyOnly(config_parser.ParserDelegate):
  """Parses a binding's key without resolving its value's references."""

  def configurable_reference(self, scoped_configurable_name, evaluate):
    return None

  def macro(self, macro_name):
    return None


def _binding_key(text: str) -> Binding | None:
  """``text``'s scope, selector and parameter; None when ``text`` is not one
  binding (gin text a library caller passes: parsed, not recorded)."""
  try:
    statements = list(config_parser.ConfigParser(text, _KeyOnly()))
  # gin's tokenizer raises TokenError (not a SyntaxError) on an unclosed
  # bracket
  except (SyntaxError, ValueError, tokenize.TokenError) as e:
    raise InputError(f"--gin.{' '.join(text.split())}",
                     _unquoted(text) or f"gin: {_one_line(e)}") from None
  if len(statements) != 1 or not isinstance(
      statements[0], config_parser.BindingStatement):
    return None
  scope, selector, param, _, _ = statements[0]
  return Binding(text, scope, selector, param)


def _unquoted(text: str) -> str | None:
  """What to do about ``NAME=VALUE`` whose VALUE is bare text gin cannot
  read (``MODEL_DIR=runs/x``: a string without its quotes), else None."""
  name, sep, value = text.partition("=")
  name, value = name.strip(), value.strip()
  if not sep or not name or not value or value[0] in "'\"@%[({":
    return None
  try:
    ast.literal_eval(value)
    return None  # a literal: the problem is elsewhere
  except (ValueError, SyntaxError):
    pass
  if any(c in value for c in "'\"$`\\!"):
    return (f"{value} is not a gin value; a string needs gin's quotes "
            "inside the shell's")
  return (f"{value} is not a gin value; a string needs gin's quotes inside "
          f"the shell's: --gin.{name}=\"'{value}'\"")


def macro_names() -> set[str]:
  """Every macro the parsed config defines or references."""
  names = set()
  # gin has no public listing of its bindings: its global config is a dict
  # {(scope, selector): {param: value}}, a macro NAME being (NAME, 'gin.macro').
  for (scope, selector), params in gin.config._CONFIG.items():  # pylint: disable=protected-access
    if selector == "gin.macro":
      names.add(scope)
    for ref in gin.config.iterate_references(params):
      if ref.configurable.wrapped is gin.config.macro:
        names.add("/".join(ref.scopes))
  return names


def _parameter_hint(binding: Binding) -> str:
  """' (did you mean x?)' for a misspelt parameter of a known configurable."""
  found = gin.config._REGISTRY.get_match(binding.selector)  # pylint: disable=protected-access
  if found is None:
    return ""
  try:
    names = list(inspect.signature(found.wrapped).parameters)
  except (TypeError, ValueError):
    return ""
  close = difflib.get_close_matches(binding.param, names, n=1)
  return f" (did you mean {close[0]}?)" if close else ""


def parse_gin(gin_files: list[str], bindings: list[str],
              search_paths: list[str] = ()) -> ParsedGin:
  """Parses files then bindings; a gin error is a one-line InputError
  naming the last file (gin's message has the line) or the binding."""
  search = [os.getcwd(), *search_paths, SOURCE_ROOT]
  for root in search:
    gin.add_config_file_search_path(root)
  files = [_resolve(f, search) for f in gin_files]
  if not files:
    raise InputError("--gin_file", "at least one gin file is required")
  gin.clear_config()
  root = logging.getLogger()
  level = root.level
  root.setLevel(logging.CRITICAL)  # gin logs every search path it tries
  try:
    try:
      gin.parse_config_files_and_bindings(files, None, finalize_config=False)
    except (ValueError, SyntaxError, tokenize.TokenError, KeyError, ImportError,
            IOError) as e:
      raise InputError(files[-1], f"gin: {' '.join(str(e).split())}") from None
    file_macros = frozenset(macro_names())
    parsed = []
    for text in bindings:
      binding = _binding_key(text)
      try:
        gin.parse_config(text)
      except (ValueError, SyntaxError, tokenize.TokenError, KeyError, ImportError,
            IOError) as e:
        hint = "" if not binding or binding.is_macro else _parameter_hint(
            binding)
        flag = binding.flag if binding else f"--gin.{' '.join(text.split())}"
        raise InputError(flag, _unquoted(text)
                         or f"gin: {_one_line(e)}{hint}") from None
      if binding:
        parsed.append(binding)
  finally:
    root.setLevel(level)
  return ParsedGin(tuple(files), tuple(parsed), file_macros)
