"""The optional pieces of loom and the one line that says how to get one.

The package itself needs nothing beyond the standard library (`import
loom`, the trace tools, analysis, planning, comparison and the command
line). The rest comes with the wheel's extras (torch_plugin/packaging/
setup.py declares them from EXTRAS below):

  plots   matplotlib: the pictures of `loom demo`, `loom compare --plot`
          and `loom what-if --plot`
  record  PyTorch and transformers: `loom record-cpu`, `loom what-if
          --model` (a model by name, recorded on the CPU)
  all     both

A command that misses one says so in one line, with the command that fixes
it (`pip install 'loom-alloc[plots]'` for an installed wheel; in a source
checkout, where the package does not come from pip, `./loom setup` or
`pip install <module>`), never with a traceback.
"""

import importlib
import importlib.util

# The distribution's name on PyPI (`loom` there is an unrelated package);
# the import name stays `loom`.
DIST = "loom-alloc"

# extra -> the requirements it adds (setup.py's extras_require).
EXTRAS = {
    "plots": ("matplotlib>=3.6",),
    # transformers 5 (the API the CPU recorder uses) needs torch >= 2.5.
    "record": ("torch>=2.5", "transformers>=5"),
}
EXTRAS["all"] = tuple(r for extra in ("plots", "record")
                      for r in EXTRAS[extra])

# module -> (what it is called in messages, the extra that brings it).
MODULES = {
    "matplotlib": ("matplotlib", "plots"),
    "torch": ("PyTorch (torch)", "record"),
    "transformers": ("transformers", "record"),
}


def importable(module):
    """True when `module` imports in this Python (an install that is
    there but broken counts as missing)."""
    try:
        importlib.import_module(module)
    except (ImportError, OSError):
        return False
    return True


def missing(modules):
    """The modules of `modules` that this Python cannot import, in order.
    Once one is missing, the rest are only looked up, not imported (a
    package that needs the missing one may complain while it loads:
    transformers warns without torch)."""
    out = []
    for module in modules:
        if out:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
        else:
            found = importable(module)
        if not found:
            out.append(module)
    return out


def in_checkout():
    """True when this package runs from a loom source checkout (beside the
    ./loom launcher), not from an installed wheel."""
    from loom import _paths  # pylint: disable=import-outside-toplevel
    root = _paths.REPO_ROOT
    return (root / "loom").is_file() and (root / "WORKSPACE").is_file()


def fix(modules, checkout=None):
    """The command that installs `modules` (names in MODULES)."""
    checkout = in_checkout() if checkout is None else checkout
    if checkout:
        return f"./loom setup, or pip install {' '.join(modules)}"
    extras = sorted({MODULES[m][1] for m in modules})
    extra = extras[0] if len(extras) == 1 else "all"
    return f"pip install '{DIST}[{extra}]'"


def _names(modules):
    names = [MODULES[m][0] for m in modules]
    return names[0] if len(names) == 1 else \
        ", ".join(names[:-1]) + " and " + names[-1]


def message(prog, what, modules, outcome=None, checkout=None):
    """One line: `prog: [outcome: ]what needs X, which this Python cannot
    import (to get it: <fix>)`, e.g. `loom demo: pictures skipped: drawing
    them needs matplotlib, ...`."""
    head = f"{prog}: {outcome}: " if outcome else f"{prog}: "
    return (f"{head}{what} needs {_names(modules)}, which this Python "
            f"cannot import (to get {'them' if len(modules) > 1 else 'it'}: "
            f"{fix(modules, checkout)})")
