"""Repository rule that exposes /usr/local/cuda where it exists.

Defines @local_cuda with:
  defs.bzl        HAS_CUDA (bool): whether nvcc was found at configure time.
  :cuda_headers   the toolkit headers (include/, with nv/ and crt/).
  :cudart         the CUDA runtime, linked dynamically.
  :nccl           NCCL, linked dynamically.
  :nvcc           the compiler, for genrules that build .cu files.
Without a toolkit every target is an empty library, so the CPU-only build still works.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = ctx.path(root + "/bin/nvcc")
    has_cuda = nvcc.exists and ctx.os.environ.get("SAMPLERD_NO_CUDA", "") == ""
    if has_cuda:
        ctx.symlink(root + "/include", "include")
        ctx.symlink(root + "/bin", "bin")
        ctx.symlink(root + "/lib64", "lib64")
        ctx.file("BUILD.bazel", """
package(default_visibility = ["@//:gpu_users"])

cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/*.h", "include/*.hpp", "include/nv/**", "include/crt/**", "include/cuda/**"]),
    includes = ["include"],
)

cc_library(
    name = "cudart",
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lcudart"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "nccl",
    linkopts = ["-L{root}/lib", "-L{root}/lib64", "-Wl,-rpath,{root}/lib", "-lnccl"],
    deps = [":cuda_headers"],
)

filegroup(
    name = "nvcc",
    srcs = ["bin/nvcc"],
)
""".format(root = root))
    else:
        ctx.file("BUILD.bazel", """
package(default_visibility = ["@//:gpu_users"])

cc_library(name = "cuda_headers")

cc_library(name = "cudart")

cc_library(name = "nccl")

filegroup(name = "nvcc", srcs = [])
""")
    ctx.file("defs.bzl", "HAS_CUDA = %s\nCUDA_ROOT = %r\n" % (has_cuda, root))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH", "SAMPLERD_NO_CUDA"],
    local = True,
)
