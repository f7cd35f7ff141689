"""Build steps of the package:

- the native extension module psd._ext (ext/psdext.c: the step calls in C, see
  psd/_calls.py), built with the Python headers of the interpreter that installs
  (Debian: python3-dev) and a C compiler; optional: where it does not build, pip says so and
  installs the package without it, which then calls libpsclient through ctypes;
- bundling libpsclient: with PSD_BUNDLE_LIBRARY=/path/to/libpsclient.so set,
  `pip install client/python` copies that file into the package (as psd/libpsclient.so.0),
  where psd finds it before pkg-config and the system loader. Without it the package finds
  the library at run time (PSD_LIBRARY, pkg-config, the system loader)."""

import os
import shutil

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# the library's header when building in the source tree (client/psclient.h): the extension
# then uses its types; elsewhere it declares the same layout itself
_header_dir = os.path.dirname(HERE)
_include = [_header_dir] if os.path.isfile(os.path.join(_header_dir, "psclient.h")) else []


class BuildPyBundling(build_py):
    def run(self) -> None:
        super().run()
        src = os.environ.get("PSD_BUNDLE_LIBRARY")
        if not src:
            return
        if not os.path.isabs(src):
            # pip runs this in the package's directory (or a copy), not where it was started
            raise SystemExit(f"PSD_BUNDLE_LIBRARY={src}: give an absolute path, e.g. "
                             f"PSD_BUNDLE_LIBRARY=$PWD/{src}")
        if not os.path.isfile(src):
            raise SystemExit(f"PSD_BUNDLE_LIBRARY={src}: no such file")
        dst_dir = os.path.join(self.build_lib, "psd")
        os.makedirs(dst_dir, exist_ok=True)
        # copy the file itself (a symlink such as build/client/libpsclient.so is followed)
        shutil.copyfile(src, os.path.join(dst_dir, "libpsclient.so.0"))


setup(cmdclass={"build_py": BuildPyBundling},
      ext_modules=[Extension("psd._ext", sources=["ext/psdext.c"], include_dirs=_include,
                             extra_compile_args=["-std=c11"], optional=True)])
