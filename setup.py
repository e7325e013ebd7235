"""Build: compile the simulator's hot path with mypyc (see tierserve/_native.py for why and what).

`TIERSERVE_PURE_PYTHON=1 pip install -e .` installs without compiling; the same sources then run as Python.
"""
import json
import os
import runpy

from setuptools import setup

native = runpy.run_path(os.path.join("tierserve", "_native.py"))


def compiled_extensions() -> list:
    if os.environ.get(native["PURE_ENV"], "") not in ("", "0"):
        return []
    from mypyc.build import mypycify

    # The record the import-time check compares against: the sources exactly as they are compiled now.
    with open(native["BUILD_RECORD"], "w") as record:
        json.dump(native["build_record"](), record, indent=1, sort_keys=True)
    # Only the compiled modules must type-check; the rest of the package is read for its types, not checked.
    options = ["--follow-imports=silent", "--ignore-missing-imports"]
    return mypycify(options + list(native["COMPILED_SOURCES"]), opt_level="3", group_name="tierserve_native")


setup(ext_modules=compiled_extensions())
