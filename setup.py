"""The build parts pyproject.toml cannot say: the C extension and the migrations package.

The extensions (pg2sink/changelog/_avro_native.c, the Kafka sink's Avro encoder, and
_rows_native.c, the changelog's new-row reader, both including _native.h) are optional:
without a C compiler the build skips them and pg2sink runs on the Python path
(changelog/_cmodule.py).

The SQL migrations stay in migrations/ at the top of the repository (yoyo reads that
directory in a checkout and an editable install); a wheel carries them as the data-only
package pg2sink._migrations (its files: package-data in pyproject.toml), where
pg2sink/imports/migrate.py finds them in an installed copy. tests/test_packaging.py
checks that a wheel holds every migrations/*.sql.
"""

from setuptools import Extension, find_packages, setup

setup(
    packages=[*find_packages(include=["pg2sink", "pg2sink.*"]), "pg2sink._migrations"],
    package_dir={"pg2sink._migrations": "migrations"},
    ext_modules=[
        Extension(
            "pg2sink.changelog._avro_native",
            ["pg2sink/changelog/_avro_native.c"],
            depends=["pg2sink/changelog/_native.h"],
            optional=True,
        ),
        Extension(
            "pg2sink.changelog._rows_native",
            ["pg2sink/changelog/_rows_native.c"],
            depends=["pg2sink/changelog/_native.h"],
            optional=True,
        ),
    ],
)
