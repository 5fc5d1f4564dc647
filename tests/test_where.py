"""Where a run ran: the machine's identity as its tools print it, the machines of a run on its cards, pairs split
across machines left out, the machine taken out of the test, and a resume on another machine refused.

The vendor tools' command lines are pinned here (no NVIDIA or AMD GPU on this machine); their outputs below are
in the shapes nvidia-smi (CSV, ``noheader,nounits``) and amd-smi (``static --json``) print.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from rich.console import Console

from suite.analysis import load_run
from suite.errors import SuiteError
from suite.matrix_load import parse_matrix
from suite.records import GpuIdentity, HostIdentity, Stretch
from suite.report import render_markdown
from suite.run_facts import machines
from suite.runner import check_resume_host
from suite.runtime import identity
from suite.store import RunStore
from tests.test_report import MATRIX, card_of, make_run

H100_CSV = ("0, GPU-5f3c9a1e-0d2b-4c1e-9a7f-1b2c3d4e5f60, 00000000:18:00.0, 570.133.20, 700.00, 1980, 1755, "
            "NVIDIA H100 80GB HBM3\n")
NVIDIA_SMI_HEADER = ("+-----------------------------------------------------------------------------------------+\n"
                     "| NVIDIA-SMI 570.133.20             Driver Version: 570.133.20     CUDA Version: 12.8     |\n")
AMD_STATIC_JSON = """[{"gpu": 0, "asic": {"market_name": "AMD Instinct MI355X", "vendor_id": "0x1002",
  "asic_serial": "0x5C3D6A1B2E4F7081", "oam_id": 0}, "bus": {"bdf": "0000:05:00.0", "max_pcie_width": 16},
  "driver": {"name": "amdgpu", "version": "6.12.12"}}]"""


def test_the_vendor_tools_are_asked_exactly_this():
    assert identity.NVIDIA_QUERY == ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,driver_version,power.limit,"
                                     "clocks.max.sm,clocks.sm,name", "--format=csv,noheader,nounits"]
    assert identity.AMD_STATIC == ["amd-smi", "static", "--asic", "--bus", "--driver", "--json"]
    assert identity.AMD_VERSION == ["amd-smi", "version", "--json"]


def test_nvidia_smi_lines_read_as_the_gpus_identity():
    (gpu,) = identity.nvidia_gpus(H100_CSV + "\n")
    assert gpu == GpuIdentity(index="0", name="NVIDIA H100 80GB HBM3", uuid="GPU-5f3c9a1e-0d2b-4c1e-9a7f-1b2c3d4e5f60",
                              pci_bus_id="00000000:18:00.0", driver="570.133.20", power_limit_w="700.00",
                              clocks_max_sm="1980", clocks_sm="1755")
    (odd,) = identity.nvidia_gpus("1, GPU-aa, 00000000:19:00.0, 570.1, [N/A], 1980, [N/A], Some GPU, rev 2\n")
    assert odd.power_limit_w is None and odd.clocks_sm is None and odd.name == "Some GPU, rev 2"
    m = identity.CUDA_VERSION.search(NVIDIA_SMI_HEADER)
    assert m and m[1] == "12.8"
    assert identity.CUDA_VERSION.search("CUDA Version                   : 13.0\n")[1] == "13.0"  # --version's form


def test_amd_smi_json_reads_as_the_gpus_identity_in_both_its_shapes():
    (gpu,) = identity.amd_gpus(AMD_STATIC_JSON)
    assert gpu == GpuIdentity(index="0", name="AMD Instinct MI355X", uuid="0x5C3D6A1B2E4F7081",
                              pci_bus_id="0000:05:00.0", driver="6.12.12")
    assert identity.amd_gpus('{"gpu_data": ' + AMD_STATIC_JSON + "}") == [gpu]
    assert identity.amd_gpus("not json") == []
    assert identity.rocm_version('[{"tool": "AMDSMI Tool", "version": "26.2.1", "rocm_version": "7.2.0"}]') == "7.2.0"
    assert identity.rocm_version('{"amdsmi_library_version": "26.2.1", "rocm_version": "N/A"}') is None


def test_this_machine_names_itself_and_its_key_stays():
    here = identity.host_identity()
    assert here.hostname == socket.gethostname()
    machine_id = Path("/etc/machine-id")
    if machine_id.is_file() and machine_id.read_text().strip():
        assert here.machine_id == machine_id.read_text().strip()
    assert here.kernel and here.cpu
    assert identity.host_identity().key == here.key
    assert identity.host_identity(image_id="sha256:abc").key == here.key  # an arm's image is not the machine


def test_machines_named_vm_are_told_apart_by_their_gpus_not_their_clocks():
    def h100(uuid: str, clock: str) -> HostIdentity:
        return HostIdentity(hostname="vm", machine_id="same-image",
                            gpus=[GpuIdentity(index="0", name="NVIDIA H100 80GB HBM3", uuid=uuid, clocks_sm=clock)])

    a, a_later, b = h100("GPU-aaaa1111", "1755"), h100("GPU-aaaa1111", "1980"), h100("GPU-bbbb2222", "1755")
    assert a.key == a_later.key != b.key
    assert a.label() == "vm · 1 × NVIDIA H100 80GB HBM3 (GPU-aaaa1111)"
    assert HostIdentity(hostname="laptop").label() == "laptop"


# ------------------------------------------------------------------------------------- a run on two machines

A = HostIdentity(hostname="gpu-a", machine_id="aaaa", gpus=[GpuIdentity(name="NVIDIA H100 80GB HBM3", uuid="GPU-a1")])
B = HostIdentity(hostname="gpu-b", machine_id="bbbb", gpus=[GpuIdentity(name="NVIDIA H100 80GB HBM3", uuid="GPU-b2")])
# the change: +3 % on machine A, none on machine B (seed of this issue: the 2026-12-05 H100 run, -2.6 % at c1 on
# one machine and no gain on the other); B is 5 % slower than A for both arms
GAIN = {0: 1.030, 1: 1.032, 2: 1.028, 3: 1.001, 4: 0.999, 5: 1.000}


def two_machines(tmp_path: Path, split_round: int | None = None) -> Path:
    """ABBA, six rounds: rounds 0-2 on A, 3-5 on B; ``split_round``: that round's baseline on B, its change on A."""
    def values(arm: str, conc: int, r: int):
        t = 100.0 * (0.95 if r >= 3 else 1.0) * (GAIN[r] if arm == "patched" else 1.0)
        return t, 100.0 / t

    def where(arm: str, conc: int, r: int) -> HostIdentity:
        if r == split_round:
            return B if arm == "baseline" else A
        return A if r < 3 else B

    return make_run(tmp_path, values, order="abba", repeats=6, where=where)


def test_a_run_on_two_machines_names_both_and_takes_the_machine_out(tmp_path):
    run = load_run(two_machines(tmp_path))
    assert [(m.name, m.rounds) for m in machines(run)] == [
        ("gpu-a · 1 × NVIDIA H100 80GB HBM3 (GPU-a1)", (0, 1, 2)), ("gpu-b · 1 × NVIDIA H100 80GB HBM3 (GPU-b2)", (3, 4, 5))]
    (s,) = run.summaries
    c = s.evaluation.composite
    # the mean of the machines' means (+3.0 % and 0.0 %), not of the rounds; the spread within machines, 6 - 2 df
    assert c.estimate_pct == pytest.approx(1.5, abs=0.05)
    assert c.df == 4 and "within 2 machines" in c.variance
    text = render_markdown(run)
    card = card_of(text)
    assert ("**ran on 2 machines**: gpu-a · 1 × NVIDIA H100 80GB HBM3 (GPU-a1) (rounds 0, 1, 2); gpu-b · 1 × NVIDIA "
            "H100 80GB HBM3 (GPU-b2) (rounds 3, 4, 5)") in card
    assert "the mean of the machines' means, the spread within machines" in card
    quality = text.split("## Data quality", 1)[1]
    assert "| warning | hosts | baseline |" in quality and "| warning | hosts | patched |" in quality


def test_a_round_whose_arms_ran_on_two_machines_is_not_paired(tmp_path):
    run = load_run(two_machines(tmp_path, split_round=5))
    (s,) = run.summaries
    c = s.evaluation.composite
    assert c.rounds == (0, 1, 2, 3, 4)  # round 5: baseline on B, the change on A
    assert c.estimate_pct == pytest.approx(1.5, abs=0.05)
    left = [f for f in run.findings if f.check == "other-host"]
    assert {(f.arm, f.round, f.severity) for f in left} == {("patched", 5, "unreliable")}
    assert left[0].message == ("round 5: ran on gpu-a · 1 × NVIDIA H100 80GB HBM3 (GPU-a1), the baseline's on gpu-b · "
                               "1 × NVIDIA H100 80GB HBM3 (GPU-b2): not paired (the machines' difference is not "
                               "the change's)")
    # the point's own cells pair the same way
    cell = s.cells[("isl64-osl16-c2-n8", "output_throughput")]
    assert cell.rounds == (0, 1, 2, 3, 4) and "within 2 machines" in cell.comparison.method


def test_one_machine_and_old_records_read_as_they_are(tmp_path):
    one = load_run(make_run(tmp_path / "one", lambda arm, c, r: (100.0, 1.0), where=lambda arm, c, r: A))
    assert "where it ran: gpu-a · 1 × NVIDIA H100 80GB HBM3 (GPU-a1)" in render_markdown(one)
    old = RunStore.open(make_run(tmp_path / "old", lambda arm, c, r: (100.0, 1.0)))
    old.update_manifest(stretches=[])
    old.begin_stretch(Stretch(started="2026-12-05T12:29:11+00:00", hostname="vm", jobs=8))
    old.begin_stretch(Stretch(started="2026-12-05T16:55:49+00:00", hostname="vm", jobs=4))
    text = render_markdown(load_run(old.root))
    assert ("where it ran: not recorded (the run predates the suite recording it); it was resumed (2 stretches, the "
            "last 4.4 h after the first): its stretches may have run on different machines") in text


def test_a_resume_on_another_machine_is_refused_unless_allowed(tmp_path):
    store = RunStore.open(make_run(tmp_path, lambda arm, c, r: (100.0, 1.0)))
    store.update_manifest(stretches=[])
    store.begin_stretch(Stretch.begin(8, where=A))
    matrix = parse_matrix(MATRIX % {"repeats": 1, "order": "abba"})
    console = Console(record=True, width=300)
    with pytest.raises(SuiteError) as err:
        check_resume_host(store, matrix, allow=False, console=console)
    here = identity.host_identity()
    assert f"began on another machine (host name 'gpu-a' there, {here.hostname!r} here; machine id 'aaaa' there" in str(err.value)
    assert "pass --allow-other-host" in str(err.value)
    check_resume_host(store, matrix, allow=True, console=console)
    assert "--allow-other-host: rounds whose arms ran on different machines will not be paired" in console.export_text()
    store.update_manifest(stretches=[])
    store.begin_stretch(Stretch.begin(8, where=here))
    check_resume_host(store, matrix, allow=False, console=console)  # the same machine: nothing to say
