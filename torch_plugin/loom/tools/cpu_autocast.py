"""CUDA's autocast policy for CPU autocast, while a CPU recording runs.

`torch.autocast("cpu", dtype=torch.bfloat16)` follows the CPU's op lists,
which differ from CUDA's: on CUDA, softmax, log_softmax, sum, cumsum,
exp, log, pow, rsqrt, layer_norm, rms_norm and others run in float32 (so
their outputs are float32, twice the bytes), einsum and mv run in the
lower precision, and the CPU's own casts (cat, stack, index_copy,
cross_entropy_loss, fft, linalg, pooling ...) do not happen. A recording
of what the CUDA allocator would see needs CUDA's dtypes.

`install()` registers Python kernels for the AutocastCPU dispatch key (a
`torch.library` fragment) that do what CUDA's autocast kernels do
(ATen's autocast_mode.cpp, policies `lower_precision_fp`, `fp32`,
`fp32_set_opt_dtype`, `fp32_append_dtype` and `promote`) for every op
CUDA's autocast handles and the CPU's does not, and nothing for the ops
only the CPU's autocast handles (no cast; a composite op such as
cross_entropy_loss is decomposed with autocast still on, as CUDA's
fallthrough does, so its log_softmax runs in float32); `remove()` takes
them off and the CPU's kernels are back. Ops both handle alike (mm,
linear, matmul, bmm, baddbmm, addmm, conv, scaled_dot_product_attention,
the losses) keep the CPU's kernels; `prod` gets CUDA's policy.
`binary_cross_entropy`, which CUDA's autocast refuses, keeps the CPU's.
The kernels take effect only while CPU autocast is enabled.

Not emulated: CUDA's autocast caches the lower-precision copy of a weight
within an autocast region; the emulated lower-precision ops here (einsum,
mv, addmv, addr, chain_matmul, linalg_multi_dot, RNN cells, convolution)
cast again at each use (the CPU's cached ops, linear and matmul among
them, cache as CUDA does).

The tables below are those of PyTorch 2.x; `check_tables()` compares them
with the ops the installed torch registers for AutocastCUDA (a test does,
so a PyTorch upgrade that changes the lists is noticed). torch is imported
only by install() and check_tables().
"""

import warnings

# CUDA's autocast policies for the ops that only CUDA's autocast handles
# (aten overload names).
LOWER_PRECISION = (
    "_convolution", "convolution", "cudnn_convolution",
    "cudnn_convolution_transpose", "addmv", "addr", "chain_matmul", "einsum",
    "linalg_multi_dot", "mv", "_scaled_dot_product_flash_attention",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2",
    "log1p", "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar",
    "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "group_norm", "rms_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "dist", "pdist",
    "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
    "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d",
    "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod",
    "cumsum", "linalg_vector_norm", "linalg_matrix_norm",
    "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
)
# op -> the overload called with dtype=float32 instead.
FP32_APPEND_DTYPE = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot",
    "index_put", "tensordot", "scatter_add",
)
# Handled by both autocasts, with different policies: CUDA's is applied.
DIFFERENT_POLICY = ("prod", "prod.dim_int")
# Handled by both, CUDA's autocast refuses it: the CPU's kernel stays.
KEEP_CPU = ("binary_cross_entropy",)


def cuda_policies():
    """{aten overload name: CUDA policy} for the tables above."""
    table = {}
    for names, policy in ((LOWER_PRECISION, "lower_precision_fp"),
                          (FP32, "fp32"),
                          (FP32_SET_OPT_DTYPE, "fp32_set_opt_dtype"),
                          (tuple(FP32_APPEND_DTYPE), "fp32_append_dtype"),
                          (PROMOTE, "promote")):
        for name in names:
            table[name] = policy
    return table


def _registered():
    """(ops with an AutocastCUDA kernel, ops with an AutocastCPU kernel),
    as aten overload names ("softmax.int", "sum")."""
    import torch  # pylint: disable=import-outside-toplevel
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    cuda, cpu = set(), set()
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::"):
            continue
        name = full[len("aten::"):]
        if has(full, "AutocastCUDA"):
            cuda.add(name)
        if has(full, "AutocastCPU"):
            cpu.add(name)
    return cuda, cpu


def check_tables():
    """Differences between the tables and the installed torch: a dict with
    `missing` (CUDA-only ops torch registers that the tables lack) and
    `stale` (table entries torch has no AutocastCUDA kernel for). Both are
    empty for the PyTorch the tables were written against."""
    cuda, cpu = _registered()
    table = cuda_policies()
    cuda_only = cuda - cpu
    return {"missing": sorted(cuda_only - set(table)),
            "stale": sorted(set(table) - cuda)}


def _op(torch, name):
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


class Policy:
    """The installed kernels; `remove()` takes them off."""

    def __init__(self, library):
        self._library = library

    def remove(self):
        if self._library is not None:
            self._library._destroy()  # pylint: disable=protected-access
            self._library = None


def _kernels(torch):
    """name -> Python kernel for AutocastCPU."""
    dispatch = torch._C
    excluded = dispatch.DispatchKeySet(dispatch.DispatchKey.AutocastCPU)
    # pylint: disable-next=protected-access
    guard = dispatch._ExcludeDispatchKeyGuard
    tensor_type = torch.Tensor
    float32, float64 = torch.float32, torch.float64

    def eligible(value):
        return isinstance(value, tensor_type) and value.is_floating_point() \
            and value.dtype != float64

    def cast(value, dtype):
        if eligible(value) and value.dtype != dtype:
            return value.to(dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(cast(item, dtype) for item in value)
        return value

    def cast_all(args, kwargs, dtype):
        return ([cast(a, dtype) for a in args],
                {k: cast(v, dtype) for k, v in kwargs.items()})

    def leaves(values):
        for value in values:
            if isinstance(value, (list, tuple)):
                yield from leaves(value)
            else:
                yield value

    def lower_precision(op):
        def kernel(*args, **kwargs):
            with guard(excluded):
                args, kwargs = cast_all(args, kwargs,
                                        torch.get_autocast_dtype("cpu"))
                return op(*args, **kwargs)
        return kernel

    def fp32(op):
        def kernel(*args, **kwargs):
            with guard(excluded):
                args, kwargs = cast_all(args, kwargs, float32)
                return op(*args, **kwargs)
        return kernel

    def set_opt_dtype(op):
        # pylint: disable-next=protected-access
        index = [a.name for a in op._schema.arguments].index("dtype")

        def kernel(*args, **kwargs):
            with guard(excluded):
                given = kwargs.get("dtype") is not None or (
                    index < len(args) and args[index] is not None)
                if args and eligible(args[0]) and not given:
                    if index < len(args):
                        args = list(args)
                        args[index] = float32
                    else:
                        kwargs = dict(kwargs, dtype=float32)
                return op(*args, **kwargs)
        return kernel

    def append_dtype(op, with_dtype):
        arguments = op._schema.arguments  # pylint: disable=protected-access
        names = [a.name for a in arguments]
        defaults = [a.default_value if a.has_default_value() else None
                    for a in arguments]

        def kernel(*args, **kwargs):
            with guard(excluded):
                if not (args and eligible(args[0])):
                    return op(*args, **kwargs)
                values = list(args) + [kwargs.get(n, d) for n, d in zip(
                    names[len(args):], defaults[len(args):])]
                return with_dtype(*values, dtype=float32)
        return kernel

    def promote(op):
        def kernel(*args, **kwargs):
            with guard(excluded):
                widest = torch.get_autocast_dtype("cpu")
                for value in leaves(list(args) + list(kwargs.values())):
                    if eligible(value):
                        widest = torch.promote_types(widest, value.dtype)
                args, kwargs = cast_all(args, kwargs, widest)
                return op(*args, **kwargs)
        return kernel

    def passthrough(op, composite):
        if composite:
            # As a fallthrough: the decomposition's ops meet autocast again
            # (cross_entropy_loss -> log_softmax in float32, as on CUDA).
            def kernel(*args, **kwargs):
                return op.decompose(*args, **kwargs)
        else:
            def kernel(*args, **kwargs):
                with guard(excluded):
                    return op(*args, **kwargs)
        return kernel

    makers = {"lower_precision_fp": lower_precision, "fp32": fp32,
              "fp32_set_opt_dtype": set_opt_dtype, "promote": promote}
    cuda, cpu = _registered()
    kernels = {}
    for name, policy in cuda_policies().items():
        if name not in cuda or (name in cpu and name not in
                                DIFFERENT_POLICY):
            continue  # not in this torch, or the CPU's kernel does the same
        op = _op(torch, name)
        if policy == "fp32_append_dtype":
            kernels[name] = append_dtype(
                op, _op(torch, FP32_APPEND_DTYPE[name]))
        else:
            kernels[name] = makers[policy](op)
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in sorted(cpu - cuda):
        if name not in KEEP_CPU:
            composite = has(f"aten::{name}", "CompositeImplicitAutograd")
            kernels[name] = passthrough(_op(torch, name), composite)
    return kernels


def install():
    """Puts CUDA's autocast policy on CPU autocast; returns a Policy whose
    remove() restores the CPU's."""
    import torch  # pylint: disable=import-outside-toplevel
    library = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            # "Overriding a previously registered kernel": intended.
            warnings.simplefilter("ignore")
            for name, kernel in _kernels(torch).items():
                library.impl(name, kernel, "AutocastCPU")
    except BaseException:
        library._destroy()  # pylint: disable=protected-access
        raise
    return Policy(library)
