"""Package layout: `icmltools/` is the library, `commands/` is installed as `icmltools.commands`.

The mapping lives here (not in pyproject.toml) so that subpackages added later are found
automatically for both editable and normal installs.
"""
from setuptools import find_packages, setup

lib = find_packages(include=["icmltools", "icmltools.*"])
cmd = ["icmltools.commands"] + ["icmltools.commands." + p for p in find_packages("commands")]

setup(
    packages=lib + cmd,
    package_dir={"icmltools": "icmltools", "icmltools.commands": "commands"},
    package_data={"icmltools": ["**/*.json", "**/*.csv", "**/*.txt", "**/*.npz"]},
    include_package_data=True,
)
