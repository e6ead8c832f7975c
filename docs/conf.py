"""Sphinx configuration of purax's documentation (built by ``docs/build.py``, ``make docs``).

Sphinx + MyST (Markdown pages) + autodoc/napoleon (Google-style docstrings),
in the theme of jax, flax and optax (sphinx-book-theme). Every warning is
an error (``build.py`` runs Sphinx with ``-W``); ``nitpicky`` makes an
unresolved cross-reference one.
"""

import importlib
import inspect
import os
import re
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), '..')))

project = 'purax'
author = 'the purax developers'
copyright = '2025, the purax developers'   # noqa: A001 (Sphinx's name)

extensions = [
    'myst_parser',
    'sphinx.ext.autodoc',
    'sphinx.ext.napoleon',
]

source_suffix = {'.rst': 'restructuredtext', '.md': 'markdown'}
exclude_patterns = ['_build', 'README.md', 'build.py', '**/.ipynb_checkpoints']
root_doc = 'index'

# MyST: ```python fences are code; {py:class}`...` roles link into the API.
myst_enable_extensions = ['colon_fence', 'deflist']
myst_heading_anchors = 3

# autodoc + napoleon: Google docstrings (Args/Returns/Raises/Example), members
# in source order, the signature's annotations as written.
autodoc_member_order = 'bysource'
autodoc_default_options = {'members': True, 'ignore-module-all': True}  # __all__ lists the public names (tests/test_public_api.py); each page documents its own objects
autodoc_typehints = 'signature'
autodoc_typehints_format = 'short'
autodoc_preserve_defaults = True
autoclass_content = 'both'
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True          # Attributes: a field list, not a second object per field
napoleon_use_rtype = False
python_use_unqualified_type_names = True

# A reference that resolves to nothing is a warning, so an error.
nitpicky = True
# The libraries purax builds on are documented on their own sites (no
# intersphinx: nothing is downloaded while building).
_EXTERNAL = (r'(jax|jaxlib|flax|nnx|optax|chex|orbax|grain|numpy|np|jnp|equinox|eqx|hypothesis|'
             r'tyro|tqdm|tensorboardX|matplotlib|wandb|onnx|onnxruntime|tensorflow|typing|'
             r'typing_extensions|collections|concurrent|contextlib|pathlib|os|io|types|enum|'
             r'dataclasses|abc|threading|signal|logging|argparse|json|functools|builtins|'
             r'ml_dtypes|_io|_thread|asyncio|subprocess|datetime)(\..*)?')
nitpick_ignore_regex = [
    ('py:.*', _EXTERNAL),
    # Names that are not objects: type variables and aliases written in
    # annotations, and pytree placeholders.
    ('py:.*', r'(PyTree|Array|ArrayLike|Batch|Metrics|Params|Key|KeyArray|Shape|DType|'
              r'Callable|Any|Sequence|Mapping|Iterable|Iterator|T|F|Self)'),
    ('py:.*', r'.*\.(T|F|Self)'),
    # Sphinx's parser of signatures reads tyro's ``Annotated[str,
    # arg(name='dataset')]`` (the CLI configs) as a reference to ``dataset``,
    # and splits ``str | tuple[str, ...]`` (flax fields) at its comma.
    ('py:class', r'dataset|model'),
    # ... and tyro's PrimitiveConstructorSpec of --model (a parser, a lambda, a metavar).
    ('py:class', r'purax\.app\.models\._parse_name|lambda|FACTORY'),
    ('py:class', r'str \| tuple\[str'),
]

html_theme = 'sphinx_book_theme'
html_title = 'purax'
html_theme_options = {
    'show_toc_level': 2,
    'navigation_with_keys': False,
    'home_page_in_toc': True,
    # The sidebar shows the current page's branch only: rendering the whole
    # tree on every page is most of a build's time (pydata-sphinx-theme).
    'collapse_navigation': True,
    'show_navbar_depth': 1,
}
html_static_path = []
html_show_sourcelink = False
pygments_style = 'friendly'


def _lookup(name: str):
  """The object ``name`` (``purax.io.datasets.DATASETS``) names, or ``_MISSING``."""
  parts = name.split('.')
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module('.'.join(parts[:i]))
    except ImportError:
      continue
    try:
      for attr in parts[i:]:
        obj = getattr(obj, attr)
    except AttributeError:
      return _MISSING
    return obj
  return _MISSING


_MISSING = object()


def _same(a, b) -> bool:
  try:
    return a is b or (callable(a) and a == b)
  except Exception:   # an object whose == is not a bool (an array)
    return False


def _resolve_reexport(app, env, node, contnode):
  """A reference to a purax name documented under another name resolves to
  where it is documented: ``purax.Task`` (defined in ``purax.core.task``),
  ``Log`` inside :mod:`purax.hooks`, ``DATASETS`` of another module."""
  if node.get('refdomain') != 'py':
    return None
  target = node['reftarget'].lstrip('~.')
  module, cls = node.get('py:module') or '', node.get('py:class') or ''
  candidates = [target, f'purax.{target}']
  if module:
    candidates += [f'{module}.{cls}.{target}'] if cls else []
    candidates += [f'{module}.{target}', f'{module.rsplit(".", 1)[0]}.{target}']
  domain = env.domains['py']
  last = target.rsplit('.', 1)[-1]
  documented = [n for n in domain.objects if n.rsplit('.', 1)[-1] == last]
  for candidate in candidates:
    if not candidate.startswith('purax'):
      continue
    obj = _lookup(candidate)
    if obj is _MISSING:
      continue
    where = getattr(obj, '__module__', None) or ''
    if (isinstance(obj, type) or callable(obj)) and where and not where.startswith('purax'):
      return contnode       # another library's object (NamedSharding): named, not linked
    for name in documented:
      if name != candidate and _same(_lookup(name), obj):
        found = domain.resolve_any_xref(env, node['refdoc'], app.builder, name, node, contnode)
        if found:
          return found[0][1]
  return None


def _plain_attribute_docstrings():
  """Napoleon reads an attribute's docstring ``X: Y`` as type ``X``; purax
  writes attribute docstrings as prose (``#: The export formats' names: ...``)."""
  from sphinx.ext.napoleon import docstring
  docstring.GoogleDocstring._parse_attribute_docstring = lambda self: list(self._lines)


_SECTION = re.compile(r'^(\s*)(Args|Attributes):\s*$')
_SHARED = re.compile(r'^(\s+)([A-Za-z_]\w*(?:, [A-Za-z_]\w*)+):(\s.*|)$')


def _split_shared_entries(app, what, name, obj, options, lines):
  """``d_model, num_heads: sizes.`` in Args/Attributes (one description for
  several names, which napoleon would read as a type) becomes one entry per
  name, each with the whole description."""
  out, section, i = [], None, 0
  while i < len(lines):
    line = lines[i]
    head = _SECTION.match(line)
    if head:
      section = len(head.group(1))
    elif line.strip() and section is not None and len(line) - len(line.lstrip()) <= section:
      section = None
    shared = _SHARED.match(line) if section is not None else None
    if not shared:
      out.append(line)
      i += 1
      continue
    indent, names, rest = shared.groups()
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or
                              len(lines[j]) - len(lines[j].lstrip()) > len(indent)):
      j += 1
    while j > i + 1 and not lines[j - 1].strip():
      j -= 1
    for n in names.split(', '):
      out += [f'{indent}{n}:{rest}'] + lines[i + 1:j]
    i = j
  lines[:] = out


def _skip_borrowed_functions(app, what, name, obj, skip, options):
  """A dataclass field whose default is a function (``Task.loss`` =
  ``objectives.classification``) is not a method of the class: not listed."""
  if what == 'class' and inspect.isfunction(obj) and obj.__name__ != name:
    return True
  return None


def _attributes_label():
  """Napoleon's ``Attributes:`` (as ``:ivar:`` fields) under that name, not 'Variables'."""
  from sphinx.domains.python import PyObject
  for field in PyObject.doc_field_types:
    if field.name == 'variable':
      field.label = 'Attributes'


def setup(app):
  _plain_attribute_docstrings()
  _attributes_label()
  app.connect('autodoc-skip-member', _skip_borrowed_functions)
  app.connect('autodoc-process-docstring', _split_shared_entries, priority=400)
  app.connect('missing-reference', _resolve_reexport)
