"""Conan 2 recipe for Cadence, a header-only C++17 library.

    conan create . [-o "cadence/*:with_zmq=True"] [-o "cadence/*:with_mpi=True"]

Consumers get the targets find_package(cadence) gives (CMakeDeps): cadence::cadence, and
cadence::zmq / cadence::mpi when the matching option is on. The communicators link the system's
libzmq and MPI, found through pkg-config when a consumer's build reads this package (the recipe
requires nothing from a remote). gloo, NCCL and Thrust are not offered here: take them through
find_package or add_subdirectory (docs/install.md). tests/consumer (consumer.conan) runs
`conan create` with both options on and test_package/ builds tests/consumer's programs.
"""

import os

from conan import ConanFile
from conan.errors import ConanException, ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
from conan.tools.gnu import PkgConfig
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0"


class CadenceConan(ConanFile):
    name = "cadence"
    description = "Synchronization policies for distributed deep-learning training"
    license = "Apache-2.0"
    topics = ("distributed-training", "parameter-server", "ssp", "elastic-bsp", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_zmq": [True, False], "with_mpi": [True, False]}
    default_options = {"with_zmq": False, "with_mpi": False}
    # Every header under include/ is the library's (the consumer.install test checks that the
    # CMake install holds the same set).
    exports_sources = "include/*", "LICENSE"
    no_copy_source = True

    def set_version(self):
        # The one version of every build (CMake, Meson and pyproject.toml read it too).
        self.version = load(self, os.path.join(self.recipe_folder, "VERSION")).strip()

    def layout(self):
        basic_layout(self, src_folder=".")

    def package_id(self):
        # The same headers for every configuration; the options only decide which system
        # libraries package_info() declares.
        self.info.clear()

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 17)
        if self.settings.os == "Windows":
            raise ConanInvalidConfiguration("cadence is tested on Linux only (POSIX sockets)")

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        copy(self, "*", os.path.join(self.source_folder, "include"),
             os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "cadence")
        # The package-wide target gets a name of its own so that the core keeps
        # find_package's name, cadence::cadence.
        self.cpp_info.set_property("cmake_target_name", "cadence::cadence_all")

        core = self.cpp_info.components["core"]
        core.set_property("cmake_target_name", "cadence::cadence")
        core.set_property("pkg_config_name", "cadence")
        core.bindirs = []
        core.libdirs = []
        if self.settings.os in ("Linux", "FreeBSD"):
            core.system_libs = ["pthread"]

        if self.options.with_zmq:
            zmq = self.cpp_info.components["zmq"]
            zmq.set_property("cmake_target_name", "cadence::zmq")
            zmq.set_property("pkg_config_name", "cadence-zmq")
            zmq.requires = ["core"]
            self._from_pkg_config(zmq, ["libzmq"], "with_zmq", "libzmq 4.2 or later")

        if self.options.with_mpi:
            mpi = self.cpp_info.components["mpi"]
            mpi.set_property("cmake_target_name", "cadence::mpi")
            mpi.set_property("pkg_config_name", "cadence-mpi")
            mpi.requires = ["core"]
            # Debian's alternative for whichever MPI is installed, then Open MPI's and MPICH's.
            self._from_pkg_config(mpi, ["mpi-c", "ompi-c", "mpich"], "with_mpi", "an MPI")
            # Only MPI's C API is used; its C++ bindings stay out, as in the CMake target.
            mpi.defines += ["OMPI_SKIP_MPICXX", "MPICH_SKIP_MPICXX"]

    def _from_pkg_config(self, component, names, option, what):
        for name in names:
            try:
                PkgConfig(self, name).fill_cpp_info(component, is_system=True)
                return
            except ConanException:
                continue
        raise ConanInvalidConfiguration(
            f"cadence: {option}=True needs {what} that pkg-config can find "
            f"(tried {', '.join(names)}; set PKG_CONFIG_PATH)")
