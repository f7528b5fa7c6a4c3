"""The native Java rules Bazel 4's tools/jdk loads, under rules_java's names (see ../WORKSPACE)."""

java_import = native.java_import
java_runtime = native.java_runtime
java_toolchain = native.java_toolchain
