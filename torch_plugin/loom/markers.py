"""Iteration, phase and module markers: loom.step(), loom.phase(),
loom.watch(optimizer) and loom.watch(model, dynamic=[...]).

loom's plan is replayed per iteration, so loom must know where iterations
begin and end; phases help the planner group lifetimes; modules marked
dynamic (MoE experts, anything whose tensor sizes change every step) send
their requests to loom's dynamic space, and their time windows are planned.

- `step()`: the current iteration ends, the next begins. The first call ends
  iteration 0, which began when loom was enabled (set-up included).
- `watch(optimizer)`: `optimizer.step()` marks the phase "optimizer" and then
  `step()`. Uses `register_step_pre_hook`/`register_step_post_hook` where the
  optimizer has them, else wraps `optimizer.step` (Megatron's optimizers).
- `watch(model, dynamic=[...])`: the model's forward begins an iteration if
  none is open (in training mode) and marks "forward" ("eval" when not
  training); the gradient of its output marks "backward" (a tensor hook:
  nothing is added to the autograd graph). Modules whose qualified names
  match a pattern (fnmatch, or "re:<regex>", or a compiled regex) get
  module enter/exit markers with dynamic=1 around their forward, and
  around their backward (entered when the gradient of their output
  arrives, left when the gradient of their input is complete: pre-hooks
  on the autograd nodes that made the output and the input, or, for an
  input that is a leaf, a tensor hook that takes itself off when it
  fires).
- Only the outermost matching modules are marked: a matching module
  inside another one (a submodule of it in `named_modules()`, as
  "*.experts.*" matches the experts' act_fn) gets no hooks, because
  everything it requests already lies inside the outer module's dynamic
  window, forward and backward; marking it too would only split that
  window and cost hooks on every call. A matching container without a
  forward of its own (ModuleList, ModuleDict: never called) does not
  count as outer, so its matching children are marked. The handle's
  `dynamic_modules` lists the marked modules, `nested_modules` the
  matching ones left to an outer module. (A nested module called on its
  own, outside its outer module's forward, is therefore not marked.)

Per call of a marked module, libloom gets four markers (enter and exit in
forward, enter and exit in backward); the backward hooks are made once per
module by watch(), not per call.

The hooks use only what torch's Module and Optimizer provide
(register_forward_pre_hook, register_forward_hook, register_step_*_hook,
autograd Node.register_prehook, Tensor.register_hook), so fake objects with
those methods exercise them without torch. With loom not enabled every
marker is a no-op, so a script can enable loom conditionally and call
loom.step() unconditionally.
"""

import fnmatch
import re

from loom import _state
from loom.errors import LoomError


def step():
    """The current iteration ends and the next begins (no-op when loom is
    not enabled)."""
    session = _state.current()
    if session is not None:
        session.step()


def begin_iteration():
    """Begins an iteration unless one is open."""
    session = _state.current()
    if session is not None:
        session.begin_iteration()


def end_iteration():
    """Ends the current iteration without beginning the next."""
    session = _state.current()
    if session is not None:
        session.end_iteration()


def phase(name):
    """Marks the start of a phase ("forward", "backward", "optimizer",
    "eval" or any name)."""
    if not isinstance(name, str) or not name:
        raise LoomError(f"phase: expected a non-empty name, got {name!r}")
    session = _state.current()
    if session is not None:
        session.phase(name)


def module_enter(name, dynamic=False):
    session = _state.current()
    if session is not None:
        session.module_enter(name, dynamic)


def module_exit(name):
    session = _state.current()
    if session is not None:
        session.module_exit(name)


class WatchHandle:
    """What watch() registered; remove() takes it all off again."""

    def __init__(self):
        self._removers = []
        self.dynamic_modules = []  # qualified names marked dynamic
        self.nested_modules = []   # matching, inside a marked module

    def _add(self, remover):
        self._removers.append(remover)

    def remove(self):
        while self._removers:
            self._removers.pop()()


def _is_optimizer(obj):
    return hasattr(obj, "param_groups") and callable(getattr(obj, "step", None))


def _is_module(obj):
    return hasattr(obj, "named_modules") and hasattr(
        obj, "register_forward_pre_hook")


def watch(obj, dynamic=None, phases=True, iterations=True, backward=True):
    """Registers marker hooks on an optimizer or a model (see the module
    docstring). Returns a WatchHandle."""
    if _is_optimizer(obj):
        if dynamic:
            raise LoomError("watch(optimizer): dynamic= applies to models")
        return _watch_optimizer(obj, phases)
    if _is_module(obj):
        return _watch_model(obj, dynamic or (), phases, iterations, backward)
    raise LoomError(f"watch() takes a torch.nn.Module or a torch.optim."
                    f"Optimizer, got {type(obj).__name__}")


# ---------------------------------------------------------------- optimizer

def _watch_optimizer(optimizer, phases):
    handle = WatchHandle()

    def pre(*_):
        if phases:
            session = _state.current()
            if session is not None:
                session.phase("optimizer")

    def post(*_):
        step()

    if hasattr(optimizer, "register_step_pre_hook") and hasattr(
            optimizer, "register_step_post_hook"):
        handle._add(optimizer.register_step_pre_hook(pre).remove)
        handle._add(optimizer.register_step_post_hook(post).remove)
        return handle
    original = optimizer.step
    had_own = "step" in getattr(optimizer, "__dict__", {})

    def wrapped(*args, **kwargs):
        pre()
        result = original(*args, **kwargs)
        post()
        return result

    wrapped.__wrapped__ = original
    optimizer.step = wrapped

    def restore():
        if had_own:
            optimizer.step = original
        else:
            del optimizer.step

    handle._add(restore)
    return handle


# -------------------------------------------------------------------- model

def _matcher(pattern):
    if hasattr(pattern, "search") and hasattr(pattern, "pattern"):
        return pattern.search
    if not isinstance(pattern, str) or not pattern:
        raise LoomError(f"dynamic: patterns are strings (fnmatch, or "
                        f"'re:<regex>') or compiled regexes, got {pattern!r}")
    if pattern.startswith("re:"):
        try:
            return re.compile(pattern[3:]).search
        except re.error as error:
            raise LoomError(f"dynamic: bad regex {pattern[3:]!r}: {error}"
                            ) from None
    return lambda name: fnmatch.fnmatchcase(name, pattern)


def grad_tensor(value, depth=0):
    """The first tensor in `value` (a tensor, or tuples/lists/dicts of them,
    as model outputs are) that requires grad, or None."""
    if hasattr(value, "register_hook") and getattr(value, "requires_grad",
                                                   False):
        return value
    if depth >= 4:
        return None
    if isinstance(value, dict) or hasattr(value, "values") and callable(
            getattr(value, "values")) and not hasattr(value, "register_hook"):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return None
    for item in items:
        found = grad_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def mark_backward(output, name="backward"):
    """Marks phase `name` when the gradient of `output` (the first tensor in
    it that requires grad) is computed: the start of its backward."""
    tensor = grad_tensor(output)
    if tensor is None:
        return False

    def hook(_grad):
        session = _state.current()
        if session is not None:
            session.phase(name)

    tensor.register_hook(hook)
    return True


def _watch_model(model, patterns, phases, iterations, backward):
    if isinstance(patterns, str) or hasattr(patterns, "search"):
        patterns = [patterns]
    matchers = [(p, _matcher(p)) for p in patterns]
    handle = WatchHandle()

    def root_pre(module, _args):
        session = _state.current()
        if session is None:
            return
        training = getattr(module, "training", True)
        if training and iterations:
            session.begin_iteration()
        if phases:
            session.phase("forward" if training else "eval")

    def root_post(module, _args, output):
        if phases and getattr(module, "training", True):
            mark_backward(output)

    # Every pattern is checked before any hook goes on: a refused watch()
    # leaves the model as it was.
    names = [name for name, _ in model.named_modules() if name]
    unmatched = [p for p, match in matchers if not any(match(n) for n in names)]
    if unmatched:
        example = ", ".join(repr(n) for n in names[:3])
        raise LoomError(f"dynamic pattern {unmatched[0]!r} matches no module "
                        f"of the model (names look like {example})")
    handle._add(model.register_forward_pre_hook(root_pre).remove)
    handle._add(model.register_forward_hook(root_post).remove)
    outer = set()  # marked modules with a forward of their own
    for name, module in model.named_modules():
        if not name or not any(match(name) for _, match in matchers):
            continue
        if _inside(name, outer):
            handle.nested_modules.append(name)
            continue
        _watch_dynamic(module, name, handle, backward)
        handle.dynamic_modules.append(name)
        if _has_forward(module):
            outer.add(name)
    return handle


def _inside(name, outer):
    """Whether qualified name `name` is a submodule of one in `outer`.
    named_modules() yields parents before their children."""
    dot = name.rfind(".")
    while dot > 0:
        if name[:dot] in outer:
            return True
        dot = name.rfind(".", 0, dot)
    return False


def _has_forward(module):
    """False for containers that are never called (torch's ModuleList,
    ModuleDict, ...: their forward is nn.Module's placeholder)."""
    forward = getattr(type(module), "forward", None)
    return getattr(forward, "__name__", "") != "_forward_unimplemented"


def _first_grad(args):
    """grad_tensor(args) for a forward's positional arguments, with the
    common case (the first argument) first."""
    if args:
        first = args[0]
        if getattr(first, "requires_grad", False) and hasattr(
                first, "register_hook"):
            return first
    return grad_tensor(args)


def _on_gradient(tensor, hook):
    """Calls `hook` once the gradient of `tensor` is complete: a pre-hook
    on the autograd node that made it (it runs when the node is about to
    run, every gradient for it accumulated: when a tensor hook would). A
    leaf has no node and outlives the step: a tensor hook, which takes
    itself off when it fires."""
    node = getattr(tensor, "grad_fn", None)
    if node is not None and hasattr(node, "register_prehook"):
        node.register_prehook(hook)
        return
    handles = []

    def once(grad):
        if handles:
            handles.pop().remove()
        hook(grad)

    handles.append(tensor.register_hook(once))


def _watch_dynamic(module, name, handle, backward):
    current = _state.current

    # Made once here, not per call: the backward markers.
    def backward_exit(_grads):  # the input's gradient is complete
        session = current()
        if session is not None:
            session.module_exit(name)

    def backward_enter(_grads):  # the output's gradient arrived
        session = current()
        if session is not None:
            session.module_enter(name, True)

    def pre(_module, args):
        session = current()
        if session is None:
            return
        session.module_enter(name, True)
        if backward:
            tensor = _first_grad(args)
            if tensor is not None:
                _on_gradient(tensor, backward_exit)

    def post(_module, args, output):
        session = current()
        if session is None:
            return
        session.module_exit(name)
        # Only when the backward window will be left again (the input
        # requires grad, so pre set its exit).
        if backward and _first_grad(args) is not None:
            tensor = grad_tensor(output)
            if tensor is not None:
                _on_gradient(tensor, backward_enter)

    handle._add(module.register_forward_pre_hook(pre).remove)
    handle._add(module.register_forward_hook(post).remove)
