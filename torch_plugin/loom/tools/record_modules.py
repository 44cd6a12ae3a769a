"""Which modules of a model a CPU recording marks, and the hooks that mark
them and the model's iterations and phases (loom.tools.record_cpu; `loom
record-cpu` and its --device cuda reference use the same module hooks).

Every module's forward is a module enter/exit named by its qualified name
(the root by its class). Modules whose class name matches DYNAMIC_CLASSES
(MoE blocks and experts) or a `dynamic=` pattern (fnmatch, "re:<regex>" or a
compiled regex, on qualified or class names) are flagged dynamic and also
marked around their backward, by tensor hooks on their output's and input's
gradients (nothing is added to the autograd graph). torch is never imported
here: the hooks are registered on the modules given.
"""

import fnmatch
import re

from loom.errors import LoomError

# Class names of modules recorded as dynamic (their requests change size or
# presence with the routing): MoE blocks and their experts in transformers
# (MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock, Qwen3MoeExperts,
# OlmoeSparseMoeBlock, DeepseekV3MoE, GptOssExperts, ...). A regular
# expression searched in the class name, case-sensitive ("Qwen2MoeAttention"
# does not match).
DYNAMIC_CLASSES = r"Experts|SparseMoe|MoE|Moe$"


def _matcher(pattern):
    if hasattr(pattern, "search") and hasattr(pattern, "pattern"):
        return pattern.search
    if not isinstance(pattern, str) or not pattern:
        raise LoomError(f"record_cpu: dynamic patterns are strings (fnmatch "
                        f"or 're:<regex>') or compiled regexes, got "
                        f"{pattern!r}")
    if pattern.startswith("re:"):
        try:
            return re.compile(pattern[3:]).search
        except re.error as error:
            raise LoomError(f"record_cpu: bad regex {pattern[3:]!r}: "
                            f"{error}") from None
    return lambda name: fnmatch.fnmatchcase(name, pattern)


def _first_grad_tensor(value, depth=0):
    """The first tensor in `value` (a tensor or nested tuples, lists, dicts
    and model outputs) that requires grad, or None."""
    if hasattr(value, "register_hook") and getattr(value, "requires_grad",
                                                   False):
        return value
    if depth >= 4 or hasattr(value, "register_hook"):
        return None
    if isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, dict) or callable(getattr(value, "values", None)):
        items = value.values()
    else:
        return None
    for item in items:
        found = _first_grad_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def module_names(model):
    """(qualified name, module) of every module of `model`; the root is
    named by its class (a trace name cannot be empty in practice)."""
    return [(name or type(module).__name__, module)
            for name, module in model.named_modules()]


def dynamic_modules(model, dynamic=(), dynamic_classes=DYNAMIC_CLASSES):
    """The qualified names of the modules of `model` recorded as dynamic:
    class name matching `dynamic_classes` (a regex, searched; None or ""
    for none), or qualified name or class name matching one of `dynamic`
    (fnmatch, "re:<regex>" or compiled regexes). A pattern of `dynamic`
    that matches no module is a LoomError."""
    if isinstance(dynamic, str) or hasattr(dynamic, "search"):
        dynamic = [dynamic]
    matchers = [(p, _matcher(p)) for p in dynamic or ()]
    by_class = re.compile(dynamic_classes).search if dynamic_classes else None
    named = module_names(model)
    found = []
    used = set()
    for name, module in named:
        cls = type(module).__name__
        hit = bool(by_class and by_class(cls))
        for pattern, match in matchers:
            if match(name) or match(cls):
                used.add(id(pattern))
                hit = True
        if hit:
            found.append(name)
    unused = [p for p, _ in matchers if id(p) not in used]
    if unused:
        example = ", ".join(repr(n) for n, _ in named[1:4])
        raise LoomError(f"record_cpu: dynamic pattern {unused[0]!r} matches "
                        f"no module of the model (names look like {example})")
    return found


def hook_modules(model, sink, dynamic=(), dynamic_classes=DYNAMIC_CLASSES,
                 modules=True):
    """Forward hooks on the modules of `model` that send module markers to
    `sink` (module_enter(name, dynamic), module_exit(name)): every module
    (`modules=False`: the dynamic ones only) around its forward; the
    dynamic ones (see dynamic_modules) also around their backward, entered
    when the gradient of their output arrives and left when the gradient of
    their input is complete (tensor hooks: nothing is added to the autograd
    graph). Returns (dynamic module names, list of hook removers)."""
    found = dynamic_modules(model, dynamic, dynamic_classes)
    flagged = set(found)
    removers = []
    for name, module in module_names(model):
        is_dynamic = name in flagged
        if not (modules or is_dynamic):
            continue

        def pre(_module, args, name=name, is_dynamic=is_dynamic):
            sink.module_enter(name, is_dynamic)
            if is_dynamic:
                tensor = _first_grad_tensor(args)
                if tensor is not None:
                    tensor.register_hook(lambda _g: sink.module_exit(name))

        def post(_module, args, output, name=name, is_dynamic=is_dynamic):
            sink.module_exit(name)
            if is_dynamic and _first_grad_tensor(args) is not None:
                tensor = _first_grad_tensor(output)
                if tensor is not None:
                    tensor.register_hook(
                        lambda _g: sink.module_enter(name, True))

        removers.append(module.register_forward_pre_hook(pre).remove)
        removers.append(module.register_forward_hook(post).remove)
    return found, removers


def hook_root(model, sink):
    """Hooks on `model` itself that send iteration and phase markers to
    `sink` (begin_iteration(), phase(name)): in training mode its forward
    begins an iteration if none is open and marks "forward", the gradient
    of its output marks "backward"; in eval mode its forward marks "eval".
    The forward pre-hook goes first, so the phase precedes the root's own
    module enter. Returns the list of hook removers."""

    def root_pre(module, _args):
        if getattr(module, "training", True):
            sink.begin_iteration()
            sink.phase("forward")
        else:
            sink.phase("eval")

    def root_post(module, _args, output):
        if getattr(module, "training", True):
            tensor = _first_grad_tensor(output)
            if tensor is not None:
                tensor.register_hook(lambda _g: sink.phase("backward"))

    return [model.register_forward_pre_hook(root_pre, prepend=True).remove,
            model.register_forward_hook(root_post).remove]
