"""The optional C extensions ``storage._native`` and ``client.cdc._pgnative``; everything
else is in pyproject.toml.

``optional=True``: when the extension does not build (no C compiler, no Python headers)
setuptools prints a warning and the install goes on without it, and Tidelog runs the
pure-Python codec (``storage.native``). ``make venv`` / ``pip install -e .`` build it in
place with the image's compiler; ``make native`` rebuilds it after an edit.
"""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"]

setup(
    ext_modules=[
        Extension(
            "tidelog.storage._native",
            sources=["storage/_native.c"],
            extra_compile_args=_FLAGS,
            optional=True,
        ),
        # The CDC connector's pgoutput-to-records path (client.cdc.events is the reference
        # and the fallback, exactly as above).
        Extension(
            "tidelog.client.cdc._pgnative",
            sources=["client/cdc/_pgnative.c"],
            extra_compile_args=_FLAGS,
            optional=True,
        ),
    ]
)
