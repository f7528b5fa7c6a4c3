"""Builds tests/consumer against the Conan package and runs its programs."""

import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, cmake_layout


class CadenceTestPackage(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps", "CMakeToolchain"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def test(self):
        if not can_run(self):
            return
        options = self.dependencies[self.tested_reference_str].options
        programs = ["consumer"]
        programs += [f"consumer_{b}" for b in ("zmq", "mpi") if options.get_safe(f"with_{b}")]
        for program in programs:
            path = os.path.join(self.cpp.build.bindir, "consumer", program)
            # A singleton MPI job (MPI_Init without mpirun); Open MPI asks for these as root.
            if "mpi" in program:
                path = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + path
            self.run(path, env="conanrun")
