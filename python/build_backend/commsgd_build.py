"""PEP 517 build backend for commsgd_torch: CMake builds the extension, the standard library writes the wheel.

    pip install --no-build-isolation ./python

build_wheel configures CMake on the repository root (python/'s parent: pip builds a local directory in place,
so ../include, ../cmake and ../CMakeLists.txt are there), with tests, benchmarks, examples, MPI and the
install rules off, the running interpreter as COMMSGD_TORCH_PYTHON and torch's CMake files
(torch.utils.cmake_prefix_path) and pip's pybind11 (when installed) on CMAKE_PREFIX_PATH; it builds the target
commsgd_torch_ext and zips commsgd_torch/*.py (from the source tree) and the compiled _C into a wheel for this
interpreter (cp311-cp311-linux_x86_64 and the like).

CUDA is left to the project's own test (on where nvcc is found and works): there the target commsgd_torch_cuda
(_cuda, the device step of TopKState's CUDA buckets) is built too and goes into the wheel. It is optional: a
failure to build it is reported and the wheel is written without it (CUDA buckets then raise Unsupported);
COMMSGD_CMAKE_ARGS=-DCOMMSGD_ENABLE_CUDA=OFF skips it.

The build directory: COMMSGD_BUILD_DIR (or --config-settings build-dir=DIR) names one to use and keep. An
empty or missing one is configured as above; one that is already configured (a developer's build/dev, the
test's build tree) is reused as it is configured -- its cache is never changed -- and only commsgd_torch_ext
(and commsgd_torch_cuda where the tree has CUDA on) is brought up to date, after checking that it was configured from this source tree, for this interpreter's
extension suffix and for the installed torch's version. Without it, a fresh temporary directory is used and
removed afterwards.

Other knobs: COMMSGD_CMAKE_ARGS (or --config-settings cmake-args="...") adds arguments to a fresh configure;
COMMSGD_BUILD_TYPE (or build-type=...) sets CMAKE_BUILD_TYPE of a fresh configure (default Release);
CMAKE_BUILD_PARALLEL_LEVEL and CMAKE_GENERATOR are CMake's own (Ninja is used when found and none is named).

build_editable installs a .pth that puts <build dir>/python on sys.path (a kept directory: COMMSGD_BUILD_DIR,
default <repo>/build/pip-editable); edits to the .py or .cpp files are picked up by
`cmake --build <build dir> --target commsgd_torch_ext`. build_sdist is not supported: the package needs the
repository's headers and CMake files around it.
"""
import base64
import csv
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

PACKAGE = "commsgd_torch"
DIST_NAME = "commsgd-torch"
DIST = "commsgd_torch"  # the distribution name as wheel and dist-info file names spell it
TARGET = "commsgd_torch_ext"
CUDA_TARGET = "commsgd_torch_cuda"
PYTHON_DIR = Path(__file__).resolve().parent.parent
ROOT = PYTHON_DIR.parent


class UnsupportedOperation(Exception):
    """PEP 517's way of saying an optional operation is not available (build_sdist here)."""


class BuildError(RuntimeError):
    pass


def _log(msg):
    print(f"commsgd_build: {msg}", file=sys.stderr, flush=True)


# --- what is built ------------------------------------------------------------------------------------------

def _check_root():
    if not (ROOT / "CMakeLists.txt").is_file() or not (ROOT / "include" / "commsgd").is_dir():
        raise BuildError(
            f"commsgd_build: {ROOT} is not the commsgd repository (no CMakeLists.txt and include/commsgd). "
            "The package is built from python/ inside a checkout of the repository; pip >= 21.3 builds a local "
            "directory in place, older pips copy it elsewhere first and lose the headers.")


def _version():
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(\s*commsgd\s+VERSION\s+([0-9][0-9.]*)", text)
    if not m:
        raise BuildError("commsgd_build: no project(commsgd VERSION x.y.z) in the top-level CMakeLists.txt")
    return m.group(1)


def _tag():
    """The wheel tag of the running interpreter, e.g. cp311-cp311-linux_x86_64."""
    impl = {"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, sys.implementation.name)
    ver = f"{sys.version_info.major}{sys.version_info.minor}"
    if impl == "cp":
        abi = f"cp{ver}{getattr(sys, 'abiflags', '')}"
    else:
        soabi = sysconfig.get_config_var("SOABI") or "none"
        abi = "_".join(soabi.split("-")[:2])
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_").replace(" ", "_")
    return f"{impl}{ver}-{abi}-{plat}"


def _ext_suffix():
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: {_version()}\n"
            "Summary: PyTorch DDP communication hooks backed by commsgd (communication-efficient data-parallel SGD)\n"
            "Requires-Python: >=3.9\nRequires-Dist: torch\n")


def _wheel_file():
    return f"Wheel-Version: 1.0\nGenerator: commsgd_build\nRoot-Is-Purelib: false\nTag: {_tag()}\n"


def _dist_info():
    return f"{DIST}-{_version()}.dist-info"


def _wheel_name():
    return f"{DIST}-{_version()}-{_tag()}.whl"


def _sources():
    files = sorted((PYTHON_DIR / PACKAGE).glob("*.py"))
    if not files:
        raise BuildError(f"commsgd_build: no {PACKAGE}/*.py under {PYTHON_DIR}")
    return files


# --- torch and CMake ----------------------------------------------------------------------------------------

def _torch():
    try:
        import torch
        import torch.utils
    except ImportError as e:
        raise BuildError(
            f"commsgd_build: torch is not importable by {sys.executable} ({e}). The extension is built against "
            "the installed torch: install torch first and pass --no-build-isolation to pip.") from None
    prefix = getattr(torch.utils, "cmake_prefix_path", None)
    return torch.__version__, (prefix if prefix and os.path.isdir(prefix) else None)


def _version_triple(v):
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", v or "")
    return tuple(int(x or 0) for x in m.groups()) if m else None


def _read_cache(build_dir):
    cache = {}
    with open(os.path.join(build_dir, "CMakeCache.txt"), errors="replace") as f:
        for line in f:
            m = re.match(r"([^#/][^:=]*):[A-Z]+=(.*)$", line.rstrip("\n"))
            if m:
                cache[m.group(1)] = m.group(2)
    return cache


def _run(cmd, **kw):
    _log("$ " + " ".join(shlex.quote(str(c)) for c in cmd))
    r = subprocess.run([str(c) for c in cmd], **kw)
    if r.returncode != 0:
        raise BuildError(f"commsgd_build: command failed with exit status {r.returncode}: {cmd[0]} ... "
                         "(its output is above; pip shows it with -v)")


def _setting(config_settings, key, env):
    if config_settings and config_settings.get(key):
        return config_settings[key]
    return os.environ.get(env) or None


def _configure(build_dir, cmake, config_settings):
    torch_version, torch_prefix = _torch()
    prefixes = [torch_prefix] if torch_prefix else []
    try:  # pip's pybind11 (Debian's pybind11-dev is found by CMake without help)
        import pybind11
        prefixes.append(pybind11.get_cmake_dir())
    except ImportError:
        pass
    if os.environ.get("CMAKE_PREFIX_PATH"):
        prefixes += os.environ["CMAKE_PREFIX_PATH"].split(os.pathsep)
    build_type = _setting(config_settings, "build-type", "COMMSGD_BUILD_TYPE") or "Release"
    args = [cmake, "-S", ROOT, "-B", build_dir,
            f"-DCMAKE_BUILD_TYPE={build_type}",
            f"-DCOMMSGD_TORCH_PYTHON={sys.executable}",
            "-DCOMMSGD_ENABLE_TORCH=ON",
            "-DCOMMSGD_BUILD_TESTS=OFF", "-DCOMMSGD_BUILD_BENCHMARKS=OFF", "-DCOMMSGD_BUILD_EXAMPLES=OFF",
            "-DCOMMSGD_INSTALL=OFF", "-DCOMMSGD_ENABLE_MPI=OFF"]
    if prefixes:
        args.append("-DCMAKE_PREFIX_PATH=" + ";".join(prefixes))
    if not os.environ.get("CMAKE_GENERATOR") and shutil.which("ninja"):
        args += ["-G", "Ninja"]
    extra = _setting(config_settings, "cmake-args", "COMMSGD_CMAKE_ARGS")
    if extra:
        args += shlex.split(extra)
    _log(f"configuring {build_dir} for {sys.executable} (torch {torch_version})")
    _run(args, stdout=sys.stderr)


def _check_reused(build_dir, cache):
    """A configured tree is reused only when what it built fits this interpreter and this torch."""
    home = cache.get("CMAKE_HOME_DIRECTORY")
    if home and os.path.realpath(home) != os.path.realpath(ROOT):
        raise BuildError(f"commsgd_build: {build_dir} was configured from {home}, not {ROOT}")
    suffix = cache.get("PYTHON_MODULE_EXTENSION")
    if suffix and suffix != _ext_suffix():
        raise BuildError(f"commsgd_build: {build_dir} builds extensions named *{suffix}, this interpreter "
                         f"({sys.executable}) loads *{_ext_suffix()}: use another build directory")
    torch_version, _ = _torch()
    torch_dir = cache.get("Torch_DIR")
    version_file = os.path.join(torch_dir, "TorchConfigVersion.cmake") if torch_dir else None
    if version_file and os.path.isfile(version_file):
        m = re.search(r'PACKAGE_VERSION\s+"([^"]+)"', Path(version_file).read_text())
        built = m.group(1) if m else None
        if built and _version_triple(built) != _version_triple(torch_version):
            raise BuildError(f"commsgd_build: {build_dir} builds against torch {built} ({torch_dir}), "
                             f"{sys.executable} imports torch {torch_version}: use another build directory")
    _log(f"reusing the configured build tree {build_dir} (its settings are kept; torch {torch_version})")


def _build(build_dir, config_settings):
    """Configures build_dir when it is not configured yet, builds commsgd_torch_ext (and commsgd_torch_cuda
    where CUDA is on); returns the extension files (_C, and _cuda when built)."""
    _check_root()
    os.makedirs(build_dir, exist_ok=True)
    cache_file = os.path.join(build_dir, "CMakeCache.txt")
    reused = os.path.isfile(cache_file)
    if reused:
        cache = _read_cache(build_dir)
        cmake = cache.get("CMAKE_COMMAND") or shutil.which("cmake")
        _check_reused(build_dir, cache)
    else:
        cmake = shutil.which("cmake")
        if not cmake:
            raise BuildError("commsgd_build: cmake not found on PATH")
        _configure(build_dir, cmake, config_settings)
    # --config matters to multi-config generators only: Release (or build-type) for a fresh tree, and for a
    # reused one only when asked for.
    config = _setting(config_settings, "build-type", "COMMSGD_BUILD_TYPE") or (None if reused else "Release")
    try:
        _run([cmake, "--build", build_dir, "--target", TARGET] + (["--config", config] if config else []),
             stdout=sys.stderr)
    except BuildError as e:
        raise BuildError(f"{e}. If CMake reports no rule or target {TARGET}, the configure step did not find "
                         "LibTorch, pybind11 or this interpreter with torch (its output says which): see "
                         "docs/pytorch.md, Install.") from None
    suffix = _ext_suffix()
    found = [p for p in Path(build_dir, "python", PACKAGE).rglob("_C*") if p.name == "_C" + suffix]
    if not found:
        raise BuildError(f"commsgd_build: built {TARGET} but found no _C{suffix} under {build_dir}/python")
    built = [max(found, key=lambda p: p.stat().st_mtime)]
    if _read_cache(build_dir).get("COMMSGD_ENABLE_CUDA", "").upper() in ("ON", "TRUE", "1", "YES"):
        try:
            _run([cmake, "--build", build_dir, "--target", CUDA_TARGET] + (["--config", config] if config else []),
                 stdout=sys.stderr)
            cuda = Path(build_dir, "python", PACKAGE, "_cuda" + suffix)
            if cuda.is_file():
                built.append(cuda)
        except BuildError as e:
            _log(f"{e}: the package is built without _cuda, so CUDA buckets of TopKState raise Unsupported")
    return built


# --- wheels -------------------------------------------------------------------------------------------------

def _hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_wheel(wheel_directory, files):
    """files: (archive name, bytes, executable) in order; adds the dist-info and its RECORD."""
    dist_info = _dist_info()
    files = list(files) + [(f"{dist_info}/METADATA", _metadata().encode(), False),
                           (f"{dist_info}/WHEEL", _wheel_file().encode(), False),
                           (f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode(), False)]
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data, _ in files:
        writer.writerow([name, _hash(data), len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    files.append((f"{dist_info}/RECORD", record.getvalue().encode(), False))
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    date_time = time.gmtime(max(epoch, 315532800))[:6]  # zip cannot say before 1980
    os.makedirs(wheel_directory, exist_ok=True)
    path = os.path.join(wheel_directory, _wheel_name())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, executable in files:
            info = zipfile.ZipInfo(name, date_time)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            z.writestr(info, data)
    _log(f"wrote {path}")
    return os.path.basename(path)


def _write_metadata(metadata_directory):
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    Path(d, "METADATA").write_text(_metadata())
    Path(d, "WHEEL").write_text(_wheel_file())
    return _dist_info()


# --- PEP 517 / 660 hooks ------------------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []  # cmake, a compiler, torch and pybind11 come from the environment (--no-build-isolation)


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_metadata(metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _write_metadata(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build_dir = _setting(config_settings, "build-dir", "COMMSGD_BUILD_DIR")
    if build_dir:
        return _wheel_from(os.path.abspath(build_dir), wheel_directory, config_settings)
    with tempfile.TemporaryDirectory(prefix="commsgd-build-") as tmp:
        return _wheel_from(tmp, wheel_directory, config_settings)


def _wheel_from(build_dir, wheel_directory, config_settings):
    files = [(f"{PACKAGE}/{src.name}", src.read_bytes(), False) for src in _sources()]
    for ext in _build(build_dir, config_settings):
        files.append((f"{PACKAGE}/{ext.name}", ext.read_bytes(), True))
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    build_dir = os.path.abspath(_setting(config_settings, "build-dir", "COMMSGD_BUILD_DIR")
                                or ROOT / "build" / "pip-editable")
    _build(build_dir, config_settings)
    pth = (os.path.join(build_dir, "python") + "\n").encode()
    return _write_wheel(wheel_directory, [(f"{DIST}_editable.pth", pth, False)])


def build_sdist(sdist_directory, config_settings=None):
    raise UnsupportedOperation("commsgd_torch has no sdist: it is built from python/ inside the repository "
                               "(pip install --no-build-isolation ./python)")
