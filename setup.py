"""Build: compile the simulator's hot path with mypyc (see tierserve/_native.py for why and what).

`TIERSERVE_PURE_PYTHON=1 pip install -e .` installs without compiling; the same sources then run as Python.
"""
import json
import os
import runpy

import warnings

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError, PlatformError

native = runpy.run_path(os.path.join("tierserve", "_native.py"))
RECORD = native["BUILD_RECORD"]
# The digests of the sources exactly as mypyc reads them below; written only once the extensions are built.
sources_compiled = native["build_record"]()


class BuildExtThenRecord(build_ext):
    """Remove the build record while extensions change (a process importing meanwhile runs the sources), and
    write it only after every extension is built: an interrupted build never looks complete."""

    def run(self) -> None:
        if os.path.exists(RECORD):
            os.remove(RECORD)
        try:
            super().run()
        except (CCompilerError, CompileError, ExecError, LinkError, PlatformError) as err:
            # No C compiler or Python headers: install the sources alone (the same code, ~3x slower loop).
            for built in self.get_outputs():
                if os.path.exists(built):
                    os.remove(built)
            warnings.warn(f"tierserve: compiling the hot path failed ({err}); installing pure Python")
            return
        if not self.extensions:
            return
        targets = [RECORD] + ([] if self.inplace else [os.path.join(self.build_lib, RECORD)])
        for target in targets:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w") as record:
                json.dump(sources_compiled, record, indent=1, sort_keys=True)


def compiled_extensions() -> list:
    if os.environ.get(native["PURE_ENV"], "") not in ("", "0"):
        return []
    from mypyc.build import mypycify

    # Only the compiled modules must type-check; the rest of the package is read for its types, not checked.
    options = ["--follow-imports=silent", "--ignore-missing-imports"]
    return mypycify(options + list(native["COMPILED_SOURCES"]), opt_level="3", group_name="tierserve_native")


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": BuildExtThenRecord})
