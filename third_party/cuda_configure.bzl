"""Repository rule exposing the CUDA toolkit headers (cuda.h) to Bazel.

Reads $LOOM_CUDA_PATH (default /usr/local/cuda). Only headers are exposed: loom
loads libcuda.so.1 at run time and never links it. Without a toolkit the rule
still succeeds and defines LOOM_NO_CUDA_HEADERS, so the CUDA backend compiles
to one that reports "built without CUDA headers".
"""

def _cuda_configure_impl(ctx):
    path = ctx.os.environ.get("LOOM_CUDA_PATH", "/usr/local/cuda")
    header = ctx.path(path + "/include/cuda.h")
    if header.exists:
        ctx.symlink(path + "/include", "include")
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/*.h", "include/crt/*.h", "include/crt/*.hpp"]),
    includes = ["include"],
)
""")
    else:
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_headers",
    defines = ["LOOM_NO_CUDA_HEADERS"],
)
""")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["LOOM_CUDA_PATH"],
    local = True,
)
