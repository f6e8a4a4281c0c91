"""The one build step pyproject.toml cannot declare: the bind guard, compiled when dpmigrate is installed.

Why: a multi-node ``dpmigrate launch`` preloads ``bind_guard.c`` (migrate/launch/bind_guard.py) into every
process of the job. Built here, once, into the package folder (``dpmigrate/launch/_bind_guard.so``; for
``pip install -e .`` into migrate/launch/, where the editable package is), a node needs no C compiler at
run time. It is a plain shared object for LD_PRELOAD, not a Python module: no ABI tag in its name, and the
wheel is tagged ``py3-none-<platform>`` (any Python 3, this platform). Linux only: off Linux nothing is
compiled and the wheel stays pure. Without a compiler the extension is optional: the install still
succeeds, and the guard is compiled when a multi-node job starts (or refused there, naming the fix).
Everything else (metadata, packages, extras) is in pyproject.toml.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

LINUX = sys.platform.startswith("linux")


class BuildBindGuard(build_ext):
    def get_ext_filename(self, fullname):
        return os.path.join(*fullname.split(".")) + ".so"  # _bind_guard.so, not _bind_guard.cpython-311-...so

    def build_extension(self, ext):
        super().build_extension(ext)
        os.chmod(self.get_ext_fullpath(ext.name), 0o755)  # whatever the umask: writable by its owner only


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        _, _, platform = super().get_tag()
        return ("py3", "none", platform) if LINUX else super().get_tag()


setup(
    ext_modules=[Extension("dpmigrate.launch._bind_guard", ["migrate/launch/bind_guard.c"], libraries=["dl"],
                           optional=True)] if LINUX else [],
    cmdclass={"build_ext": BuildBindGuard, "bdist_wheel": PlatformWheel},
)
