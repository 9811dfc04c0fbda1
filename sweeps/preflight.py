"""The start of a sweep job: is this node's environment the one the profile's runs need?

``python -m scalegnn.sweeps.preflight --device rocm --net-plugin librccl-net.so`` runs
once per job, in the batch script after the profile's set-up lines and before the ranks
start (:func:`command` writes that line for the GPU profiles). It imports neither torch
(it reads ``torch/version.py``) nor anything that touches a device, and checks:

- the torch build against the profile's ``device``: a ``rocm`` profile whose torch is not
  a ROCm build (``torch.version.hip`` is None), or a ``cuda`` one whose torch is not a CUDA
  build, cannot run (an error);
- that build against the ROCm / CUDA the set-up loaded (``ROCM_PATH`` and its
  ``.info/version``, else a ``rocm/X.Y.Z`` module in ``LOADEDMODULES``; ``CUDA_HOME`` /
  ``CUDA_PATH`` / ``CUDATOOLKIT_HOME`` and its ``version.json``, else a ``cudatoolkit/X.Y``
  or ``cuda/X.Y`` module): the ROCm major.minor, the CUDA major (CUDA keeps the minor
  versions of one major compatible);
- the network plugin the profile names (``net_plugin``: ``librccl-net.so`` of aws-ofi-rccl,
  ``libnccl-net.so`` of aws-ofi-nccl) in a folder of ``LD_LIBRARY_PATH`` (or where
  ``NCCL_NET_PLUGIN`` points), and the ROCm version its path names (``.../rocm-6.2.1/...``)
  against torch's. Without it NCCL / RCCL falls back to TCP sockets (a warning: slow across
  nodes), unless ``NCCL_NET`` asks for a plugin network by name (Perlmutter's ``AWS
  Libfabric``), when NCCL cannot start (an error);
- that the python running is ``$SCALEGNN_VENV``'s (the profile's ``python``).

One line per finding, naming what and the fix; an ``error`` makes it exit 1 (the batch
script then stops before ``srun`` / ``flux run``), a ``warning`` does not. With nothing to
report, one ``ok`` line says what it found.

:func:`prepare_node` is run by every task before it trains: it creates the node-local
MIOpen folders (``MIOPEN_USER_DB_PATH``, ``MIOPEN_CUSTOM_CACHE_DIR`` in ``/tmp``), which
OLCF's and LLNL's PyTorch guides create in the batch script, i.e. on its first node only.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Finding", "torch_build", "loaded_rocm", "loaded_cuda", "find_plugin", "check", "command", "prepare_node",
           "main", "MIOPEN_DIRS"]

PREFIX = "scalegnn preflight"
MIOPEN_DIRS = ("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR")  # node-local caches: created on every node
SYSTEM_LIB_DIRS = ("/usr/lib64", "/usr/lib", "/lib64", "/lib")  # after LD_LIBRARY_PATH, as the loader searches
BUILTIN_NETS = ("socket", "ib")  # NCCL_NET values NCCL serves without a plugin
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
_ROCM_IN_PATH = re.compile(r"rocm[-_/]?(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE)
_CUDA_IN_PATH = re.compile(r"cuda[-_/]?(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE)


@dataclass(frozen=True)
class Finding:
    level: str  # "error": the run cannot work; "warning": it can, worse than it should
    text: str  # what, and the fix

    def line(self) -> str:
        return f"{PREFIX}: {self.level}: {self.text}"


def _major_minor(text: str | None) -> str | None:
    m = _VERSION.match(text or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _major(text: str | None) -> str | None:
    mm = _major_minor(text)
    return mm.split(".")[0] if mm else None


# ---------------------------------------------------------------------------- what is installed and loaded
def torch_build(find_spec=importlib.util.find_spec) -> dict | None:
    """``{"version", "cuda", "hip", "path"}`` of the torch this python would import, read
    from its ``torch/version.py`` (finding the package runs none of its code); None
    when there is no torch. A value the file does not set is None."""
    spec = find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    found = {"__version__": None, "cuda": None, "hip": None}
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        tree = ast.Module(body=[], type_ignores=[])
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in found and isinstance(value, ast.Constant):
            found[target.id] = value.value
    return {"version": found["__version__"], "cuda": found["cuda"], "hip": found["hip"], "path": str(path)}


def _modules(environ) -> list[str]:
    """The loaded environment modules (Lmod / Environment Modules: ``LOADEDMODULES``)."""
    return [m for m in environ.get("LOADEDMODULES", "").split(":") if m]


def _module_version(environ, names: tuple[str, ...]) -> tuple[str, str] | None:
    for module in _modules(environ):
        name, _, version = module.partition("/")
        if name in names and _major_minor(version):
            return version, f"module {module}"
    return None


def loaded_rocm(environ) -> tuple[str, str] | None:
    """(version, where it was read) of the ROCm the job loaded: ``$ROCM_PATH/.info/version``,
    else the version in ``ROCM_PATH``'s name (``/opt/rocm-6.2.4``), else a ``rocm/X.Y.Z``
    (or ``amd-mixed/X.Y.Z``) module; None when none is loaded."""
    root = environ.get("ROCM_PATH") or environ.get("ROCM_HOME")
    if root:
        try:
            text = (Path(root) / ".info" / "version").read_text().strip()
            if _major_minor(text):
                return _VERSION.match(text).group(0), f"ROCM_PATH={root}"
        except OSError:
            pass
        m = _ROCM_IN_PATH.search(root)
        if m:
            return m.group(1), f"ROCM_PATH={root}"
    return _module_version(environ, ("rocm", "amd-mixed"))


def loaded_cuda(environ) -> tuple[str, str] | None:
    """(version, where it was read) of the CUDA toolkit the job loaded: ``version.json``
    (``version.txt`` before CUDA 11.1) of ``CUDA_HOME`` / ``CUDA_PATH`` /
    ``CUDATOOLKIT_HOME``, else the version in that folder's name, else a
    ``cudatoolkit/X.Y`` or ``cuda/X.Y`` module; None when none is loaded."""
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDATOOLKIT_HOME"):
        root = environ.get(var)
        if not root:
            continue
        try:
            version = json.loads((Path(root) / "version.json").read_text())["cuda"]["version"]
            if _major_minor(version):
                return version, f"{var}={root}"
        except (OSError, ValueError, KeyError, TypeError):
            pass
        try:
            m = re.search(r"CUDA Version (\S+)", (Path(root) / "version.txt").read_text())
            if m and _major_minor(m.group(1)):
                return m.group(1), f"{var}={root}"
        except OSError:
            pass
        m = _CUDA_IN_PATH.search(root)
        if m:
            return m.group(1), f"{var}={root}"
    return _module_version(environ, ("cudatoolkit", "cuda"))


def find_plugin(names, environ) -> tuple[str | None, list[str]]:
    """(the first file of ``names`` found, the folders searched): the file
    ``NCCL_NET_PLUGIN`` names when it is a path, else ``libnccl-net-<v>.so`` /
    ``librccl-net-<v>.so`` for ``NCCL_NET_PLUGIN=<v>`` and ``names``, in the folders of
    ``LD_LIBRARY_PATH`` and then the system's, as the dynamic loader looks."""
    chosen = environ.get("NCCL_NET_PLUGIN", "")
    if "/" in chosen:
        return (chosen if Path(chosen).is_file() else None), [str(Path(chosen).parent)]
    names = ([f"libnccl-net-{chosen}.so", f"librccl-net-{chosen}.so"] if chosen else []) + list(names)
    folders = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(SYSTEM_LIB_DIRS)
    for folder in folders:
        for name in names:
            path = Path(folder) / name
            if path.is_file():
                return str(path), folders
    return None, folders


# ---------------------------------------------------------------------------- the check
def check(device: str, net_plugin=(), environ=None, torch=None, prefix: str | None = None,
          executable: str | None = None) -> tuple[list[Finding], str]:
    """The findings for a job on ``device`` (``cuda``, ``rocm``, ``cpu``) that needs the
    network plugin ``net_plugin`` (file names, any one), and a summary of what was found.
    ``environ``, ``torch`` (:func:`torch_build`'s dict, or ``"absent"``), ``prefix`` and
    ``executable`` default to this process's."""
    environ = os.environ if environ is None else environ
    torch = torch_build() if torch is None else (None if torch == "absent" else torch)
    prefix = sys.prefix if prefix is None else prefix
    executable = sys.executable if executable is None else executable
    findings: list[Finding] = []
    seen: list[str] = []

    venv = environ.get("SCALEGNN_VENV")
    if venv and os.path.realpath(prefix) != os.path.realpath(venv):
        findings.append(Finding("warning", f"python {executable} runs from {prefix}, not from $SCALEGNN_VENV ({venv}): "
                                "the ranks would import another scalegnn and torch than the venv's; leave the "
                                "profile's python (\"${SCALEGNN_VENV}/bin/python\") or pass --python with the "
                                "venv's"))
    seen.append(f"python {prefix}")

    if torch is None:
        findings.append(Finding("error", f"no torch for python {executable} ({prefix}): install the site's torch build "
                                "into $SCALEGNN_VENV (docs/sites.md)"))
        return findings, "; ".join(seen)
    version = torch.get("version") or "?"
    if device == "rocm":
        loaded = loaded_rocm(environ)
        want = _major_minor(torch.get("hip"))
        if want is None:
            built = f"a CUDA {torch['cuda']} build" if torch.get("cuda") else "a CPU build"
            wheel = _major_minor(loaded[0]) if loaded else "X.Y"
            findings.append(Finding("error", f"torch {version} ({torch.get('path')}) is {built}, not a ROCm build, and "
                                    f"this profile runs on ROCm: install the ROCm wheel into $SCALEGNN_VENV (pip "
                                    f"install torch --index-url https://download.pytorch.org/whl/rocm{wheel})"))
        elif loaded is None:
            findings.append(Finding("warning", f"no ROCm is loaded (no ROCM_PATH, no rocm/X.Y.Z module) and torch "
                                    f"{version} is built for ROCm {want}: RCCL's network plugin needs ROCm's "
                                    f"libraries; load a rocm/{want}.* module in the profile's setup"))
        elif _major_minor(loaded[0]) != want:
            have = _major_minor(loaded[0])
            findings.append(Finding("warning", f"ROCm {loaded[0]} is loaded ({loaded[1]}) but torch {version} is built "
                                    f"for ROCm {want} (torch.version.hip {torch['hip']}): load a rocm/{want}.* module "
                                    f"in the profile's setup, or install the torch wheel for ROCm {have} (--index-url "
                                    f"https://download.pytorch.org/whl/rocm{have})"))
        if want:
            seen.append(f"torch {version} (ROCm {want})" + (f" with ROCm {loaded[0]} ({loaded[1]})" if loaded else ""))
    elif device == "cuda":
        loaded = loaded_cuda(environ)
        want = _major_minor(torch.get("cuda"))
        if want is None:
            built = f"a ROCm {_major_minor(torch['hip'])} build" if torch.get("hip") else "a CPU build"
            findings.append(Finding("error", f"torch {version} ({torch.get('path')}) is {built}, not a CUDA build, and "
                                    f"this profile runs on CUDA: use the site's CUDA torch (Perlmutter: the venv on "
                                    f"top of `module load pytorch`, --system-site-packages)"))
        elif loaded is None:
            findings.append(Finding("warning", f"no CUDA toolkit is loaded (no CUDA_HOME, no cudatoolkit/X.Y module) "
                                    f"and torch {version} is built for CUDA {want}: NCCL's network plugin needs "
                                    f"CUDA's libraries; load a cudatoolkit/{want} module in the profile's setup"))
        elif _major(loaded[0]) != _major(want):
            findings.append(Finding("warning", f"CUDA {loaded[0]} is loaded ({loaded[1]}) but torch {version} is built "
                                    f"for CUDA {want}: NCCL's plugin and libraries of CUDA {_major(loaded[0])} do not "
                                    f"load into a CUDA {_major(want)} torch; load a cudatoolkit/{want} module in the "
                                    f"profile's setup, or the torch built for CUDA {_major_minor(loaded[0])}"))
        if want:
            seen.append(f"torch {version} (CUDA {want})" + (f" with CUDA {loaded[0]} ({loaded[1]})" if loaded else ""))

    if net_plugin:
        path, folders = find_plugin(net_plugin, environ)
        net = environ.get("NCCL_NET", "")
        if path is None:
            names = " / ".join(net_plugin)
            where = f"in LD_LIBRARY_PATH ({environ.get('LD_LIBRARY_PATH') or 'empty'}) or {', '.join(SYSTEM_LIB_DIRS)}"
            fix = ("export AWS_OFI_RCCL_LIB=<the plugin's lib folder> (the profile's setup puts it on LD_LIBRARY_PATH)"
                   if device == "rocm" else "load the module that provides it (Perlmutter: the pytorch module's nccl)")
            if environ.get("NCCL_NET_PLUGIN", "").lower() == "none":
                findings.append(Finding("warning", "NCCL_NET_PLUGIN=none turns the network plugin off: collectives "
                                        "across nodes use TCP sockets; unset it"))
            elif net and net.lower() not in BUILTIN_NETS:
                findings.append(Finding("error", f"NCCL_NET={net!r} asks for the network plugin but no {names} is "
                                        f"{where}: NCCL cannot start; {fix}"))
            else:
                findings.append(Finding("warning", f"no {names} {where}: collectives across nodes fall back to TCP "
                                        f"sockets, several times slower; {fix}"))
        else:
            seen.append(f"network plugin {path}")
            built = _ROCM_IN_PATH.search(path)
            want = _major_minor(torch.get("hip"))
            if device == "rocm" and built and want and _major_minor(built.group(1)) != want:
                findings.append(Finding("warning", f"the network plugin {path} is built for ROCm {built.group(1)} but "
                                        f"torch {version} for ROCm {want}: use the plugin's build for ROCm {want} "
                                        "(AWS_OFI_RCCL_LIB)"))
    return findings, "; ".join(seen)


# ---------------------------------------------------------------------------- the batch script and the node
def command(profile, python: str) -> list[str]:
    """The batch-script lines that run the check (after the set-up lines): none for a
    CPU profile. ``|| exit 1``: an error stops the job before its ranks start."""
    if profile.device not in ("cuda", "rocm"):
        return []
    args = ["--device", profile.device]
    for lib in profile.net_plugin:
        args += ["--net-plugin", lib]
    return ["# start-of-job check: torch build vs the loaded ROCm/CUDA, the network plugin, the python "
            "(sweeps/preflight.py)",
            f"{python} -m scalegnn.sweeps.preflight {shlex.join(args)} || exit 1"]


def prepare_node(environ=None) -> list[str]:
    """Create the node-local folders the job's libraries write to (MIOpen's user database
    and kernel cache, :data:`MIOPEN_DIRS`, when set); every task does it before training,
    so every node of a job has them. Returns the folders; one that cannot be created is
    reported on stderr (MIOpen then fails on its first convolution, not here)."""
    environ = os.environ if environ is None else environ
    made = []
    for var in MIOPEN_DIRS:
        folder = environ.get(var)
        if not folder:
            continue
        try:
            os.makedirs(folder, exist_ok=True)
            made.append(folder)
        except OSError as exc:
            print(f"{PREFIX}: warning: cannot create {var}={folder} ({exc.strerror}); point {var} at a writable "
                  "node-local folder in the profile's [env]", file=sys.stderr)
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalegnn.sweeps.preflight",
                                     description="Check a job's environment against the torch build and the profile")
    parser.add_argument("--device", choices=("cuda", "rocm", "cpu"), required=True)
    parser.add_argument("--net-plugin", action="append", default=[],
                        help="the network plugin's library file name (repeatable: any one of them)")
    args = parser.parse_args(argv)
    findings, seen = check(args.device, tuple(args.net_plugin))
    for finding in findings:
        print(finding.line(), file=sys.stderr, flush=True)
    if not findings:
        print(f"{PREFIX}: ok: {seen}", flush=True)
    return 1 if any(f.level == "error" for f in findings) else 0


if __name__ == "__main__":
    sys.exit(main())
