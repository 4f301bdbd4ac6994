"""The optional C extension ``storage._native``; everything else is in pyproject.toml.

``optional=True``: when the extension does not build (no C compiler, no Python headers)
setuptools prints a warning and the install goes on without it, and Tidelog runs the
pure-Python codec (``storage.native``). ``make venv`` / ``pip install -e .`` build it in
place with the image's compiler; ``make native`` rebuilds it after an edit.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tidelog.storage._native",
            sources=["storage/_native.c"],
            extra_compile_args=[
                "-O2",
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Wno-missing-field-initializers",
            ],
            optional=True,
        )
    ]
)
