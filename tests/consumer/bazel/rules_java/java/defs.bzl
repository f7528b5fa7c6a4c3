"""The native Java rules Bazel 4's tools/jdk loads, under rules_java's names (see ../WORKSPACE)."""

def java_import(**kwargs):
    native.java_import(**kwargs)

def java_runtime(**kwargs):
    native.java_runtime(**kwargs)

def java_toolchain(**kwargs):
    native.java_toolchain(**kwargs)
