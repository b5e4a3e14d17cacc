"""A PEP 517 build backend with no dependencies, so `pip install DIR` of an exported
package needs no network (setuptools would have to be fetched into pip's isolated build
environment). It builds a pure-Python wheel of the one package folder named in
pyproject.toml: the runtime sources, the cubins and the manifest. The C++ launcher is
compiled on the user's machine at first import, against the torch found there.
"""
import base64
import hashlib
import os
import re
import zipfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _project():
    """(name, version) from pyproject.toml's [project] table."""
    text = open(os.path.join(_ROOT, "pyproject.toml"), encoding="utf-8").read()
    try:
        import tomllib  # Python >= 3.11

        project = tomllib.loads(text)["project"]
        return project["name"], project["version"]
    except ImportError:  # 3.9/3.10: the two keys this file is written with
        section = text.split("[project]", 1)[1]
        get = lambda key: re.search(rf'^{key}\s*=\s*"([^"]+)"', section, re.M).group(1)  # noqa: E731
        return get("name"), get("version")


def _metadata(name, version):
    return (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            "Summary: Attention kernels tuned by optimizerd, as a torch custom op\n"
            "Requires-Python: >=3.9\nRequires-Dist: torch>=2.4\nRequires-Dist: jinja2\n")


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    name, version = _project()
    info = f"{name}-{version}.dist-info"
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata(name, version))
    return info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name, version = _project()
    package = os.path.join(_ROOT, name)
    if not os.path.isdir(package):
        raise RuntimeError(f"pyproject.toml names the package {name!r}, but {package} is not a folder")
    info = f"{name}-{version}.dist-info"
    wheel_name = f"{name}-{version}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as whl:
        def add(arcname, data):
            whl.writestr(arcname, data)
            records.append(_record_line(arcname, data))

        for folder, dirs, files in os.walk(package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for file in sorted(files):
                path = os.path.join(folder, file)
                arcname = os.path.relpath(path, _ROOT).replace(os.sep, "/")
                with open(path, "rb") as f:
                    add(arcname, f.read())
        add(f"{info}/METADATA", _metadata(name, version).encode())
        add(f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: optimizerd\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        record = f"{info}/RECORD"
        whl.writestr(record, "\n".join(records + [f"{record},,"]) + "\n")
    return wheel_name


def build_sdist(sdist_directory, config_settings=None):
    import tarfile

    name, version = _project()
    base = f"{name}-{version}"
    path = os.path.join(sdist_directory, f"{base}.tar.gz")
    with tarfile.open(path, "w:gz") as tar:
        for entry in ("pyproject.toml", "_optd_build", name):
            tar.add(os.path.join(_ROOT, entry), arcname=f"{base}/{entry}",
                    filter=lambda t: None if "__pycache__" in t.name else t)
    return os.path.basename(path)
