"""Repository rules that bring system libraries and tools into the offline build.

pkg_config_repository(name, modules, ...) runs `pkg-config --cflags --libs` for
the given modules and generates `@name//:lib`, a cc_library carrying the link
options, defines and include directories. Include directories outside the
compiler's built-in search path are symlinked into the repository and their
headers declared, so Bazel's inclusion checks accept them.

kvf_config_repository(name) detects the optional parts (CUDA, UCX, verbs,
io_uring, Level Zero) and the code generators (protoc, grpc_cpp_plugin), and
writes `@name//:config.bzl` with HAS_* flags and tool paths, plus
`@name//:cudart_static` when CUDA is present. It prints one line per optional
part it skips, naming the Debian package or path that would enable it.
"""

_SETUP_HINT = "run tools/setup.sh (it installs every Debian package the build needs)"

def _pkg_config(rctx, modules):
    pkg_config = rctx.which("pkg-config")
    if not pkg_config:
        return None, "pkg-config not found"
    res = rctx.execute([pkg_config, "--cflags", "--libs"] + modules)
    if res.return_code != 0:
        return None, res.stderr.strip()
    return res.stdout.strip().split(" "), None

def _lib_build_file(rctx, flags):
    """Splits pkg-config flags into a cc_library's attributes."""
    linkopts = []
    defines = []
    includes = []
    for flag in flags:
        if not flag:
            continue
        if flag.startswith("-I"):
            path = flag[2:]
            if path in ("/usr/include", "/usr/local/include"):
                continue
            link = "inc%d" % len(includes)
            rctx.symlink(path, link)
            includes.append(link)
        elif flag.startswith("-D"):
            defines.append(flag[2:])
        else:
            # -l, -L, -pthread, -Wl,...: all of them matter only at link time.
            linkopts.append(flag)
    hdr_globs = ["%s/**/*.h" % d for d in includes] + ["%s/**/*.hpp" % d for d in includes]
    return """package(default_visibility = ["//visibility:public"])

cc_library(
    name = "lib",
    hdrs = glob({hdrs}),
    includes = {includes},
    defines = {defines},
    linkopts = {linkopts},
)
""".format(
        hdrs = repr(hdr_globs),
        includes = repr(includes),
        defines = repr(defines),
        linkopts = repr(linkopts),
    )

def _pkg_config_repository_impl(rctx):
    flags, err = _pkg_config(rctx, rctx.attr.modules)
    if flags == None:
        fail("pkg-config could not find %s (%s): %s" % (
            " ".join(rctx.attr.modules),
            err,
            _SETUP_HINT,
        ))
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)
    rctx.file("BUILD", _lib_build_file(rctx, flags + rctx.attr.extra_linkopts))

pkg_config_repository = repository_rule(
    implementation = _pkg_config_repository_impl,
    attrs = {
        "modules": attr.string_list(mandatory = True, doc = "pkg-config module names"),
        "extra_linkopts": attr.string_list(doc = "link options pkg-config does not give"),
    },
    local = True,
    doc = "A required system library found through pkg-config.",
)

def _kvf_config_repository_impl(rctx):
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)
    build = ['package(default_visibility = ["//visibility:public"])\n']
    skipped = []

    has = {}
    libs = {}
    for name, modules, package in [
        ("ucx", ["ucx"], "libucx-dev"),
        ("verbs", ["libibverbs", "librdmacm"], "libibverbs-dev librdmacm-dev"),
        ("uring", ["liburing"], "liburing-dev"),
        ("level_zero", ["level-zero"], "libze-dev"),
    ]:
        flags, _ = _pkg_config(rctx, modules)
        has[name] = flags != None
        if flags == None:
            skipped.append("%s (install %s)" % (name, package))
            libs[name] = []
        else:
            # Sources include these headers by their path under /usr/include
            # (<infiniband/verbs.h>, <level_zero/ze_api.h>), so only the link
            # options are kept.
            libs[name] = [f for f in flags if f.startswith("-l") or f.startswith("-L")]
        build.append('cc_library(name = "%s", linkopts = %s)\n' % (name, repr(libs[name])))

    nvcc = rctx.path(rctx.attr.cuda_path + "/bin/nvcc")
    has["cuda"] = nvcc.exists
    cuda_lib = rctx.attr.cuda_path + "/lib64"
    if has["cuda"]:
        build.append("""cc_library(
    name = "cudart_static",
    linkopts = ["-L{lib}", "-lcudart_static", "-ldl", "-lrt", "-lpthread"],
)
""".format(lib = cuda_lib))
    else:
        skipped.append("cuda (no %s; install the CUDA toolkit)" % nvcc)
        build.append('cc_library(name = "cudart_static")\n')

    protoc = rctx.which("protoc")
    grpc_plugin = rctx.which("grpc_cpp_plugin")
    if not protoc or not grpc_plugin:
        fail("protoc or grpc_cpp_plugin not found: " + _SETUP_HINT)

    # Reading the file through its label makes Bazel re-run this rule when it changes.
    version = rctx.read(rctx.path(Label("//:VERSION"))).strip()

    rctx.file("BUILD", "\n".join(build))
    rctx.file("config.bzl", """# Generated by kvf_config_repository: what this machine's build includes.
HAS_CUDA = {cuda}
HAS_UCX = {ucx}
HAS_VERBS = {verbs}
HAS_URING = {uring}
HAS_LEVEL_ZERO = {level_zero}
KVF_VERSION = "{version}"
NVCC = "{nvcc}"
CUDA_ARCHS = ["80", "90"]
PROTOC = "{protoc}"
GRPC_CPP_PLUGIN = "{grpc_plugin}"
""".format(
        cuda = has["cuda"],
        ucx = has["ucx"],
        verbs = has["verbs"],
        uring = has["uring"],
        level_zero = has["level_zero"],
        version = version,
        nvcc = nvcc,
        protoc = protoc,
        grpc_plugin = grpc_plugin,
    ))
    for part in skipped:
        print("kvfabric: optional part skipped: " + part)

kvf_config_repository = repository_rule(
    implementation = _kvf_config_repository_impl,
    attrs = {
        "cuda_path": attr.string(default = "/usr/local/cuda"),
    },
    local = True,
    environ = ["PATH"],
    doc = "Detects kvfabric's optional parts and code generators.",
)
