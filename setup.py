"""The build of pg2sink's C extension; everything else is in pyproject.toml.

The extension (pg2sink/changelog/_avro_native.c, the Kafka sink's Avro encoder) is
optional: without a C compiler the build skips it and pg2sink runs on the Python path.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pg2sink.changelog._avro_native",
            ["pg2sink/changelog/_avro_native.c"],
            optional=True,
        )
    ]
)
